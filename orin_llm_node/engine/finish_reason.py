# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Why a turn ended: the values of ``ChatResult.finish_reason``."""


class FinishReason:
    """Plain string constants (they go into logs and diagnostics as they are)."""

    STOP = 'stop'                  # a stop token was sampled
    TOOL_CALLS = 'tool_calls'      # a stop token was sampled right after the answer's last
                                   # tool call (ChatResult.tool_calls)
    LENGTH = 'length'              # SamplingParams.max_tokens reached
    KV_EXHAUSTED = 'kv_exhausted'  # the KV pool ran dry (answer truncated or prompt rejected)
    CONTEXT_FULL = 'context_full'  # max_model_len reached, or the prompt alone exceeds it
    CANCELLED = 'cancelled'        # LLMEngine.cancel(), or the stream was closed early
    TIMEOUT = 'timeout'            # SamplingParams.timeout_s passed
    ERROR = 'error'                # the turn failed (ChatResult.error says why): a grammar
                                   # dead end, or a step with no token to pick (non-finite
                                   # logits); the turn leaves no trace in the history

    # The answer was cut short by a limit rather than finished or stopped on request.
    LIMITS = (KV_EXHAUSTED, CONTEXT_FULL, TIMEOUT)
