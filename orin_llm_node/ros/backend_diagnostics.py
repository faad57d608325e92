# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ``<node>: backend`` status of a node on an OpenAI-compatible server.

What the node has seen of its server (``BackendStats``): reachability at the last contact
(configure's check or an answer), the latency of the last answer as the node saw it (TTFT,
tokens per second) and the error counts. WARN while the server is unreachable and for a
period after an answer failed. Pure (no rclpy at call time beyond the message types), so it
is unit-tested like ``diagnostics.py``.
"""

BACKEND_KEYS = ('backend', 'base_url', 'model', 'server_model', 'reachable', 'requests',
                'errors', 'consecutive_errors', 'retries', 'last_ttft_ms', 'last_decode_tok_s',
                'last_error')


def backend_values(stats):
    """``(key, value)`` pairs of a ``BackendStats`` (TTFT in milliseconds, as elsewhere)."""
    ttft = None if stats.last_ttft_s is None else 1000.0 * stats.last_ttft_s
    values = dict(vars(stats), last_ttft_ms=ttft)
    return [(key, values[key]) for key in BACKEND_KEYS]


def backend_level(stats, recent_errors):
    """``(level, message)``: WARN while down or just after a failed answer, else OK."""
    from orin_llm_node.ros.diagnostics import OK, WARN
    if stats.reachable is False:
        return WARN, f'server {stats.base_url} unreachable: {stats.last_error or "no answer"}'
    if recent_errors:
        return WARN, f'{recent_errors} answer(s) failed: {stats.last_error}'
    if stats.last_ttft_s is not None:
        return OK, (f'{stats.server_model or stats.model} at {stats.base_url}, last TTFT '
                    f'{1000.0 * stats.last_ttft_s:.0f} ms')
    return OK, f'{stats.server_model or stats.model} at {stats.base_url}'
