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
them; otherwise :meth:`QuantLinear.torch_forward` runs -- the kernels' oracle,
``F.linear(x, self.dequantize(x.dtype), bias)``. A CPU layer that has loaded moves its codes
to the CPU layout (:meth:`QuantLinear.use_cpu_layout`, ``cpu_layout.py``): one row per input
column, which fbgemm's embedding-bag kernels multiply without a dense weight.
"""

from abc import ABC, abstractmethod
import math
from typing import ClassVar

import torch
from torch import nn
import torch.nn.functional as F

from orin_llm_node.kernels.dispatch import kernels_for

from . import cpu_layout
from .groups import per_group_

__all__ = ['QuantLinear']


class QuantLinear(nn.Module, ABC):
    """Weight-only quantized ``nn.Linear``: codes + per-row group scales, activations float.

    Subclasses define the code buffer (``qweight``), :meth:`_codes_into`,
    :meth:`quantize_rows` (round-to-nearest from a float weight, used by quantize-at-load) and
    the CPU layout of their codes (:meth:`_cpu_codes`, :meth:`_cpu_values_into`, optionally
    :meth:`_bag_sums`).
    """

    #: What :meth:`_codes_into` writes is the code's value divided by this (a power of two,
    #: folded into the scale, so the dequantised weight is rounded exactly once either way).
    code_unit: ClassVar[float] = 1.0
    #: What :meth:`_cpu_values_into` has already subtracted from an asymmetric format's codes
    #: (its zero points are applied as ``zero - cpu_zero_base``).
    cpu_zero_base: ClassVar[float] = 0.0

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
            raise ValueError(f'group_size must be positive, got {group_size}')
        self.in_features, self.out_features = in_features, out_features
        self.group_size = min(group_size, in_features)
        self.num_groups = math.ceil(in_features / self.group_size)
        self.asymmetric = asymmetric
        self.register_buffer('qweight', self._empty_codes(device))
        self.register_buffer(
            'scale', torch.empty(out_features, self.num_groups, dtype=torch.float32,
                                 device=device))
        self.register_buffer(
            'zero', torch.empty(out_features, self.num_groups, dtype=torch.uint8,
                                device=device) if asymmetric else None)
        self.bias = (nn.Parameter(torch.empty(out_features, device=device), requires_grad=False)
                     if bias else None)
        #: The codes in the CPU layout once :meth:`use_cpu_layout` ran (``qweight`` is None then).
        self.register_buffer('cpu_codes', None)

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

    @abstractmethod
    def _cpu_codes(self) -> torch.Tensor:
        """``qweight`` in the CPU layout: one row per input column (``cpu_layout.py``)."""

    @abstractmethod
    def _cpu_values_into(self, out: torch.Tensor, col0: int, row0: int, work) -> None:
        """CPU-layout codes of input columns ``col0...`` into fp32 ``out [cols, rows]``.

        Output rows ``row0...`` (a multiple of 16). The values before zero point (less
        :attr:`cpu_zero_base`) and scale, divided by :attr:`code_unit`, exactly; ``work`` as
        for :meth:`_codes_into`.
        """

    #: ``_bag_sums(weights, indices, offsets) -> [bags, >= out]``: for each bag (a run of
    #: CPU-layout rows) the sum of ``weights[i] * value(indices[i], :)``, straight from the
    #: codes (fbgemm's embedding-bag kernels); None where no such kernel exists.
    _bag_sums = None

    # ----------------------------------------------------------------------- public API

    def extra_repr(self) -> str:
        """Shape, format and grouping (printed by ``repr(model)``)."""
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'format={self.format}, group_size={self.group_size}, '
                f'asymmetric={self.asymmetric}, bias={self.bias is not None}')

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight ``[out, in]`` in ``dtype`` (computed in fp32, cast once)."""
        if self.cpu_codes is not None:
            return cpu_layout.dequantize(self).to(dtype)
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
        rows = tensors['scale'].shape[0]
        if self.qweight is None:
            raise ValueError('the codes are in the CPU layout already: load before '
                             'use_cpu_layout()')
        if row0 + rows > self.out_features:
            raise ValueError(f'rows {row0}..{row0 + rows} exceed out_features '
                             f'{self.out_features}')
        names = ['qweight', 'scale'] + (['zero'] if self.asymmetric else [])
        if sorted(tensors) != sorted(names):
            raise ValueError(f'expected tensors {names}, got {sorted(tensors)}')
        for name in names:
            dst = getattr(self, name)[row0:row0 + rows]
            if tuple(tensors[name].shape) != tuple(dst.shape):
                raise ValueError(f'{name} has shape {list(tensors[name].shape)}, the layer '
                                 f'needs {list(dst.shape)}')
            dst.copy_(tensors[name])
        return rows

    def quantize_from(self, weight: torch.Tensor, row0: int = 0) -> int:
        """Quantize a float weight part ``[rows, in]`` into rows ``row0...`` (round-to-nearest)."""
        if weight.dim() != 2 or weight.shape[1] != self.in_features:
            raise ValueError(f'weight of shape {list(weight.shape)} for in_features '
                             f'{self.in_features}')
        return self.load_rows(self.quantize_rows(weight.float(), self.group_size,
                                                 self.asymmetric), row0)

    def use_cpu_layout(self) -> None:
        """Move the codes of this CPU layer to the CPU layout (``cpu_layout.py``), in place.

        The checkpoint loader calls it once all of a CPU layer's rows are in; afterwards
        ``qweight`` is None and ``cpu_codes`` holds the same codes (plus a few bytes per
        input column, and asymmetric INT4's zero points), so no extra memory is kept. Scales
        and zero points keep their shape ``[out, G]`` but are stored group-major, as the
        decode reads them. Only the CPU path reads that layout.
        """
        if self.qweight.device.type != 'cpu':
            raise ValueError(f'the CPU layout is for CPU layers, not {self.qweight.device}')
        codes = self._cpu_codes()
        self.qweight = None
        self.cpu_codes = codes
        self.scale = self.scale.t().contiguous().t()
        if self.zero is not None:
            self.zero = self.zero.t().contiguous().t()

    def kernel_supported(self) -> bool:
        """Whether the CUDA kernels take this layer: canonical codes of a shape they serve.

        Otherwise the torch path runs, also on CUDA.
        """
        return (self.qweight is not None and self.in_features % self.chunk == 0
                and self.group_size % self.chunk == 0)

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The torch path: ``F.linear`` over :meth:`dequantize`, or the CPU layout's path.

        The CPU layout (:meth:`use_cpu_layout`) never builds the dense weight
        (``cpu_layout.linear``); in the canonical layout this is the kernels' oracle.
        """
        if self.cpu_codes is not None:
            return cpu_layout.linear(self, x, self.bias)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for ``x [..., in]`` in any float dtype."""
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.quant_linear(self, x)
        return self.torch_forward(x)
