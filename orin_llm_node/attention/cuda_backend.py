# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Paged attention on CUDA with the kernels of ``cuda_kernels/`` (loaded through CuPy).

* KV write: ``kv_write.cu`` scatters the new tokens' K/V by slot mapping (slot -1 skipped).
* Decode (one query token per row): ``paged_decode.cu``, split-K over partitions of
  ``kernel_sources.PARTITION_SIZE`` tokens with a grid fixed by ``max_model_len`` (empty splits
  exit at once) plus a reduce kernel. Context lengths and block tables are read from device
  memory, so a decode step can be captured in a CUDA graph and replayed.
* Prefill (many query tokens): the sequence's K/V are gathered through the block table and
  attended with ``attention.base.causal_attention`` (torch SDPA, bottom-right causal mask), the
  same math as the torch backend. Why not a paged prefill kernel: prefill is compute-bound
  (tensor-core flash/efficient SDPA kernels beat a CUDA-core kernel by an order of magnitude on
  long prompts), while the gather costs one copy of the context's K/V per layer -- small next to
  the prefill's matmuls. ``bench/gpu_decode.py`` measures time to first token with this path.

Kernels are compiled once per (file, dtype, head_dim) and process (CuPy also caches them on
disk), fetched in :meth:`CudaPagedAttention.warmup` -- never during graph capture -- and
launched on ``torch.cuda.current_stream()``, resolved at every call, so a launch inside
``torch.cuda.graph`` lands in the capture stream. All buffers are torch tensors passed by
``data_ptr()``; scalars are typed to the C signatures. This is the only module that imports
CuPy, and only when a CUDA backend is built; :func:`quant_launcher` serves the weight-only
quantized linear kernels (``quantization/kernels.py``) the same way.
"""

from functools import cache
import math

import numpy as np
import torch

from orin_llm_node import kernel_sources as ks

from .base import AttentionBackend, causal_attention

__all__ = ["CudaPagedAttention", "cupy_available", "load_kernels", "quant_launcher"]

_LOG2E = 1.4426950408889634
_TORCH_DTYPES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
}


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError(
            "the CUDA attention backend needs CuPy: pip install cupy-cuda12x (CUDA 12, "
            "JetPack 6) or cupy-cuda13x (CUDA 13)"
        ) from exc
    return cupy


def cupy_available() -> bool:
    """True when CUDA is usable by torch and CuPy imports (the CUDA backend can be built)."""
    if not torch.cuda.is_available():
        return False
    try:
        _import_cupy()
    except RuntimeError:
        return False
    return True


def _compile(var: ks.KernelVariant, device_index: int) -> dict:
    cupy = _import_cupy()
    functions = {}
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=var.source, options=var.options)
        for name in var.functions:
            try:
                # .kernel compiles, loads the module on the current device -> Function.
                functions[name] = module.get_function(name).kernel
            except Exception as exc:
                raise RuntimeError(
                    f"CuPy could not build {var.file} ({var.dtype}) for CUDA device "
                    f"{device_index}: {exc} (CuPy needs the CUDA toolkit's NVRTC matching its "
                    "cupy-cudaXXx wheel)"
                ) from exc
    return functions


@cache
def load_kernels(dtype: str, head_dim: int, device_index: int) -> dict:
    """Compile (once per process) and load every kernel for ``dtype``/``head_dim``.

    Returns ``{function name: cupy Function}`` bound to the CUDA context of ``device_index``.
    Call it outside graph capture: compiling and module loading are not capturable.
    """
    functions = {}
    for file in ks.KERNEL_FILES:
        functions.update(_compile(ks.variant(file, dtype, head_dim), device_index))
    return functions


@cache
def quant_launcher(dtype: torch.dtype, device: torch.device):
    """``launch(name, grid, block, args)`` for the quantized-linear kernels of ``dtype``.

    Compiles on the first call (make it outside graph capture: an eager step first); every
    launch goes to ``torch.cuda.current_stream()`` of that moment.
    """
    cupy = _import_cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    fns = _compile(ks.quant_variant(_TORCH_DTYPES[dtype]), index)
    streams = {}

    def launch(name, grid, block, args):
        ptr = torch.cuda.current_stream(index).cuda_stream
        stream = streams.get(ptr)
        if stream is None:
            stream = streams[ptr] = cupy.cuda.ExternalStream(ptr, index)
        fns[name](grid, block, args, stream=stream)

    return launch


class CudaPagedAttention(AttentionBackend):
    """Attention backend over the runner's KV tensor ``[layers, 2, blocks, block_size, Hkv, D]``.

    Same protocol as :class:`~orin_llm_node.attention.torch_backend.TorchPagedAttention`: the
    runner calls :meth:`prepare` before each model call, then every decoder layer calls
    :meth:`attend`. A one-token :meth:`prepare` is graph-safe: the kernels read the slot
    mapping and the block table from the tensors passed in (used by reference, so pass the
    same static buffers every step) and the context length from a buffer of this object that
    ``prepare`` refills -- a captured decode step replays correctly after ``prepare``.
    :meth:`prepare_decode` is the general form (several rows, caller-owned device buffers).

    Args:
        kv_cache: contiguous tensor, float16 / bfloat16 / float32, head_dim 32, 64 or 128.
        num_q_heads: query heads (a multiple of the KV heads).
        max_model_len: longest context attended; fixes the split-K grid (the same in eager and
            graph decode, so both give bit-identical results).
        max_rows: most query rows of one decode call (1: batch-1 decode).
        launch: ``launch(name, grid, block, args)`` running one kernel; ``None`` (the
            product) launches the CuPy-compiled kernels on ``torch.cuda.current_stream()``.
            Tests pass a CPU emulator here to check this class without a GPU.
    """

    def __init__(
        self,
        kv_cache: torch.Tensor,
        num_q_heads: int,
        max_model_len: int,
        max_rows: int = 1,
        launch=None,
    ):
        if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
            raise ValueError(
                f"kv_cache must be [layers, 2, blocks, block_size, Hkv, D], got {kv_cache.shape}"
            )
        if launch is None and kv_cache.device.type != "cuda":
            raise ValueError(f"kv_cache must be on a CUDA device, got {kv_cache.device}")
        if not kv_cache.is_contiguous():
            raise ValueError("kv_cache must be contiguous")
        if kv_cache.dtype not in _TORCH_DTYPES:
            raise ValueError(f"CUDA kernels support {list(_TORCH_DTYPES)}, got {kv_cache.dtype}")
        num_layers, _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
        if head_dim not in ks.HEAD_DIMS:
            raise ValueError(f"CUDA kernels support head_dim in {ks.HEAD_DIMS}, got {head_dim}")
        if num_q_heads <= 0 or num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads {num_q_heads} must be a multiple of Hkv {num_kv_heads}")
        if num_blocks * block_size >= 2**31:
            raise ValueError("the kernels index KV slots with int32: too many blocks")
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.dtype = kv_cache.dtype
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.group_size = num_q_heads // num_kv_heads
        self.max_model_len = max_model_len
        self.max_rows = max_rows
        self.num_splits = max(1, math.ceil(max_model_len / ks.PARTITION_SIZE))
        self._chunks = math.ceil(self.group_size / ks.MAX_GROUP)
        self._vec = 16 // kv_cache.element_size()
        plane = kv_cache[0, 0].numel() * kv_cache.element_size()
        base = kv_cache.data_ptr()
        self._kv_ptrs = [(base + 2 * i * plane, base + (2 * i + 1) * plane)
                         for i in range(num_layers)]
        # Split-K workspace, reused by every layer (they run in order on one stream), and the
        # context length of a prepare()d decode step. Allocated here, outside any capture, so
        # graph replays and eager steps use the same memory.
        self._part_acc = torch.empty(
            max_rows, num_q_heads, self.num_splits, head_dim, dtype=torch.float32,
            device=self.device,
        )
        self._part_ml = torch.empty(
            max_rows, num_q_heads, self.num_splits, 2, dtype=torch.float32, device=self.device
        )
        self._context_buf = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._scale_log2 = np.float32(head_dim ** -0.5 * _LOG2E)
        self._custom_launch = launch
        self._launch = None
        self._streams = {}
        self._reset_metadata()

    def _reset_metadata(self) -> None:
        self._slots = None
        self._decode = False
        self._block_tables = None
        self._context_lens = None
        self._blocks = None
        self._num_prefix = 0
        self._context = 0

    # ----------------------------------------------------------------------------- set-up

    def warmup(self) -> None:
        """Compile/load the kernels and launch each once on this thread (before any capture).

        The launches are no-ops (slot -1, empty context) that also initialise CuPy's
        per-thread CUDA state, so that later only kernel launches happen inside a capture:
        call it on the thread that will capture (the engine's worker thread).
        """
        if self._custom_launch is not None:
            self._launch = self._custom_launch
        else:
            fns = load_kernels(_TORCH_DTYPES[self.dtype], self.head_dim, self.device_index)

            def launch(name, grid, block, args):
                fns[name](grid, block, args, stream=self._stream())

            self._launch = launch
        i64 = {"dtype": torch.long, "device": self.device}
        dummy = torch.zeros(1, self.num_q_heads, self.head_dim, dtype=self.dtype,
                            device=self.device)
        self.prepare_decode(
            torch.full((1,), -1, **i64), torch.zeros(1, 1, **i64),
            torch.zeros(1, dtype=torch.int32, device=self.device),
        )
        kv = dummy[:, : self.num_kv_heads]
        self.attend(0, dummy, kv, kv)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._reset_metadata()

    def graph_key(self) -> tuple:
        """Everything a captured decode step bakes in: buffer pointers and launch scalars.

        A graph stays valid while this tuple is unchanged; the runner re-captures otherwise.
        """
        tensors = (self.kv_cache, self._part_acc, self._part_ml, self._slots,
                   self._block_tables, self._context_lens)
        if any(t is None for t in tensors):
            raise RuntimeError("graph_key() needs decode metadata: call prepare() first")
        return (*(t.data_ptr() for t in tensors), self._block_tables.stride(0),
                self._context_lens.shape[0], self._decode)

    @property
    def device_index(self) -> int:
        """CUDA device ordinal of the KV tensor."""
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    # -------------------------------------------------------------------------- metadata

    def prepare(
        self,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        num_prefix: int,
        num_new: int,
    ) -> None:
        """Set the metadata of the next model call (same meaning as the torch backend).

        ``slot_mapping [>= num_new]``: flat KV slot of each new token (-1: skip);
        ``block_table [>= ceil(context / block_size)]``: the sequence's block ids;
        ``num_prefix``: tokens already cached. One new token runs the decode kernels, reading
        ``slot_mapping``/``block_table`` in place when they are int64 tensors on the KV device
        (graph-safe); more run the gather + SDPA prefill.
        """
        context = num_prefix + num_new
        num_blocks = -(-context // self.block_size)
        if block_table.numel() < num_blocks:
            raise ValueError(f"block_table has {block_table.numel()} ids, need {num_blocks}")
        slot_mapping = slot_mapping.to(device=self.device, dtype=torch.long)
        block_table = block_table.to(device=self.device, dtype=torch.long)
        self._slots = slot_mapping[:num_new]
        if num_new == 1:
            self._decode = True
            self._block_tables = block_table.reshape(1, -1)
            self._context_buf.fill_(context)
            self._context_lens = self._context_buf
        else:
            self._decode = False
            self._blocks = block_table[:num_blocks]
            self._num_prefix = num_prefix
            self._context = context

    def prepare_decode(
        self,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> None:
        """Point the next decode call at device buffers (read when the kernels run).

        ``slot_mapping [rows]`` int64, ``block_tables [rows, W]`` int64 (contiguous),
        ``context_lens [rows]`` int32 (tokens attended, the new one included), all on the KV
        device. Used by reference: write new values into them before each graph replay.
        """
        rows = context_lens.shape[0]
        for name, t, dtype in (("slot_mapping", slot_mapping, torch.long),
                               ("block_tables", block_tables, torch.long),
                               ("context_lens", context_lens, torch.int32)):
            if t.dtype != dtype or t.device != self.device:
                raise ValueError(f"{name}: {dtype} on {self.device} needed, got {t.dtype}")
        if (slot_mapping.shape != (rows,) or block_tables.dim() != 2
                or block_tables.shape[0] != rows or not block_tables.is_contiguous()):
            raise ValueError("need slot_mapping [rows], contiguous block_tables [rows, W], "
                             "context_lens [rows]")
        if rows > self.max_rows:
            raise ValueError(f"{rows} decode rows > max_rows={self.max_rows}")
        self._decode = True
        self._slots = slot_mapping
        self._block_tables = block_tables
        self._context_lens = context_lens

    # ------------------------------------------------------------------------- attention

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Write ``k``/``v`` by slot mapping, then attend (decode kernels or gather + SDPA)."""
        if self._launch is None:
            raise RuntimeError("call CudaPagedAttention.warmup() first (outside graph capture)")
        k_ptr, v_ptr = self._kv_ptrs[layer_idx]
        self._write(k, v, k_ptr, v_ptr)
        if self._decode:
            return self._paged_decode(q, k_ptr, v_ptr)
        layer = self.kv_cache[layer_idx]
        hkv, d = self.num_kv_heads, self.head_dim
        # index_select: mixed basic/advanced indexing (layer[0, blocks]) is far slower.
        keys = layer[0].index_select(0, self._blocks).view(-1, hkv, d)[: self._context]
        values = layer[1].index_select(0, self._blocks).view(-1, hkv, d)[: self._context]
        return causal_attention(q, keys, values, self._num_prefix)

    def _stream(self):
        ptr = torch.cuda.current_stream(self.device).cuda_stream
        stream = self._streams.get(ptr)
        if stream is None:
            cupy = _import_cupy()
            stream = self._streams[ptr] = cupy.cuda.ExternalStream(ptr, self.device_index)
        return stream

    def _rows(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``x`` as [N, heads, D] in the cache dtype with 16-byte aligned, dense head vectors."""
        if x.dim() != 3 or x.shape[1] != heads or x.shape[2] != self.head_dim:
            raise ValueError(f"expected [N, {heads}, {self.head_dim}], got {tuple(x.shape)}")
        if x.device != self.device:
            raise ValueError(f"tensor on {x.device}, KV cache on {self.device}")
        x = x.to(self.dtype)
        if (
            x.stride(2) != 1
            or x.stride(1) != self.head_dim
            or x.stride(0) % self._vec
            or x.data_ptr() % 16
        ):
            x = x.contiguous()
        return x

    def _write(self, k: torch.Tensor, v: torch.Tensor, k_ptr: int, v_ptr: int) -> None:
        k = self._rows(k, self.num_kv_heads)
        v = self._rows(v, self.num_kv_heads)
        n = k.shape[0]
        if v.shape[0] != n or self._slots.shape[0] != n:
            raise ValueError(f"{n} keys, {v.shape[0]} values, {self._slots.shape[0]} slots")
        if n == 0:
            return
        self._launch(
            "kv_write", (n,), (ks.NUM_THREADS,),
            (k_ptr, v_ptr, k.data_ptr(), v.data_ptr(), self._slots.data_ptr(),
             np.int32(self.num_kv_heads), np.int64(k.stride(0)), np.int64(v.stride(0))),
        )

    def _paged_decode(self, q: torch.Tensor, k_ptr: int, v_ptr: int) -> torch.Tensor:
        q_dtype = q.dtype
        q = self._rows(q, self.num_q_heads)
        rows = q.shape[0]
        if rows != self._context_lens.shape[0]:
            raise ValueError(f"{rows} query rows, {self._context_lens.shape[0]} context lengths")
        out = torch.empty(rows, self.num_q_heads, self.head_dim, dtype=self.dtype,
                          device=self.device)
        self._launch(
            "paged_decode_split",
            (self.num_kv_heads * self._chunks, rows, self.num_splits), (ks.NUM_THREADS,),
            (self._part_acc.data_ptr(), self._part_ml.data_ptr(), q.data_ptr(), k_ptr, v_ptr,
             self._block_tables.data_ptr(), self._context_lens.data_ptr(),
             np.int32(self.num_kv_heads), np.int32(self.group_size), np.int32(self.block_size),
             np.int32(self._block_tables.stride(0)), np.int64(q.stride(0)), self._scale_log2),
        )
        self._launch(
            "paged_decode_reduce", (self.num_q_heads, rows), (self.head_dim,),
            (out.data_ptr(), self._part_acc.data_ptr(), self._part_ml.data_ptr(),
             self._context_lens.data_ptr(), np.int32(self.num_q_heads),
             np.int32(self.num_splits), np.int64(out.stride(0))),
        )
        return out if q_dtype == self.dtype else out.to(q_dtype)
