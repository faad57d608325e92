# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""FP8 e4m3 weights with 128x128 block scales (the fine-grained FP8 of Qwen's ``-FP8`` models).

Codes are the raw e4m3 bytes (uint8: the kernels decode them by bit manipulation, since Orin's
sm_87 has no fp8 hardware). ``w = e4m3(code) * s`` where ``s`` is the checkpoint's
``weight_scale_inv`` of the code's 128x128 block; it is stored per row (``scale [out, G]``,
G = ceil(in / 128), each block's value repeated over its 128 rows) so that parts of merged
projections whose sizes are not multiples of 128 still concatenate.
"""

import torch

from .base import QuantLinear
from .groups import abs_max, divided_by_groups, grouped

__all__ = ['BLOCK', 'E4M3_MAX', 'Fp8Linear', 'block_scales_to_rows']

BLOCK = 128
E4M3_MAX = 448.0


def block_scales_to_rows(block_scales: torch.Tensor, rows: int) -> torch.Tensor:
    """``[ceil(rows / 128), G]`` block scales -> ``[rows, G]`` fp32 (one row per weight row)."""
    return block_scales.float().repeat_interleave(BLOCK, dim=0)[:rows]


def _decode_into(out: torch.Tensor, codes: torch.Tensor, work) -> None:
    """e4m3 bits ``codes`` (uint8) -> their values / 2^8 in fp32 ``out``, exactly.

    torch's e4m3 -> fp32 cast runs one element at a time on the CPU (~5 ns each, 20x a float
    copy). Moving the bits instead: s.eeee.mmm -> fp16 s.0eeee.mmm0000000 is the code's value
    / 2^8 for every finite code, subnormals included (they become fp16 subnormals, which the
    fp16 -> fp32 conversion keeps under flush-to-zero too). NaN codes (0x7f, 0xff) are not
    produced by quantizers and are not special-cased, as in cuda_kernels/quant_linear.cu.
    """
    signed = codes.view(torch.int8)
    half = work('codes', signed.numel(), torch.int16).view(signed.shape).copy_(signed)
    # The sign-extended int8 times 2^7 (a shift, faster as a multiply here) has the sign in
    # bits 15 and 14: clear bit 14.
    half.mul_(128).bitwise_and_(~0x4000)
    out.copy_(half.view(torch.float16))


class Fp8Linear(QuantLinear):
    """``qweight`` uint8 (e4m3 bits) ``[out, in]``; ``scale [out, ceil(in / 128)]``."""

    format = 'fp8'
    chunk = 16
    bits = 8
    at_load_group = BLOCK  # the 128x128 blocks of Qwen's FP8 checkpoints

    def __init__(self, in_features: int, out_features: int, group_size: int = BLOCK,
                 bias: bool = False, asymmetric: bool = False, device=None):
        if asymmetric or group_size not in (BLOCK, min(BLOCK, in_features)):
            raise ValueError(f'fp8 weights are symmetric with {BLOCK}x{BLOCK} blocks')
        super().__init__(in_features, out_features, BLOCK, bias, False, device)

    def _empty_codes(self, device) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, dtype=torch.uint8, device=device)

    #: The codes are decoded as fp16 of 1/256 their value (the exponent biases differ by 8).
    code_unit = 256.0

    def _codes_into(self, out, row0, work):
        _decode_into(out, self.qweight[row0:row0 + out.shape[0]], work)

    def _cpu_codes(self):
        return self.qweight.t().contiguous()

    def _cpu_values_into(self, out, col0, row0, work):
        cols, rows = out.shape
        _decode_into(out, self.cpu_codes[col0:col0 + cols, row0:row0 + rows], work)

    @classmethod
    def quantize_rows(cls, weight, group_size, asymmetric):
        """Round-to-nearest codes and scales of ``weight [rows, in]``."""
        rows = weight.shape[0]
        per_row = abs_max(grouped(weight, BLOCK))  # [rows, ceil(in / 128)]
        amax = grouped(per_row.t(), BLOCK).amax(-1).t()  # [ceil(rows / 128), ceil(in / 128)]
        block_scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        scale = block_scales_to_rows(block_scale, rows)
        codes = divided_by_groups(weight, scale, BLOCK).clamp_(-E4M3_MAX, E4M3_MAX)
        codes = codes.to(torch.float8_e4m3fn)
        return {'qweight': codes.view(torch.uint8), 'scale': scale}
