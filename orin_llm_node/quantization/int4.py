# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""INT4 weights in groups along the input dimension, symmetric or asymmetric.

Codes are unsigned nibbles ``u`` in [0, 15] packed eight to an int32, element ``i`` of a word
in bits ``4i..4i+3`` -- the layout compressed-tensors' "pack-quantized" format writes (it stores
``q + 8`` for a signed code ``q``), so its tensors load without repacking. Dequantised:
``w = (u - z) * s`` with ``z = 8`` (symmetric) or the group's zero point ``z`` in [0, 15].
"""

import torch

from .base import QuantLinear
from .groups import abs_max, divided_by_groups, grouped, per_group_

__all__ = ['Int4Linear', 'pack_int4', 'unpack_int4']

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
#: The fp16 scale 1 and offset -8 ending each CPU-layout row: fbgemm's 4-bit rows hold the
#: nibbles ``u`` and give ``1 * u - 8`` (the zero point of symmetric codes).
_ROW_TAIL = torch.tensor([1.0, -8.0], dtype=torch.float16).view(torch.uint8)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Nibbles ``[rows, cols]`` (0..15, any int or float dtype) -> int32 ``[rows, words]``."""
    rows, cols = codes.shape
    words = -(-cols // 8)
    # Through int8: torch's float -> uint8 cast is not vectorised (40x slower here).
    u = codes.to(torch.int8).view(torch.uint8) & 0xF
    if words * 8 != cols:
        u = torch.nn.functional.pad(u, (0, words * 8 - cols))
    # Elements 2j, 2j+1 are the low and high byte of a little-endian int16: v | v >> 4 has
    # them as the low and high nibble of its low byte, which the uint8 cast keeps. Four such
    # bytes are the int32 word of elements 8w..8w+7, element i in bits 4i..4i+3.
    pairs = u.view(torch.int16)
    return (pairs >> 4).bitwise_or_(pairs).to(torch.uint8).view(torch.int32)


def unpack_int4(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """int32 ``[rows, words]`` -> unsigned nibbles uint8 ``[rows, cols]``."""
    u = (packed[..., None] >> _SHIFTS.to(packed.device)) & 0xF
    return u.flatten(-2)[..., :cols].to(torch.uint8)


def _nibbles(packed: torch.Tensor, work) -> torch.Tensor:
    """Bytes ``[rows, b]`` of two nibbles each (low first) -> uint8 nibbles ``[rows, 2b]``.

    Each byte's nibbles are spread into the two bytes of an int16 (little-endian: the low
    nibble in the low byte) -- four passes over int16 in place of eight shifts over int32 and
    a gather. The result is a view of ``work``'s buffers.
    """
    pairs = work('codes', packed.numel(), torch.int16).view(packed.shape).copy_(packed)
    shifted = work('codes_shifted', packed.numel(), torch.int16).view(packed.shape)
    torch.bitwise_left_shift(pairs, 4, out=shifted)
    pairs.bitwise_or_(shifted).bitwise_and_(0x0F0F)
    return pairs.view(torch.uint8)


class Int4Linear(QuantLinear):
    """``qweight`` int32 ``[out, ceil(in / 8)]``; ``scale [out, G]``; ``zero`` uint8 if asym."""

    format = 'int4'
    chunk = 32
    bits = 4
    at_load_group = 128

    def __init__(self, in_features: int, out_features: int, group_size: int = 128,
                 bias: bool = False, asymmetric: bool = False, device=None):
        super().__init__(in_features, out_features, group_size, bias, asymmetric, device)

    def _empty_codes(self, device) -> torch.Tensor:
        return torch.empty(self.out_features, -(-self.in_features // 8), dtype=torch.int32,
                           device=device)

    #: The CPU layout's values are ``u - 8``; zero points are applied as ``z - 8``.
    cpu_zero_base = 8.0

    def _codes_into(self, out, row0, work):
        rows, cols = out.shape
        packed = self.qweight[row0:row0 + rows].view(torch.uint8)  # byte j: nibbles 2j, 2j+1
        out.copy_(_nibbles(packed, work)[:, :cols])
        if not self.asymmetric:
            out.sub_(8.0)

    def _cpu_codes(self):
        # Asymmetric layers append one row per group holding its zero points: summed into
        # the group's first bag with weight -sum(x over the group), they subtract z - 8 in
        # the kernel itself (cpu_layout._bags).
        def work(role, numel, dtype):
            return torch.empty(numel, dtype=dtype)

        nibbles = _nibbles(self.qweight.view(torch.uint8), work)[:, :self.in_features]
        u = nibbles.t().contiguous()  # [in, out]: torch's blocked transpose, then dense ops
        if self.zero is not None:
            u = torch.cat([u, self.zero.t()])
        if self.out_features % 2:  # fbgemm's 4-bit rows hold an even number of codes
            u = torch.nn.functional.pad(u, (0, 1))
        half = u.shape[1] // 2
        rows = torch.empty(u.shape[0], half + _ROW_TAIL.numel(), dtype=torch.uint8)
        torch.bitwise_or(u[:, 0::2], u[:, 1::2] << 4, out=rows[:, :half])  # low nibble first
        rows[:, half:] = _ROW_TAIL
        return rows

    def _cpu_values_into(self, out, col0, row0, work):
        cols, rows = out.shape
        packed = self.cpu_codes[col0:col0 + cols, row0 // 2:(row0 + rows + 1) // 2]
        out.copy_(_nibbles(packed, work)[:, :rows]).sub_(8.0)

    def _bag_sums(self, weights, indices, offsets):
        return torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
            self.cpu_codes, indices, offsets, per_sample_weights=weights)

    @classmethod
    def quantize_rows(cls, weight, group_size, asymmetric):
        """Round-to-nearest codes and scales of ``weight [rows, in]``."""
        g = grouped(weight, group_size)
        if asymmetric:
            lo = g.amin(-1).clamp(max=0.0)
            hi = g.amax(-1).clamp(min=0.0)
            scale = (hi - lo) / 15.0
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            zero = torch.round(-lo / scale).clamp_(0, 15)
            u = divided_by_groups(weight, scale, group_size).round_()
            per_group_(torch.Tensor.add_, u, zero, group_size)
            return {'qweight': pack_int4(u.clamp_(0, 15)), 'scale': scale,
                    'zero': zero.to(torch.uint8)}
        amax = abs_max(g)
        scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
        q = divided_by_groups(weight, scale, group_size).round_().clamp_(-8, 7)
        return {'qweight': pack_int4(q.add_(8)), 'scale': scale}
