# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Decoder building blocks (nano-vllm's ``layers/`` shape): norms, linears, activation, RoPE.

Each block has a plain torch body -- the CPU path and the parity oracle -- and, where a fused
CUDA kernel exists, hands the same computation to it through ``kernels.dispatch``, the one place
that decides which implementation runs.
"""

from orin_llm_node.layers.activation import SiluAndMul
from orin_llm_node.layers.layernorm import RMSNorm
from orin_llm_node.layers.linear import (
    LinearBase,
    LinearMethod,
    MergedLinear,
    QKVLinear,
    ReplicatedLinear,
    UnquantizedLinearMethod,
)
from orin_llm_node.layers.rotary_embedding import MRotaryEmbedding, apply_rope, mrope_axis_map

__all__ = [
    'LinearBase',
    'LinearMethod',
    'MRotaryEmbedding',
    'MergedLinear',
    'QKVLinear',
    'RMSNorm',
    'ReplicatedLinear',
    'SiluAndMul',
    'UnquantizedLinearMethod',
    'apply_rope',
    'mrope_axis_map',
]
