# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What answers the node's prompts: the local engine, or an OpenAI-compatible server.

Both have ``LLMEngine``'s conversation interface (``new_conversation``, ``chat_stream``,
``reset``, ``cancel``, ``stats``, ``close``), so the session drives either without asking
which. What differs is said here, once: how one is made ready (loaded and warmed up, or
reached and asked whether it serves the model), what the node reports about it, and which
run-time checks only a local engine can make. Session thread only; no rclpy.
"""

from orin_llm_node import parameters
from orin_llm_node.ros import model_loading


def is_local(values):
    """Whether the parameter ``values`` ask for the local engine."""
    return values['backend'] == 'local'


def load(values, log, should_stop=None):
    """The engine or backend the parameters ask for, ready to answer.

    Local: loaded, warmed up and checked against the run-time parameters only a loaded
    engine can judge. Openai: the server reached and serving ``model`` (``check()``), else
    ``BackendUnavailable`` (a ``ValueError``) with the one-line reason.
    """
    if is_local(values):
        engine = model_loading.load_engine(values, log, should_stop=should_stop)
        try:
            parameters.check_loaded(engine, values)
        except ValueError:
            engine.close()
            raise
        return engine
    from orin_llm_node.backends import OpenAIBackend
    config = parameters.openai_config(values)
    log.info(f'backend openai: asking {config.base_url} for model {config.model!r}...')
    backend = OpenAIBackend(config)
    try:
        backend.check()
    except Exception:
        backend.close()
        raise
    log.info(f'backend openai: {config.base_url} serves {config.model!r}')
    return backend
