# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one factory of an engine's kernels: its paged attention backend and fused layer ops.

``attention_backend`` (``EngineConfig``): ``auto`` / ``cuda`` / ``torch``. With the CUDA kernels
the engine also gets the fused RMSNorm / SiLU / quantized-linear ops (``cuda_ops.FusedOps``);
they are returned, not installed: the model runner installs them around its own steps
(``dispatch.installed``), so they never outlive the engine that built them.
"""

import logging
from typing import NamedTuple

import torch

from orin_llm_node.attention.base import AttentionBackend
from orin_llm_node.attention.torch_backend import TorchPagedAttention

__all__ = ['ATTENTION_BACKENDS', 'BackendChoice', 'make_attention_backend']

log = logging.getLogger(__name__)

#: Values of ``EngineConfig.attention_backend``.
ATTENTION_BACKENDS = ('auto', 'cuda', 'torch')


class BackendChoice(NamedTuple):
    """What :func:`make_attention_backend` picked."""

    #: The paged attention backend (``CudaPagedAttention`` or ``TorchPagedAttention``).
    attention: AttentionBackend
    #: The layers' fused kernels (a ``cuda_ops.FusedOps``) with the CUDA kernels, else None.
    fused: object
    #: Why ``auto`` fell back to torch on a device that could run the kernels (None: it did
    #: not fall back).
    fallback_reason: str | None


def make_attention_backend(kv_cache: torch.Tensor, num_q_heads: int, max_model_len: int,
                           choice: str = 'auto', launcher=None) -> BackendChoice:
    """The paged attention backend over ``kv_cache`` and, with it, the fused layer ops.

    ``choice`` (:data:`ATTENTION_BACKENDS`):

    * ``torch``: the torch implementation; CuPy is never touched.
    * ``cuda``: the CUDA kernels (``CudaPagedAttention``, and ``FusedOps`` for the KV tensor's
      device and dtype). Anything that stops them -- no CUDA device, CuPy missing, a compile
      or module-load error, an unsupported head_dim or dtype -- raises.
    * ``auto``: ``cuda`` when the kernels can be built and run, else ``torch`` with one WARN
      line; the reason is returned (the ``generation`` diagnostics report it). Without CUDA
      (and no ``launcher``) it is ``torch`` with no reason to report.

    ``launcher(dtype, head_dim, device) -> launch`` builds the kernels (``launch(name, grid,
    block, args)``): ``cuda_ops.kernel_launcher`` (CuPy) on a CUDA device when None; tests pass
    the CPU kernel emulator's, or one that fails as CuPy does.
    """
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(f'attention_backend must be one of {ATTENTION_BACKENDS}, got {choice!r}')
    if choice == 'torch':
        return BackendChoice(TorchPagedAttention(kv_cache), None, None)
    if launcher is None:
        if kv_cache.device.type != 'cuda':
            if choice == 'cuda':
                raise ValueError("attention_backend 'cuda' needs a CUDA device, the KV cache is "
                                 f"on {kv_cache.device} (use 'auto' or 'torch')")
            return BackendChoice(TorchPagedAttention(kv_cache), None, None)
        from .cuda_ops import kernel_launcher as launcher
    try:
        return BackendChoice(*_cuda_kernels(kv_cache, num_q_heads, max_model_len, launcher),
                             None)
    except Exception as exc:  # CuPy raises many types: import, NVRTC, driver, load
        lines = str(exc).strip().splitlines()
        reason = f'{type(exc).__name__}: {lines[0]}' if lines else type(exc).__name__
        if choice == 'cuda':
            raise RuntimeError(f"attention_backend 'cuda': the CUDA kernels cannot run on "
                               f"{kv_cache.device}: {reason}") from exc
    log.warning("CUDA kernels unavailable on %s, attention runs on torch without CUDA graphs "
                "(attention_backend 'auto'): %s", kv_cache.device, reason)
    return BackendChoice(TorchPagedAttention(kv_cache), None, reason)


def _cuda_kernels(kv_cache: torch.Tensor, num_q_heads: int, max_model_len: int, launcher):
    """CudaPagedAttention over ``kv_cache``, warmed up, and the fused layer ops beside it.

    Returned only when every step (build, load, a first launch of each kernel) succeeded.
    """
    from orin_llm_node.attention.cuda_backend import CudaPagedAttention

    from .cuda_ops import FusedOps

    head_dim = kv_cache.shape[-1]
    launch = launcher(kv_cache.dtype, head_dim, kv_cache.device)
    backend = CudaPagedAttention(kv_cache, num_q_heads, max_model_len, launch=launch)
    backend.warmup()
    return backend, FusedOps(kv_cache.dtype, head_dim, kv_cache.device, launch=launch)
