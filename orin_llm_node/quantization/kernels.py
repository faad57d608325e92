# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Run a ``QuantLinear`` through the kernels of ``cuda_kernels/quant_linear.cu``.

Up to :data:`GEMV_MAX_ROWS` activation rows (decode) run the dequantising GEMV, which reads
each weight code once; more rows (prefill) dequantise the weight into a dense scratch tensor
in the activation dtype and multiply with cuBLAS (``F.linear``) -- tensor cores for the
compute-bound case at the price of one dense write + read of the layer's weight. (Prefill speed
of this path has not been measured.) Both are graph-safe: they allocate from torch's caching
allocator and launch on the current stream.
"""

from functools import cache
import math

import numpy as np
import torch
import torch.nn.functional as F

from orin_llm_node import kernel_sources as ks

from .base import QuantLinear

__all__ = ["GEMV_MAX_ROWS", "launcher_for", "quant_linear"]

#: Most activation rows the GEMV serves; beyond, dequantise + matmul (the GEMV re-reads the
#: weight once per row).
GEMV_MAX_ROWS = 4
_THREADS = ks.GEMV_WARPS * 32
_DTYPES = {torch.float16, torch.bfloat16, torch.float32}


@cache
def _cupy_available() -> bool:
    from orin_llm_node.attention.cuda_backend import cupy_available

    return cupy_available()


def launcher_for(x: torch.Tensor):
    """The CuPy kernels' ``launch`` for a CUDA tensor of a kernel dtype, else None (torch)."""
    if not x.is_cuda or x.dtype not in _DTYPES or not _cupy_available():
        return None
    from orin_llm_node.attention.cuda_backend import quant_launcher

    return quant_launcher(x.dtype, x.device)


def quant_linear(layer: QuantLinear, x: torch.Tensor, launch) -> torch.Tensor:
    """``layer(x)`` with the kernels run by ``launch(name, grid, block, args)``."""
    if x.dtype not in _DTYPES:
        raise TypeError(f"quantized linear layers take float16/bfloat16/float32, got {x.dtype}")
    n, k = layer.out_features, layer.in_features
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous() or x2.data_ptr() % 16:
        x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
    rows = x2.shape[0]
    zeros = layer.zero.data_ptr() if layer.zero is not None else 0
    shape = (np.int32(n), np.int32(k), np.int32(layer.num_groups), np.int32(layer.group_size))
    bias = None if layer.bias is None else layer.bias.to(x.dtype)
    if 0 < rows <= GEMV_MAX_ROWS:
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        launch(f"quant_gemv_{layer.format}", (math.ceil(n / ks.GEMV_WARPS), rows), (_THREADS,),
               (out.data_ptr(), x2.data_ptr(), layer.qweight.data_ptr(), layer.scale.data_ptr(),
                zeros, 0 if bias is None else bias.data_ptr(), *shape, np.int64(k),
                np.int64(n)))
        return out.view(*lead, n)
    weight = torch.empty(n, k, dtype=x.dtype, device=x.device)
    launch(f"quant_dequant_{layer.format}",
           (max(1, math.ceil(n * k // layer.chunk / _THREADS)),), (_THREADS,),
           (weight.data_ptr(), layer.qweight.data_ptr(), layer.scale.data_ptr(), zeros, *shape))
    return F.linear(x2, weight, bias).view(*lead, n)
