# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The interface every weight-only quantized linear layer implements.

A :class:`QuantLinear` replaces an ``nn.Linear`` (same ``in_features`` / ``out_features`` /
optional bias, same call) and stores its weight as integer or fp8 *codes* plus fp32 scales in
one layout shared by all formats: ``scale [out, G]`` (and, for asymmetric formats,
``zero [out, G]``), where group ``g`` covers input columns ``[g*group_size, (g+1)*group_size)``
and the last group may be shorter (``G = ceil(in / group_size)``). Per-channel INT8 is
``G = 1``; INT4 groups of 128; FP8's 128x128 block scales are stored per row (each 128-row
block's scale repeated over its rows), which lets merged projections (q/k/v, gate/up) of any
size concatenate their parts along the output dimension.

``forward`` asks ``kernels.dispatch`` (the one dispatch point) for the fused kernels of the
input's device and dtype: with them, ``cuda_ops.FusedOps.quant_linear`` runs the dequantising
GEMV / dequantise + matmul kernels of ``cuda_kernels/quant_linear.cu`` when the shape suits
them; otherwise :meth:`QuantLinear.torch_forward` runs -- the CPU path and the kernels' oracle:
``F.linear(x, self.dequantize(x.dtype), bias)``, computed on the CPU a tile of rows at a time
in reused buffers (``scratch.py``) with the same numbers.
"""

from abc import ABC, abstractmethod
import math
from typing import ClassVar

import torch
from torch import nn
import torch.nn.functional as F

from orin_llm_node.kernels.dispatch import kernels_for

from . import scratch

__all__ = ["QuantLinear", "abs_max", "divided_by_groups", "grouped", "per_group_"]


def grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[rows, in]`` -> ``[rows, G, group_size]``, the last group zero-padded.

    A view of ``weight`` when ``group_size`` divides ``in`` (the usual case: no copy).
    """
    rows, cols = weight.shape
    groups = -(-cols // group_size)
    if groups * group_size != cols:
        weight = F.pad(weight, (0, groups * group_size - cols))
    return weight.unflatten(1, (groups, group_size))


def abs_max(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``t.abs().amax(dim)`` from two reductions, without a full-size ``abs`` copy."""
    return torch.maximum(t.amax(dim), t.amin(dim).neg())


def per_group_(op, weight: torch.Tensor, per_group: torch.Tensor, group_size: int) -> None:
    """``op(weight, per_group repeated over each group's columns)`` in place, without a copy.

    ``op`` is an in-place binary tensor method (``torch.Tensor.mul_``, ``sub_``); ``weight
    [rows, cols]``, ``per_group [rows, G]`` (the last group may be shorter).
    """
    rows, cols = weight.shape
    full = cols // group_size
    if full:
        op(weight[:, :full * group_size].unflatten(1, (full, group_size)),
           per_group[:, :full, None])
    if full * group_size < cols:
        op(weight[:, full * group_size:], per_group[:, full:full + 1])


def divided_by_groups(weight: torch.Tensor, per_group: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """A new ``weight / expand(per_group)``: each column divided by its group's value."""
    out = weight.clone(memory_format=torch.contiguous_format)
    per_group_(torch.Tensor.div_, out, per_group, group_size)
    return out


class QuantLinear(nn.Module, ABC):
    """Weight-only quantized ``nn.Linear``: codes + per-row group scales, activations float.

    Subclasses define the code buffer (``qweight``), :meth:`_codes_into` and
    :meth:`quantize_rows` (round-to-nearest from a float weight, used by quantize-at-load).
    """

    #: What :meth:`_codes_into` writes is the code's value divided by this (a power of two,
    #: folded into the scale, so the dequantised weight is rounded exactly once either way).
    code_unit: ClassVar[float] = 1.0

    #: Format name ("int8", "int4", "fp8"): diagnostics and the kernel names.
    format: ClassVar[str]
    #: Input columns one kernel thread reads as one 16-byte load of codes.
    chunk: ClassVar[int]
    #: Bits per weight code.
    bits: ClassVar[int]
    #: Group size of quantize-at-load into this format (None: one group per output row).
    at_load_group: ClassVar[int | None]

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool,
                 asymmetric: bool = False, device=None):
        super().__init__()
        if group_size <= 0:
            raise ValueError(f"group_size must be positive, got {group_size}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size = min(group_size, in_features)
        self.num_groups = math.ceil(in_features / self.group_size)
        self.asymmetric = asymmetric
        self.register_buffer("qweight", self._empty_codes(device))
        self.register_buffer(
            "scale", torch.empty(out_features, self.num_groups, dtype=torch.float32,
                                 device=device))
        self.register_buffer(
            "zero", torch.empty(out_features, self.num_groups, dtype=torch.uint8,
                                device=device) if asymmetric else None)
        self.bias = (nn.Parameter(torch.empty(out_features, device=device), requires_grad=False)
                     if bias else None)

    # ------------------------------------------------------------------ format specifics

    @abstractmethod
    def _empty_codes(self, device) -> torch.Tensor:
        """The uninitialised code buffer for this shape."""

    @abstractmethod
    def _codes_into(self, out: torch.Tensor, row0: int, work) -> None:
        """Write rows ``row0...`` of the codes into fp32 ``out [rows, in]``, exactly.

        The values before zero point and scale, divided by :attr:`code_unit`. ``work(role,
        numel, dtype)`` gives a 1-D temporary tensor on the codes' device.
        """

    @classmethod
    @abstractmethod
    def quantize_rows(cls, weight: torch.Tensor, group_size: int,
                      asymmetric: bool) -> dict[str, torch.Tensor]:
        """Round-to-nearest codes / scale (/ zero) of a float ``weight [rows, in]``."""

    # ----------------------------------------------------------------------- public API

    def extra_repr(self) -> str:
        """Shape, format and grouping (printed by ``repr(model)``)."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}, group_size={self.group_size}, "
                f"asymmetric={self.asymmetric}, bias={self.bias is not None}")

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight ``[out, in]`` in ``dtype`` (computed in fp32, cast once)."""
        device = self.qweight.device
        w = torch.empty(self.out_features, self.in_features, device=device)
        self.dequantize_rows_(w, 0, lambda role, numel, dt: torch.empty(numel, dtype=dt,
                                                                       device=device))
        return w.to(dtype)

    def dequantize_rows_(self, out: torch.Tensor, row0: int, work) -> None:
        """Rows ``row0...`` of :meth:`dequantize` (fp32) into ``out [rows, in]``, in place.

        ``(code - zero) * scale``, rounded once; ``work`` as for :meth:`_codes_into`.
        """
        rows = slice(row0, row0 + out.shape[0])
        self._codes_into(out, row0, work)
        if self.zero is not None:
            per_group_(torch.Tensor.sub_, out, self.zero[rows].float(), self.group_size)
        scale = self.scale[rows]
        if self.code_unit != 1.0:
            scale = scale * self.code_unit
        per_group_(torch.Tensor.mul_, out, scale, self.group_size)

    def load_rows(self, tensors: dict[str, torch.Tensor], row0: int = 0) -> int:
        """Copy a part's ``qweight`` / ``scale`` (/ ``zero``) into rows ``row0...``.

        The tensors are in this layout already (``quantization/checkpoint_formats.py`` converts
        the on-disk layouts). Returns the number of rows written.
        """
        rows = tensors["scale"].shape[0]
        if row0 + rows > self.out_features:
            raise ValueError(f"rows {row0}..{row0 + rows} exceed out_features "
                             f"{self.out_features}")
        names = ["qweight", "scale"] + (["zero"] if self.asymmetric else [])
        if sorted(tensors) != sorted(names):
            raise ValueError(f"expected tensors {names}, got {sorted(tensors)}")
        for name in names:
            dst = getattr(self, name)[row0:row0 + rows]
            if tuple(tensors[name].shape) != tuple(dst.shape):
                raise ValueError(f"{name} has shape {list(tensors[name].shape)}, the layer "
                                 f"needs {list(dst.shape)}")
            dst.copy_(tensors[name])
        return rows

    def quantize_from(self, weight: torch.Tensor, row0: int = 0) -> int:
        """Quantize a float weight part ``[rows, in]`` into rows ``row0...`` (round-to-nearest)."""
        if weight.dim() != 2 or weight.shape[1] != self.in_features:
            raise ValueError(f"weight of shape {list(weight.shape)} for in_features "
                             f"{self.in_features}")
        return self.load_rows(self.quantize_rows(weight.float(), self.group_size,
                                                 self.asymmetric), row0)

    def kernel_supported(self) -> bool:
        """Whether the CUDA kernels take this shape (else the torch path runs, also on CUDA)."""
        return (self.in_features % self.chunk == 0 and self.group_size % self.chunk == 0)

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The torch path: dequantise to ``x``'s dtype, then ``F.linear``.

        On the CPU a tile of rows at a time (:meth:`_cpu_forward`); elsewhere (shapes the
        CUDA kernels do not take) the whole weight at once.
        """
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x.device.type == "cpu":
            return self._cpu_forward(x, bias)
        return F.linear(x, self.dequantize(x.dtype), bias)

    def _cpu_forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``F.linear(x, self.dequantize(x.dtype), bias)`` by tiles of output rows.

        Each tile of at most ``scratch.TILE_ELEMENTS`` weights is dequantised into this
        thread's reused buffers and multiplied while it is still in cache, so a call
        allocates only its output, reads each code once from memory and never holds a dense
        weight (the old path allocated and wrote three full-size fp32 weights per call: 4-9x
        slower than float at decode). Every output element is a dot product over the same
        dequantised values as ``F.linear``'s. Tiles start every 16 rows so that each weight
        row keeps its 64-byte alignment, on which the BLAS's summation order depends: one-row
        (decode) results are then bit-identical to ``F.linear``'s; several rows may differ
        in the last bit where the BLAS blocks a GEMM by the row count.
        """
        k, n = self.in_features, self.out_features
        x2 = x.reshape(-1, k)
        rows = min(n, max(16, scratch.TILE_ELEMENTS // k // 16 * 16))
        device = x.device

        def work(role, numel, dtype):
            return scratch.buffer(role, numel, dtype, device)

        w32 = work("weight", rows * k, torch.float32)
        cast = work("weight_cast", rows * k, x.dtype) if x.dtype != torch.float32 else None
        out = None if rows == n else torch.empty(x2.shape[0], n, dtype=x.dtype, device=device)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            w = w32[:(r1 - r0) * k].view(r1 - r0, k)
            self.dequantize_rows_(w, r0, work)
            if cast is not None:
                w = cast[:(r1 - r0) * k].view(r1 - r0, k).copy_(w)
            b = None if bias is None else bias[r0:r1]
            if out is None:  # one tile: exactly F.linear
                return F.linear(x2, w, b).view(*x.shape[:-1], n)
            # mm / addmm are what F.linear runs for a 2-D input (same kernel, same sums).
            if b is None:
                torch.mm(x2, w.t(), out=out[:, r0:r1])
            else:
                torch.addmm(b, x2, w.t(), out=out[:, r0:r1])
        return out.view(*x.shape[:-1], n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for ``x [..., in]`` in any float dtype."""
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.quant_linear(self, x)
        return self.torch_forward(x)
