# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Linear layers whose weights may be several checkpoint tensors stacked along the output dim.

``QKVLinear`` holds ``q_proj``/``k_proj``/``v_proj`` as one ``[Hq*D + 2*Hkv*D, H]`` weight and
``MergedLinear`` holds ``gate_proj``/``up_proj`` as one ``[2*I, H]`` weight: one GEMV reads
them where three (two) did, and the checkpoint format stays the Hugging Face one -- the loader
hands each checkpoint tensor to the layer's :meth:`LinearBase.weight_loader` with a shard id
(``"q"``/``"k"``/``"v"``, or the index into ``output_sizes``), as nano-vllm does.

How a layer stores its weight and multiplies by it is a :class:`LinearMethod` the layer
delegates to, so other weight formats (quantized GEMV kernels) plug in behind the same modules
without touching the model code.
"""

from collections.abc import Hashable, Sequence

import torch
from torch import nn
import torch.nn.functional as F

__all__ = [
    'LinearBase',
    'LinearMethod',
    'MergedLinear',
    'QKVLinear',
    'ReplicatedLinear',
    'UnquantizedLinearMethod',
]


class LinearMethod:
    """Weight storage and matmul of a linear layer (the seam for other weight formats)."""

    def create_weights(self, layer: 'LinearBase') -> None:
        """Register the layer's parameters (``weight``, ``bias``...) on ``layer``."""
        raise NotImplementedError

    def apply(self, layer: 'LinearBase', x: torch.Tensor) -> torch.Tensor:
        """``x [N, input_size] -> [N, output_size]``."""
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``[output_size, input_size]`` weight in the model dtype; ``F.linear``."""

    def create_weights(self, layer: 'LinearBase') -> None:
        """Register ``weight`` and the optional ``bias``."""
        layer.weight = nn.Parameter(torch.empty(layer.output_size, layer.input_size),
                                    requires_grad=False)
        if layer.has_bias:
            layer.bias = nn.Parameter(torch.empty(layer.output_size), requires_grad=False)
        else:
            layer.register_parameter('bias', None)

    def apply(self, layer: 'LinearBase', x: torch.Tensor) -> torch.Tensor:
        """Dense matmul (cuBLAS GEMV/GEMM on CUDA, MKL/oneDNN on the CPU)."""
        return F.linear(x, layer.weight, layer.bias)


class LinearBase(nn.Module):
    """``y = x W^T (+ b)`` with the output rows split into named shards.

    ``shards`` maps a shard id to its ``(offset, size)`` along the output dim; a plain layer
    has the single shard ``None`` covering every row.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 shards: dict[Hashable, tuple[int, int]] | None = None,
                 method: LinearMethod | None = None) -> None:
        super().__init__()
        self.input_size, self.output_size, self.has_bias = input_size, output_size, bias
        self.shards = shards if shards is not None else {None: (0, output_size)}
        self.method = method if method is not None else UnquantizedLinearMethod()
        self.method.create_weights(self)

    def shard(self, param: torch.Tensor, shard_id: Hashable = None) -> torch.Tensor:
        """The rows of ``param`` (weight or bias) that hold shard ``shard_id`` (a view)."""
        if shard_id not in self.shards:
            raise KeyError(f'{type(self).__name__} has no shard {shard_id!r}')
        offset, size = self.shards[shard_id]
        return param.narrow(0, offset, size)

    @torch.no_grad()
    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor,
                      shard_id: Hashable = None) -> None:
        """Copy one checkpoint tensor into its shard of ``param`` (cast to its dtype)."""
        dst = self.shard(param, shard_id)
        if tuple(loaded_weight.shape) != tuple(dst.shape):
            raise ValueError(f'has shape {list(loaded_weight.shape)}, the config implies '
                             f'{list(dst.shape)}')
        dst.copy_(loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, input_size] -> [N, output_size]`` through the layer's method."""
        return self.method.apply(self, x)


class ReplicatedLinear(LinearBase):
    """One checkpoint tensor, one weight (``o_proj``, ``down_proj``)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 method: LinearMethod | None = None) -> None:
        super().__init__(input_size, output_size, bias, method=method)


class MergedLinear(LinearBase):
    """Several same-input projections stacked (``gate_up_proj``: shard 0 gate, 1 up)."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
                 method: LinearMethod | None = None) -> None:
        offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        shards = {i: (off, size) for i, (off, size) in enumerate(zip(offsets, output_sizes,
                                                                     strict=True))}
        self.output_sizes = tuple(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, shards, method)


class QKVLinear(LinearBase):
    """q, k and v projections stacked as ``[q (Hq*D); k (Hkv*D); v (Hkv*D)]``."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, method: LinearMethod | None = None) -> None:
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        shards = {'q': (0, q), 'k': (q, kv), 'v': (q + kv, kv)}
        super().__init__(hidden_size, q + 2 * kv, bias, shards, method)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views ``q [N, Hq, D]``, ``k``/``v [N, Hkv, D]`` of an output ``[N, Hq*D + 2*Hkv*D]``."""
        n, d = qkv.shape[0], self.head_dim
        q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d,
                             self.num_kv_heads * d], dim=-1)
        return (q.view(n, self.num_heads, d), k.view(n, self.num_kv_heads, d),
                v.view(n, self.num_kv_heads, d))
