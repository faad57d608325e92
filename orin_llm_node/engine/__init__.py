# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The paged-KV inference engine: ``LLMEngine`` with ``EngineConfig`` and ``SamplingParams``."""

from orin_llm_node.engine.block_pool import BlockPool
from orin_llm_node.engine.config import EngineConfig, SamplingParams
from orin_llm_node.engine.conversation import Conversation
from orin_llm_node.engine.finish_reason import FinishReason
from orin_llm_node.engine.kv_manager import PoolStats
from orin_llm_node.engine.llm_engine import EngineStats, LLMEngine
from orin_llm_node.engine.turn import ChatResult, Stage, StreamEvent

__all__ = [
    'BlockPool',
    'ChatResult',
    'Conversation',
    'EngineConfig',
    'EngineStats',
    'FinishReason',
    'LLMEngine',
    'PoolStats',
    'SamplingParams',
    'Stage',
    'StreamEvent',
]
