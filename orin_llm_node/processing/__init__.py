# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Prompt processing: pixel patches, chat rendering, tokens, prompt pieces, M-RoPE positions."""

from orin_llm_node.processing.chat import ChatTemplate, Tokenizer, expand_image_pads, user_message
from orin_llm_node.processing.image import ImageProcessor, ProcessedImage, smart_resize
from orin_llm_node.processing.prompt import ImageRef, PromptBuilder, PromptPiece, image_key
from orin_llm_node.processing.rope_index import rope_delta, rope_positions

__all__ = [
    "ChatTemplate",
    "ImageRef",
    "ImageProcessor",
    "ProcessedImage",
    "PromptBuilder",
    "PromptPiece",
    "Tokenizer",
    "expand_image_pads",
    "image_key",
    "rope_delta",
    "rope_positions",
    "smart_resize",
    "user_message",
]
