# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Answer backends beside the local engine: an OpenAI-compatible chat-completions server."""

from orin_llm_node.backends.backend_stats import BackendStats
from orin_llm_node.backends.openai_backend import OpenAIBackend, RemoteConversation, RemoteResult
from orin_llm_node.backends.openai_config import BackendUnavailable, OpenAIConfig

__all__ = ['BackendStats', 'BackendUnavailable', 'OpenAIBackend', 'OpenAIConfig',
           'RemoteConversation', 'RemoteResult']
