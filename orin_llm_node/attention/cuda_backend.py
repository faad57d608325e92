# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Paged attention on CUDA with the kernels of ``cuda_kernels/``.

The kernels are built and launched through ``orin_llm_node.kernels.cuda_ops``, the one module that
touches CuPy.

* q/k-norm + M-RoPE + KV write: ``qk_norm_rope_kv.cu``, one launch per layer from the merged
  qkv projection's output (``attend_qkv``); ``kv_write.cu`` serves ``attend`` when q/k/v come
  already normed and rotated.
* Decode (one query token): ``paged_decode.cu``, split-K with a grid fixed at construction
  (sized for ``max_model_len`` and the SM count) whose splits are spread over the context
  length read from device memory, plus a reduce kernel. Context length, slot and block table
  are read from device memory, so a decode step can be captured in a CUDA graph and replayed.
* Prefill (many query rows): ``paged_prefill.cu`` -- the new tokens' queries read K/V
  straight through the block table (no gather), bottom-right causal, GQA; on tensor cores
  (mma.sync) in fp16/bf16, on CUDA cores in fp32. Its grid follows the number of query rows
  only (row tiles on ``gridDim.x``, KV heads on ``gridDim.y``) and the lengths (cached prefix,
  real new tokens) come from a device buffer, so every prompt length runs the same code without
  per-shape planning, and a prefill padded to a bucket (padding rows: slot -1, no KV write,
  zeros out) can be captured in a CUDA graph. ``attention.base.causal_attention`` (torch SDPA,
  bottom-right mask) is its reference.

Launches go through ``launch(name, grid, block, args)`` (``cuda_ops.kernel_launcher`` on a
GPU; the CPU kernel emulator in tests), fetched in :meth:`CudaPagedAttention.warmup` -- never
during graph capture.
"""

import math

import numpy as np
import torch

from orin_llm_node.kernels import kernel_sources as ks
from orin_llm_node.kernels.cuda_ops import TORCH_DTYPES, kernel_launcher

from .base import AttentionBackend

__all__ = ['CudaPagedAttention']

_LOG2E = 1.4426950408889634
#: SM count assumed when the KV tensor is not on a GPU (emulated kernels in tests).
_EMULATED_SMS = 16


class CudaPagedAttention(AttentionBackend):
    """Attention backend over the runner's KV tensor ``[layers, 2, blocks, block_size, Hkv, D]``.

    The runner calls :meth:`prepare` before each model call, then every decoder layer calls
    :meth:`attend_qkv`. :meth:`prepare` is graph-safe: the kernels read the slot mapping and
    the block table from the tensors passed in (used by reference, so pass the same static
    buffers every step) and the lengths from buffers of this object that ``prepare`` refills
    -- a captured decode step or padded prefill replays correctly after ``prepare``.

    Args:
        kv_cache: contiguous tensor, float16 / bfloat16 / float32, head_dim 32, 64 or 128.
        num_q_heads: query heads (a multiple of the KV heads).
        max_model_len: longest context attended; with the SM count it fixes the split-K grid
            (the same in eager and graph decode, so both give bit-identical results).
        launch: ``launch(name, grid, block, args)`` running one kernel; ``None`` (the
            product) launches the CuPy-built kernels on ``torch.cuda.current_stream()``.
            Tests pass a CPU emulator here to check this class without a GPU.
        num_sms: streaming multiprocessors to keep busy (None: the device's).
    """

    graph_safe = True
    name = 'cuda'

    def __init__(self, kv_cache: torch.Tensor, num_q_heads: int, max_model_len: int,
                 launch=None, num_sms: int | None = None):
        if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
            raise ValueError(
                f'kv_cache must be [layers, 2, blocks, block_size, Hkv, D], got {kv_cache.shape}'
            )
        if launch is None and kv_cache.device.type != 'cuda':
            raise ValueError(f'kv_cache must be on a CUDA device, got {kv_cache.device}')
        if not kv_cache.is_contiguous():
            raise ValueError('kv_cache must be contiguous')
        if kv_cache.dtype not in TORCH_DTYPES:
            raise ValueError(f'CUDA kernels support {list(TORCH_DTYPES)}, got {kv_cache.dtype}')
        num_layers, _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
        if head_dim not in ks.HEAD_DIMS:
            raise ValueError(f'CUDA kernels support head_dim in {ks.HEAD_DIMS}, got {head_dim}')
        if num_q_heads <= 0 or num_q_heads % num_kv_heads:
            raise ValueError(f'num_q_heads {num_q_heads} must be a multiple of Hkv {num_kv_heads}')
        if num_blocks * block_size >= 2**31:
            raise ValueError('the kernels index KV slots with int32: too many blocks')
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.dtype = kv_cache.dtype
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.group_size = num_q_heads // num_kv_heads
        self.max_model_len = max_model_len
        self._chunks = math.ceil(self.group_size / ks.MAX_GROUP)
        if num_sms is None:
            num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                       if self.device.type == 'cuda' else _EMULATED_SMS)
        # About two CTAs per SM at long contexts; never more splits than SPLIT_MIN_TOKENS-token
        # ranges fit in max_model_len.
        ctas_per_split = num_kv_heads * self._chunks
        self.num_splits = max(1, min(math.ceil(max_model_len / ks.SPLIT_MIN_TOKENS),
                                     math.ceil(2 * num_sms / ctas_per_split)))
        self._vec = 16 // kv_cache.element_size()
        plane = kv_cache[0, 0].numel() * kv_cache.element_size()
        base = kv_cache.data_ptr()
        self._kv_ptrs = [(base + 2 * i * plane, base + (2 * i + 1) * plane)
                         for i in range(num_layers)]
        # Split-K workspace, reused by every layer (they run in order on one stream), the
        # context length of a prepare()d decode step and the (cached prefix, real new tokens)
        # of a prefill. Allocated here, outside any capture, so graph replays and eager steps
        # use the same memory.
        self._part_acc = torch.empty(num_q_heads, self.num_splits, head_dim,
                                     dtype=torch.float32, device=self.device)
        self._part_ml = torch.empty(num_q_heads, self.num_splits, 2, dtype=torch.float32,
                                    device=self.device)
        self._context_buf = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._seq_info = torch.zeros(2, dtype=torch.int32, device=self.device)
        self._scale_log2 = np.float32(head_dim ** -0.5 * _LOG2E)
        self._prefill_rows = ks.prefill_rows(TORCH_DTYPES[kv_cache.dtype])
        self._custom_launch = launch
        self._launch = None
        self._reset_metadata()

    def _reset_metadata(self) -> None:
        self._slots = None
        self._decode = False
        self._block_table = None

    # ----------------------------------------------------------------------------- set-up

    def warmup(self) -> None:
        """Build the kernels and launch each once on this thread (before any capture).

        The launches write nothing (slot -1; an empty decode context) and also initialise
        CuPy's per-thread CUDA state, so that later only kernel launches happen inside a capture:
        call it on the thread that will capture (the engine's worker thread).
        """
        self._launch = self._custom_launch or kernel_launcher(self.dtype, self.head_dim,
                                                               self.device)
        i64 = {'dtype': torch.long, 'device': self.device}
        self.prepare(torch.full((1,), -1, **i64), torch.zeros(1, **i64), 0, 1)
        self._context_buf.zero_()  # an empty context: the decode splits all exit at once
        d = self.head_dim
        q = torch.zeros(1, self.num_q_heads, d, dtype=self.dtype, device=self.device)
        kv = q[:, : self.num_kv_heads]
        ones = torch.ones(d, dtype=self.dtype, device=self.device)
        cos_sin = torch.zeros(1, d, dtype=self.dtype, device=self.device)
        self.attend(0, q, kv, kv)
        self._fused_qkv(0, q, kv, kv, ones, ones, 1e-6, cos_sin, cos_sin)
        # A two-row prefill: one real token and one padding row, both at slot -1.
        self.prepare(torch.full((2,), -1, **i64), torch.zeros(1, **i64), 0, 1)
        rows = torch.zeros(2, self.num_q_heads, d, dtype=self.dtype, device=self.device)
        self._paged_prefill(rows, *self._kv_ptrs[0])
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
        self._reset_metadata()

    def graph_key(self) -> tuple:
        """Everything a captured step bakes in: buffer pointers and launch scalars.

        A graph (decode step or padded prefill) stays valid while this tuple is unchanged; the
        runner re-captures otherwise. Before the first :meth:`prepare` the metadata pointers
        read as 0.
        """
        tensors = (self.kv_cache, self._part_acc, self._part_ml, self._context_buf,
                   self._seq_info, self._slots, self._block_table)
        rows = 0 if self._slots is None else self._slots.shape[0]
        return (*(0 if t is None else t.data_ptr() for t in tensors), rows, self._decode,
                self.num_splits)

    # -------------------------------------------------------------------------- metadata

    def prepare(
        self,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        num_prefix: int,
        num_new: int,
    ) -> None:
        """Set the metadata of the next model call (see ``AttentionBackend.prepare``).

        The model runs every row of ``slot_mapping``: ``num_new`` real tokens, then padding
        rows at slot -1 (a prefill padded to a bucket; no KV write, zeros out). One row runs
        the decode kernels, more the paged prefill kernel. ``slot_mapping``/``block_table``
        are read in place when they are int64 tensors on the KV device (pass the same static
        buffers to replay a graph); the lengths go to device buffers of this object.
        """
        context = num_prefix + num_new
        num_blocks = -(-context // self.block_size)
        if block_table.numel() < num_blocks:
            raise ValueError(f'block_table has {block_table.numel()} ids, need {num_blocks}')
        if not 0 < num_new <= slot_mapping.numel():
            raise ValueError(f'{num_new} new tokens for {slot_mapping.numel()} slots')
        self._slots = slot_mapping.to(device=self.device, dtype=torch.long)
        self._block_table = block_table.to(device=self.device, dtype=torch.long)
        self._decode = self._slots.numel() == 1
        if self._decode:
            self._context_buf.fill_(context)
        else:
            info = torch.tensor([num_prefix, num_new], dtype=torch.int32)
            self._seq_info.copy_(info, non_blocking=True)

    # ------------------------------------------------------------------------- attention

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Write ``k``/``v`` (already normed and rotated) by slot mapping, then attend."""
        self._check_ready()
        k_ptr, v_ptr = self._kv_ptrs[layer_idx]
        k = self._rows(k, self.num_kv_heads)
        v = self._rows(v, self.num_kv_heads)
        n = k.shape[0]
        if v.shape[0] != n or self._slots.shape[0] != n:
            raise ValueError(f'{n} keys, {v.shape[0]} values, {self._slots.shape[0]} slots')
        if n:
            self._launch(
                'kv_write', (n,), (ks.NUM_THREADS,),
                (k_ptr, v_ptr, k.data_ptr(), v.data_ptr(), self._slots.data_ptr(),
                 np.int32(self.num_kv_heads), np.int64(k.stride(0)), np.int64(v.stride(0))),
            )
        return self._attend_cached(layer_idx, q)

    def attend_qkv(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q_norm, k_norm, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q/k-norm + RoPE + KV write in one kernel, then attend (see ``AttentionBackend``)."""
        self._check_ready()
        if q_norm.eps != k_norm.eps:
            raise ValueError('q_norm and k_norm must share eps (one kernel argument)')
        q = self._fused_qkv(layer_idx, q, k, v, q_norm.weight, k_norm.weight, q_norm.eps, cos,
                            sin)
        return self._attend_cached(layer_idx, q)

    def _check_ready(self) -> None:
        if self._launch is None:
            raise RuntimeError('call CudaPagedAttention.warmup() first (outside graph capture)')

    def _fused_qkv(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                   cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self._rows(q, self.num_q_heads)
        k = self._rows(k, self.num_kv_heads)
        v = self._rows(v, self.num_kv_heads)
        n = q.shape[0]
        if k.shape[0] != n or v.shape[0] != n or self._slots.shape[0] != n:
            raise ValueError(f'{n} queries, {k.shape[0]} keys, {v.shape[0]} values, '
                             f'{self._slots.shape[0]} slots')
        # The kernel reads these with 16-byte loads: dense rows at aligned addresses (a slice
        # of a cos/sin table may start anywhere).
        tables = [t.to(self.dtype).contiguous() for t in (q_weight, k_weight, cos, sin)]
        tables = [t if t.data_ptr() % 16 == 0 else t.clone() for t in tables]
        if tables[2].shape != (n, self.head_dim) or tables[3].shape != (n, self.head_dim):
            raise ValueError(f'cos/sin must be [{n}, {self.head_dim}]')
        q_out = torch.empty(n, self.num_q_heads, self.head_dim, dtype=self.dtype,
                            device=self.device)
        k_ptr, v_ptr = self._kv_ptrs[layer_idx]
        if n:
            self._launch(
                'qk_norm_rope_kv_write', (n,), (ks.NUM_THREADS,),
                (q_out.data_ptr(), k_ptr, v_ptr, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                 *(t.data_ptr() for t in tables), self._slots.data_ptr(),
                 np.int32(self.num_q_heads), np.int32(self.num_kv_heads),
                 np.int64(q.stride(0)), np.int64(k.stride(0)), np.int64(v.stride(0)),
                 np.float32(eps)),
            )
        return q_out

    def _attend_cached(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of ``q`` over the context, whose K/V are all in the cache now."""
        if self._decode:
            return self._paged_decode(q, *self._kv_ptrs[layer_idx])
        return self._paged_prefill(q, *self._kv_ptrs[layer_idx])

    def _rows(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``x`` as [N, heads, D] in the cache dtype with 16-byte aligned, dense head vectors."""
        if x.dim() != 3 or x.shape[1] != heads or x.shape[2] != self.head_dim:
            raise ValueError(f'expected [N, {heads}, {self.head_dim}], got {tuple(x.shape)}')
        if x.device != self.device:
            raise ValueError(f'tensor on {x.device}, KV cache on {self.device}')
        x = x.to(self.dtype)
        if (
            x.stride(2) != 1
            or x.stride(1) != self.head_dim
            or x.stride(0) % self._vec
            or x.data_ptr() % 16
        ):
            x = x.contiguous()
        return x

    def _paged_decode(self, q: torch.Tensor, k_ptr: int, v_ptr: int) -> torch.Tensor:
        q_dtype = q.dtype
        q = self._rows(q, self.num_q_heads)
        if q.shape[0] != 1:
            raise ValueError(f'decode takes one query row, got {q.shape[0]}')
        out = torch.empty(1, self.num_q_heads, self.head_dim, dtype=self.dtype,
                          device=self.device)
        self._launch(
            'paged_decode_split', (self.num_kv_heads * self._chunks, self.num_splits),
            (ks.NUM_THREADS,),
            (self._part_acc.data_ptr(), self._part_ml.data_ptr(), q.data_ptr(), k_ptr, v_ptr,
             self._block_table.data_ptr(), self._context_buf.data_ptr(),
             np.int32(self.num_kv_heads), np.int32(self.group_size), np.int32(self.block_size),
             self._scale_log2),
        )
        self._launch(
            'paged_decode_reduce', (self.num_q_heads,), (self.head_dim,),
            (out.data_ptr(), self._part_acc.data_ptr(), self._part_ml.data_ptr(),
             self._context_buf.data_ptr(), np.int32(self.num_splits)),
        )
        return out if q_dtype == self.dtype else out.to(q_dtype)

    def _paged_prefill(self, q: torch.Tensor, k_ptr: int, v_ptr: int) -> torch.Tensor:
        q_dtype = q.dtype
        q = self._rows(q, self.num_q_heads)
        n = q.shape[0]
        if n != self._slots.shape[0]:
            raise ValueError(f'{n} query rows for {self._slots.shape[0]} slots')
        rows = n * self.group_size
        if rows + self._prefill_rows >= 2**31:
            raise ValueError(f'{n} query tokens x {self.group_size} heads per KV head: the '
                             'prefill kernel indexes query rows with int32')
        out = torch.empty(n, self.num_q_heads, self.head_dim, dtype=self.dtype,
                          device=self.device)
        tiles = -(-rows // self._prefill_rows)
        self._launch(
            'paged_prefill', (tiles, self.num_kv_heads), (ks.NUM_THREADS,),
            (out.data_ptr(), q.data_ptr(), k_ptr, v_ptr, self._block_table.data_ptr(),
             self._seq_info.data_ptr(), np.int32(n), np.int32(self.num_kv_heads),
             np.int32(self.group_size), np.int32(self.block_size), np.int64(q.stride(0)),
             np.int64(out.stride(0)), self._scale_log2),
        )
        return out if q_dtype == self.dtype else out.to(q_dtype)
