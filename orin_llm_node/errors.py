# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Exceptions shared across layers (models/, quantization/, engine/, ros/).

This module imports nothing else of the package, so any layer may raise or catch them.
"""

__all__ = ['LoadInterrupted', 'ModelLoadError']


class ModelLoadError(ValueError):
    """A checkpoint directory cannot be turned into a Qwen3-VL model (one-line reason)."""


class LoadInterrupted(Exception):
    """Loading or warm-up stopped early because the caller's ``should_stop()`` said so."""
