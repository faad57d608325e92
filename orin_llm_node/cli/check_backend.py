# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check``'s rows for ``backend: openai``: is the server there, and does it answer.

The node refuses to configure against a dead server or a wrong model; the integrator should
hear that from the check first, with the time one short answer takes over the network. The
local rows stay: they say whether this device could answer by itself.
"""

import time

from orin_llm_node.cli.check import FAIL, PASS, Check

#: What the check asks the server (a few tokens: the round trip, not the model, is measured).
QUESTION = 'Say OK.'
FIX = ('start the server (orin_llm_serve, vLLM) at base_url, or set base_url / model / '
       'api_key_env to the server the node should use')


def backend_rows(report, values) -> list[Check]:
    """The server rows for ``values`` (none for the local engine); fills ``report['backend']``."""
    if values['backend'] == 'local':
        return []
    from orin_llm_node.backends import BackendUnavailable, OpenAIBackend
    from orin_llm_node.engine import SamplingParams
    from orin_llm_node.parameters import openai_config

    config = openai_config(values)
    info = report['backend'] = {'backend': values['backend'], 'base_url': config.base_url,
                                'model': config.model}
    backend = OpenAIBackend(config)
    try:
        t0 = time.monotonic()
        try:
            served = backend.check()
        except BackendUnavailable as exc:  # one line, the key never in it
            return [Check('backend server', FAIL, str(exc), FIX)]
        info['served'] = served
        info['check_s'] = round(time.monotonic() - t0, 3)
        rows = [Check('backend server', PASS,
                      f'{config.base_url} serves {config.model!r} '
                      f'(GET /models in {1000 * info["check_s"]:.0f} ms)')]
        t0 = time.monotonic()
        result = backend.chat(backend.new_conversation(), QUESTION,
                              sampling=SamplingParams(max_tokens=4))
        info['answer_s'] = round(time.monotonic() - t0, 3)
        if result.error:
            rows.append(Check('backend answer', FAIL, f'{result.finish_reason}: {result.error}',
                              FIX))
            return rows
        info['ttft_s'] = result.ttft_s
        tokens = '?' if result.token_ids is None else len(result.token_ids)
        ttft = 'n/a' if result.ttft_s is None else f'{1000 * result.ttft_s:.0f} ms'
        rows.append(Check('backend answer', PASS,
                          f'{tokens} tokens in {info["answer_s"]:.2f} s (first token {ttft}, '
                          f'finish {result.finish_reason}), network included'))
        return rows
    finally:
        backend.close()
