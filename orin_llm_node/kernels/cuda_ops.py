# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one module that owns CuPy: builds ``cuda_kernels/`` and launches them; the fused ops.

* :func:`load_kernels` compiles every kernel file of a (dtype, head_dim) variant once per
  process (``cupy.RawModule``) and fetches the functions -- call it during warm-up, never
  inside a graph capture. CuPy keeps each compiled module on disk (:func:`kernel_cache`:
  ``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``), so a later process loads it without
  running NVRTC.
* :func:`kernel_launcher` returns ``launch(name, grid, block, args)``, which runs a kernel on
  ``torch.cuda.current_stream()`` resolved at every call, so a launch inside
  ``torch.cuda.graph`` lands in the capture stream, with the kernels' device made current
  (``device: cuda:1`` launches in device 1's context whatever the thread's current device).
  All buffers are torch tensors passed by ``data_ptr()``; scalars are numpy scalars typed to
  the C signature. Tests pass the CPU emulator's launcher (same convention) instead;
  :class:`LaunchCounter` wraps either and counts what really launched.
* :class:`FusedOps` wraps the non-attention fused kernels (RMSNorm, add + RMSNorm, SiLU x up,
  the weight-only quantized linear layers) that ``kernels.dispatch`` routes the layers to; the
  attention kernels (q/k-norm + RoPE + KV write, paged decode) are wrapped by
  ``attention/cuda_backend.py`` through the same launcher.

Nothing else imports CuPy, and this module imports it only when a kernel is built.
"""

from functools import cache
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from orin_llm_node.layers.activation import silu_and_mul
from orin_llm_node.layers.layernorm import add_rms_norm, rms_norm

from . import kernel_sources as ks
from .dispatch import tensor_device

__all__ = ['DEFAULT_KERNEL_CACHE', 'GEMV_MAX_ROWS', 'TORCH_DTYPES', 'FusedOps', 'LaunchCounter',
           'cupy_available', 'external_stream', 'kernel_cache', 'kernel_launcher',
           'load_kernels']

#: Most activation rows the quantized GEMV serves; beyond (prefill), dequantise + matmul (the
#: GEMV re-reads the weight once per row).
GEMV_MAX_ROWS = 4
#: torch dtype -> kernel_sources dtype name, for every dtype the kernels are built for.
TORCH_DTYPES = {
    torch.float16: 'float16',
    torch.bfloat16: 'bfloat16',
    torch.float32: 'float32',
}
#: Where CuPy keeps compiled modules when ``CUPY_CACHE_DIR`` is unset (CuPy's documented
#: default, CuPy 13 and 14 alike).
DEFAULT_KERNEL_CACHE = '~/.cupy/kernel_cache'


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError(
            'the CUDA kernels need CuPy: pip install cupy-cuda12x (CUDA 12, JetPack 6) or '
            'cupy-cuda13x (CUDA 13)'
        ) from exc
    return cupy


def cupy_available() -> bool:
    """True when CUDA is usable by torch and CuPy imports (the kernels can be built)."""
    if not torch.cuda.is_available():
        return False
    try:
        _import_cupy()
    except RuntimeError:
        return False
    return True


def _compile(var: ks.KernelVariant, device_index: int, cupy) -> dict:
    module = cupy.RawModule(code=var.source, options=var.options)
    functions = {}
    for name in var.functions:
        try:
            # .kernel compiles, loads the module on the current device -> Function.
            functions[name] = module.get_function(name).kernel
        except Exception as exc:
            raise RuntimeError(
                f"CuPy could not build {var.file} ({var.dtype}"
                f"{f', head_dim {var.head_dim}' if var.head_dim else ''}) for CUDA device "
                f"{device_index}: {exc} (CuPy needs the CUDA toolkit's NVRTC matching its "
                "cupy-cudaXXx wheel)"
            ) from exc
    return functions


@cache
def load_kernels(dtype: str, head_dim: int, device_index: int) -> dict:
    """Compile (once per process) and load every kernel for ``dtype``/``head_dim``.

    That is every file of ``kernel_sources.KERNEL_FILES`` for the variant plus the quantized
    linear kernels of ``dtype`` (``quant_variant``). Returns ``{function name: cupy Function}``
    bound to the CUDA context of ``device_index``. Call it outside graph capture: compiling
    and module loading are not capturable.
    """
    cupy = _import_cupy()
    variants = [ks.variant(file, dtype, head_dim) for file in ks.KERNEL_FILES]
    variants.append(ks.quant_variant(dtype))
    functions = {}
    with cupy.cuda.Device(device_index):
        for var in variants:
            functions.update(_compile(var, device_index, cupy))
    return functions


class _StreamHandle:
    """A raw ``cudaStream_t`` through the CUDA stream protocol (``__cuda_stream__``, v0)."""

    __slots__ = ('ptr',)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.ptr


def external_stream(cupy, ptr: int, device_index: int):
    """A CuPy stream object for the CUDA stream ``ptr`` that CuPy does not own (torch's).

    CuPy 14 deprecates ``cupy.cuda.ExternalStream`` (a DeprecationWarning, raised inside the
    first graph capture) for ``Stream.from_external`` and the CUDA stream protocol; CuPy 13
    (cupy-cuda12x with NumPy 1.x on JetPack 6) has only ``ExternalStream``, not deprecated
    there.
    """
    from_external = getattr(cupy.cuda.Stream, 'from_external', None)
    if from_external is None:
        return cupy.cuda.ExternalStream(ptr, device_index)
    return from_external(_StreamHandle(ptr))


def kernel_launcher(dtype: torch.dtype, head_dim: int, device: torch.device):
    """``launch(name, grid, block, args)`` for the CuPy-built kernels of this variant."""
    cupy = _import_cupy()
    device = tensor_device(device)
    index = device.index
    fns = load_kernels(TORCH_DTYPES[dtype], head_dim, index)
    # The functions belong to device ``index``'s context: launch them there, whichever device
    # the calling thread has current (torch's ops on cuda:N tensors do not change it).
    gpu = cupy.cuda.Device(index)
    streams = {}

    def launch(name, grid, block, args):
        ptr = torch.cuda.current_stream(device).cuda_stream
        stream = streams.get(ptr)
        if stream is None:
            stream = streams[ptr] = external_stream(cupy, ptr, index)
        if cupy.cuda.runtime.getDevice() == index:  # the usual case: no device switch
            fns[name](grid, block, args, stream=stream)
            return
        with gpu:
            fns[name](grid, block, args, stream=stream)

    return launch


class LaunchCounter:
    """Wraps a ``launch(name, grid, block, args)`` and counts the launches that went through.

    A fused op whose inputs the kernels cannot take runs its torch body and launches nothing;
    ``orin_llm_check`` and the GPU tests compare through a counter, so that comparing the
    torch body with itself is a failure and not a pass.
    """

    def __init__(self, launch) -> None:
        self.launch = launch
        self.counts: dict[str, int] = {}

    @property
    def total(self) -> int:
        """Launches so far, every kernel together."""
        return sum(self.counts.values())

    def __call__(self, name, grid, block, args) -> None:
        """Launch through the wrapped launcher; counted once it returned."""
        self.launch(name, grid, block, args)
        self.counts[name] = self.counts.get(name, 0) + 1


def _rows_ok(x: torch.Tensor, vec: int) -> bool:
    """2-D, dense rows of whole 16-byte vectors at 16-byte aligned addresses."""
    return (x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % vec == 0
            and x.stride(0) % vec == 0 and x.data_ptr() % 16 == 0)


class FusedOps:
    """The layers' fused kernels for one device and dtype (see ``kernels.dispatch``).

    Each op returns what its torch body in ``layers/`` returns; inputs the kernels cannot take
    (not 2-D, misaligned rows, another dtype) run that torch body instead.

    Args:
        dtype: activation dtype (float16, bfloat16 or float32).
        head_dim: which compiled variant to use (the kernels here do not depend on it).
        device: the CUDA device (or the CPU, with an emulated ``launch``); ``cuda`` means the
            current device, taken as ``cuda:<index>`` as its tensors report it.
        launch: ``launch(name, grid, block, args)``; None builds the CuPy kernels now.
    """

    def __init__(self, dtype: torch.dtype, head_dim: int, device: torch.device,
                 launch=None) -> None:
        if dtype not in TORCH_DTYPES:
            raise ValueError(f'fused kernels support {list(TORCH_DTYPES)}, got {dtype}')
        # The ops compare each input's device with this one: ``cuda`` would match no tensor
        # (they report ``cuda:0``) and every op would quietly run its torch body.
        self.dtype, self.device = dtype, tensor_device(device)
        self._vec = 16 // torch.empty((), dtype=dtype).element_size()
        self._launch = launch if launch is not None else kernel_launcher(dtype, head_dim,
                                                                         self.device)

    def _fits(self, *tensors: torch.Tensor) -> bool:
        return all(t.dtype == self.dtype and t.device == self.device and _rows_ok(t, self._vec)
                   for t in tensors)

    def _norm_threads(self, n_cols: int) -> int:
        vectors = -(-n_cols // self._vec)
        return min(1024, max(32, -(-vectors // 32) * 32))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``layers.layernorm.rms_norm`` in one kernel (x ``[N, H]``)."""
        if not self._fits(x, weight[None]) or x.shape[1] != weight.shape[0]:
            return rms_norm(x, weight, eps)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.shape[0]:
            self._launch('rms_norm', (x.shape[0],), (self._norm_threads(x.shape[1]),),
                         (out.data_ptr(), x.data_ptr(), weight.data_ptr(),
                          np.int32(x.shape[1]), np.int64(x.stride(0)), np.int64(out.stride(0)),
                          np.float32(eps)))
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``layers.layernorm.add_rms_norm`` in one kernel; ``residual`` is updated in place."""
        if (not self._fits(x, residual, weight[None]) or x.shape != residual.shape
                or x.shape[1] != weight.shape[0]):
            return add_rms_norm(x, residual, weight, eps)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.shape[0]:
            self._launch('add_rms_norm', (x.shape[0],), (self._norm_threads(x.shape[1]),),
                         (out.data_ptr(), residual.data_ptr(), x.data_ptr(), weight.data_ptr(),
                          np.int32(x.shape[1]), np.int64(x.stride(0)),
                          np.int64(residual.stride(0)), np.int64(out.stride(0)),
                          np.float32(eps)))
        return out, residual

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``layers.activation.silu_and_mul`` in one kernel (x ``[N, 2I]``)."""
        if not self._fits(x) or x.shape[1] % (2 * self._vec):
            return silu_and_mul(x)
        n, cols = x.shape[0], x.shape[1] // 2
        out = torch.empty(n, cols, dtype=x.dtype, device=x.device)
        if n:
            per_cta = ks.NUM_THREADS * self._vec
            self._launch('silu_and_mul', (n, -(-cols // per_cta)), (ks.NUM_THREADS,),
                         (out.data_ptr(), x.data_ptr(), np.int32(cols), np.int64(x.stride(0)),
                          np.int64(out.stride(0))))
        return out

    def quant_linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)`` for a ``quantization.QuantLinear`` through ``quant_linear.cu``.

        Up to :data:`GEMV_MAX_ROWS` rows (decode) run the dequantising GEMV, which reads each
        weight code once; more rows (prefill) dequantise the weight into a dense scratch tensor
        in the activation dtype and multiply with cuBLAS (``F.linear``) -- tensor cores for the
        compute-bound case at the price of one dense write + read of the layer's weight
        (prefill speed of this path has not been measured). Both allocate from torch's caching
        allocator: graph-safe. Shapes the kernels cannot take run the layer's torch path.
        """
        if (x.dtype != self.dtype or x.device != self.device
                or not layer.kernel_supported()):
            return layer.torch_forward(x)
        n, k = layer.out_features, layer.in_features
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous() or x2.data_ptr() % 16:
            x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
        rows = x2.shape[0]
        zeros = layer.zero.data_ptr() if layer.zero is not None else 0
        shape = (np.int32(n), np.int32(k), np.int32(layer.num_groups),
                 np.int32(layer.group_size))
        bias = None if layer.bias is None else layer.bias.to(x.dtype)
        threads = ks.GEMV_WARPS * 32
        if 0 < rows <= GEMV_MAX_ROWS:
            out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
            self._launch(f'quant_gemv_{layer.format}', (math.ceil(n / ks.GEMV_WARPS), rows),
                         (threads,),
                         (out.data_ptr(), x2.data_ptr(), layer.qweight.data_ptr(),
                          layer.scale.data_ptr(), zeros, 0 if bias is None else bias.data_ptr(),
                          *shape, np.int64(k), np.int64(n)))
            return out.view(*lead, n)
        weight = torch.empty(n, k, dtype=x.dtype, device=x.device)
        self._launch(f'quant_dequant_{layer.format}',
                     (max(1, math.ceil(n * k // layer.chunk / threads)),), (threads,),
                     (weight.data_ptr(), layer.qweight.data_ptr(), layer.scale.data_ptr(), zeros,
                      *shape))
        return F.linear(x2, weight, bias).view(*lead, n)


def kernel_cache() -> dict:
    """Where CuPy keeps compiled kernels across runs (``orin_llm_check`` shows it).

    ``dir``: ``CUPY_CACHE_DIR`` or CuPy's default (read by CuPy 14 when CuPy is imported, by
    CuPy 13 at each compile: set it before the process starts); ``in_memory``:
    ``CUPY_CACHE_IN_MEMORY`` turns the disk cache off; ``writable``: whether this process can
    add to it (missing directories are created by CuPy); ``modules``: compiled modules there.
    """
    path = Path(os.environ.get('CUPY_CACHE_DIR') or DEFAULT_KERNEL_CACHE).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:  # as CuPy reads its flags: an integer equal to 1
        in_memory = int(os.environ.get('CUPY_CACHE_IN_MEMORY') or 0) == 1
    except ValueError:
        in_memory = False
    modules = len(list(path.glob('*.cubin'))) if path.is_dir() else 0
    return {'dir': str(path), 'in_memory': in_memory,
            'writable': existing.is_dir() and os.access(existing, os.W_OK | os.X_OK),
            'modules': modules}


def versions() -> dict:
    """CuPy, CUDA driver / runtime and NVRTC versions, CuPy's CUDA root; {} without CuPy.

    ``cuda_root`` is the CUDA toolkit CuPy found (``CUDA_PATH``, ``nvcc`` on ``PATH`` or
    ``/usr/local/cuda``), None when it found none.
    """
    try:
        cupy = _import_cupy()
    except RuntimeError:
        return {}

    def dotted(v):
        return f'{v // 1000}.{v % 1000 // 10}'

    out = {'cupy': cupy.__version__, 'cuda_root': cupy.cuda.get_cuda_path()}
    for key, read in (('cuda_driver', lambda: dotted(cupy.cuda.runtime.driverGetVersion())),
                      ('cuda_runtime', lambda: dotted(cupy.cuda.runtime.runtimeGetVersion())),
                      ('nvrtc', lambda: '.'.join(map(str, cupy.cuda.nvrtc.getVersion())))):
        try:
            out[key] = read()
        except Exception as exc:  # noqa: BLE001 - a broken CUDA install is what we report
            out[key] = f'unavailable ({exc})'
    return out
