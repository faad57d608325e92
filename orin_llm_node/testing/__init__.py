# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Test and demo helpers: tiny random Qwen3-VL checkpoints generated locally."""

from orin_llm_node.testing.tiny_checkpoint import make_tiny_checkpoint

__all__ = ['make_tiny_checkpoint']
