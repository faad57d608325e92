# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL in plain torch modules: config, vision tower, decoder, checkpoint loader."""

from orin_llm_node.errors import LoadInterrupted, ModelLoadError
from orin_llm_node.models.config import (
    Qwen3VLConfig,
    TextConfig,
    VisionConfig,
    config_from_dict,
    load_config,
)
from orin_llm_node.models.loader import build_model, load_model
from orin_llm_node.models.qwen3_vl import Qwen3VLForCausalLM
from orin_llm_node.models.qwen3_vl_text import Qwen3VLTextModel
from orin_llm_node.models.qwen3_vl_vision import Qwen3VLVisionTower, VisionOutput

__all__ = [
    'LoadInterrupted',
    'ModelLoadError',
    'Qwen3VLConfig',
    'Qwen3VLForCausalLM',
    'Qwen3VLTextModel',
    'Qwen3VLVisionTower',
    'TextConfig',
    'VisionConfig',
    'VisionOutput',
    'build_model',
    'config_from_dict',
    'load_config',
    'load_model',
]
