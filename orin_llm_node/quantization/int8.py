# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""INT8 weights, symmetric, one fp32 scale per output channel (or per group): ``w = q * s``."""

import torch

from .base import QuantLinear
from .groups import abs_max, divided_by_groups, grouped

__all__ = ['Int8Linear']

#: The fp32 scale 1 and offset -128 ending each CPU-layout row: fbgemm's 8-bit rows hold
#: ``q + 128`` and give ``1 * (q + 128) - 128 = q``.
_ROW_TAIL = torch.tensor([1.0, -128.0]).view(torch.uint8)


class Int8Linear(QuantLinear):
    """``qweight`` int8 ``[out, in]``; ``scale [out, G]`` (G = 1: per output channel)."""

    format = 'int8'
    chunk = 16
    bits = 8
    at_load_group = None  # per output channel

    def __init__(self, in_features: int, out_features: int, group_size: int | None = None,
                 bias: bool = False, asymmetric: bool = False, device=None):
        if asymmetric:
            raise ValueError('int8 weights are symmetric only')
        super().__init__(in_features, out_features, group_size or in_features, bias,
                         asymmetric=False, device=device)

    def _empty_codes(self, device) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, dtype=torch.int8, device=device)

    def _codes_into(self, out, row0, work):
        out.copy_(self.qweight[row0:row0 + out.shape[0]])

    def _cpu_codes(self):
        n = self.out_features
        rows = torch.empty(self.in_features, n + _ROW_TAIL.numel(), dtype=torch.uint8)
        # Transposed whole first (torch's blocked copy), 3x faster than xor-ing a strided view.
        codes = self.qweight.t().contiguous().view(torch.uint8)
        torch.bitwise_xor(codes, 0x80, out=rows[:, :n])  # q + 128
        rows[:, n:] = _ROW_TAIL
        return rows

    def _cpu_values_into(self, out, col0, row0, work):
        cols, rows = out.shape
        out.copy_(self.cpu_codes[col0:col0 + cols, row0:row0 + rows]).sub_(128.0)

    def _bag_sums(self, weights, indices, offsets):
        return torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            self.cpu_codes, indices, offsets, per_sample_weights=weights)

    @classmethod
    def quantize_rows(cls, weight, group_size, asymmetric):
        """Round-to-nearest codes and scales of ``weight [rows, in]``."""
        amax = abs_max(grouped(weight, group_size))
        scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        q = divided_by_groups(weight, scale, group_size).round_().clamp_(-127, 127)
        q = q.to(torch.int8)
        return {'qweight': q, 'scale': scale}
