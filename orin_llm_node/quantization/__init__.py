# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Weight-only quantized linear layers (INT8, INT4, FP8) and how checkpoints select them."""

import torch

from .base import QuantLinear
from .fp8 import Fp8Linear
from .int4 import Int4Linear
from .int8 import Int8Linear

#: ``EngineConfig.quantization`` values that quantize a float checkpoint's decoder projections
#: as they load (round-to-nearest, no calibration) -> (layer class, asymmetric).
AT_LOAD_FORMATS: dict[str, tuple[type[QuantLinear], bool]] = {
    'int8': (Int8Linear, False),
    'int4': (Int4Linear, False),
    'int4_asym': (Int4Linear, True),
    'fp8': (Fp8Linear, False),
}


def model_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's weights: parameters (a tied one once) and quantized codes/scales."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, QuantLinear):
            total += sum(b.numel() * b.element_size() for b in m.buffers())
    return total


__all__ = ['AT_LOAD_FORMATS', 'Fp8Linear', 'Int4Linear', 'Int8Linear',
           'QuantLinear', 'model_weight_bytes']
