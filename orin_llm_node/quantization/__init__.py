# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Weight-only quantized linear layers (INT8, INT4, FP8) and how checkpoints select them."""

from .base import QuantLinear
from .fp8 import Fp8Linear
from .int4 import Int4Linear
from .int8 import Int8Linear

#: Format name -> layer class.
FORMATS: dict[str, type[QuantLinear]] = {
    "int8": Int8Linear,
    "int4": Int4Linear,
    "fp8": Fp8Linear,
}

__all__ = ["FORMATS", "Fp8Linear", "Int4Linear", "Int8Linear", "QuantLinear"]
