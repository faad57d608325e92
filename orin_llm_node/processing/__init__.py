# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Prompt processing: image and video patches, chat, tokens, prompt pieces, M-RoPE positions."""

from orin_llm_node.processing.chat import ChatTemplate, Tokenizer, expand_image_pads, user_message
from orin_llm_node.processing.image import ImageProcessor, ProcessedImage, smart_resize
from orin_llm_node.processing.prompt import (
    ImageRef,
    PromptBuilder,
    PromptPiece,
    VideoRef,
    image_key,
)
from orin_llm_node.processing.rope_index import rope_delta, rope_positions
from orin_llm_node.processing.video import (
    ProcessedVideo,
    VideoClip,
    VideoProcessor,
    video_smart_resize,
)

__all__ = [
    'ChatTemplate',
    'ImageRef',
    'ImageProcessor',
    'ProcessedImage',
    'ProcessedVideo',
    'PromptBuilder',
    'PromptPiece',
    'Tokenizer',
    'VideoClip',
    'VideoProcessor',
    'VideoRef',
    'expand_image_pads',
    'image_key',
    'rope_delta',
    'rope_positions',
    'smart_resize',
    'user_message',
    'video_smart_resize',
]
