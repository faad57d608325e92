# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What a remote backend has seen of its server, for ``/diagnostics``: thread-safe counters."""

from dataclasses import dataclass, replace
import threading

__all__ = ['BackendStats', 'StatsBook']


@dataclass(frozen=True)
class BackendStats:
    """A snapshot of a remote backend's view of its server.

    ``reachable``: whether the last contact (a ``check`` or an answer) reached the server
    (None before the first). ``requests``: answers asked for; ``errors``: those that ended in
    ``finish_reason="error"``; ``consecutive_errors``: errors since the last answer that
    arrived; ``retries``: requests sent again. ``last_ttft_s``: time to the first answer chunk
    as the client saw it; ``last_decode_tok_s``: tokens per second after the first, as the
    client saw them (None when the server gave no token count); ``last_error``: the last
    failure's one-line reason ('' when none yet).
    """

    backend: str
    base_url: str
    model: str
    server_model: str | None = None
    reachable: bool | None = None
    requests: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    retries: int = 0
    last_ttft_s: float | None = None
    last_decode_tok_s: float | None = None
    last_error: str = ''


class StatsBook:
    """The one writer of a backend's ``BackendStats`` (every update under one lock)."""

    def __init__(self, initial: BackendStats):
        self._lock = threading.Lock()
        self._stats = initial

    def snapshot(self) -> BackendStats:
        """The figures as they are now (any thread)."""
        with self._lock:
            return self._stats

    def contact(self, reachable: bool, server_model: str | None = None) -> None:
        """Record whether the server answered (``server_model``: the name it gave)."""
        with self._lock:
            model = server_model or self._stats.server_model
            self._stats = replace(self._stats, reachable=reachable, server_model=model)

    def answered(self, ttft_s: float | None, decode_tok_s: float | None, retries: int) -> None:
        """Record an answer that arrived (whole, cut short or cancelled)."""
        with self._lock:
            s = self._stats
            self._stats = replace(s, requests=s.requests + 1, consecutive_errors=0,
                                  retries=s.retries + retries, last_ttft_s=ttft_s,
                                  last_decode_tok_s=decode_tok_s)

    def failed(self, reason: str, retries: int) -> None:
        """Record an answer that ended in ``finish_reason="error"``."""
        with self._lock:
            s = self._stats
            self._stats = replace(s, requests=s.requests + 1, errors=s.errors + 1,
                                  consecutive_errors=s.consecutive_errors + 1,
                                  retries=s.retries + retries, last_error=reason)
