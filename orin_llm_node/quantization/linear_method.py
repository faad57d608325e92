# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Quantized weights behind the decoder's linear layers (``layers.linear.LinearMethod``).

A merged layer (``qkv_proj``, ``gate_up_proj``) keeps one :class:`QuantLinear` for all its
output rows: each checkpoint part (q, k, v; gate, up) is loaded -- or quantized at load --
into its rows at the shard's offset, since every format keeps its scales (and zero points)
per output row. FP8's 128-row blocks therefore stay aligned to each part, as in the part's
own checkpoint tensor, whatever the part sizes.
"""

import torch
from torch import nn

from orin_llm_node.layers.linear import LinearBase, LinearMethod

from .base import QuantLinear

__all__ = ['QuantLinearMethod', 'quant_part', 'quantize_module']


class QuantLinearMethod(LinearMethod):
    """Codes + scales in ``layer.quant`` (a :class:`QuantLinear`); the bias stays float."""

    def __init__(self, make_quant):
        #: ``make_quant(in_features, out_features) -> QuantLinear`` (bias-free).
        self.make_quant = make_quant

    def create_weights(self, layer: LinearBase) -> None:
        """Register ``layer.quant`` and the optional float ``bias``."""
        layer.quant = self.make_quant(layer.input_size, layer.output_size)
        if layer.has_bias:
            layer.bias = nn.Parameter(torch.empty(layer.output_size), requires_grad=False)
        else:
            layer.register_parameter('bias', None)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """The quantized matmul (kernels on CUDA, dequantise + ``F.linear`` on the CPU)."""
        y = layer.quant(x)
        return y if layer.bias is None else y + layer.bias.to(y.dtype)


def quantize_module(owner: nn.Module, attr: str, make_quant) -> None:
    """Give ``owner.<attr>`` (a ``LinearBase`` or ``nn.Linear``, on ``meta``) quantized weights.

    ``make_quant(in_features, out_features, bias=False) -> QuantLinear``.
    """
    module = getattr(owner, attr)
    with torch.device('meta'):
        if isinstance(module, LinearBase):
            del module.weight
            module.method = QuantLinearMethod(make_quant)
            module.method.create_weights(module)
        elif isinstance(module, nn.Linear):
            setattr(owner, attr, make_quant(module.in_features, module.out_features,
                                            bias=module.bias is not None))
        else:
            raise TypeError(f'{attr}: cannot quantize a {type(module).__name__}')


def quant_part(module: nn.Module, shard_id=None) -> tuple[QuantLinear, int]:
    """The :class:`QuantLinear` holding a layer's shard and the shard's first output row."""
    if isinstance(module, QuantLinear):
        return module, 0
    return module.quant, module.shards[shard_id][0]
