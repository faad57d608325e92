# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Prompt processing: images to pixel patches, chat rendering and tokens, M-RoPE positions."""

from orin_llm_node.processing.rope_index import rope_delta, rope_positions

__all__ = ["rope_delta", "rope_positions"]
