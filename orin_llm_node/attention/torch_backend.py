# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Paged attention in plain torch: the CPU path and the reference for the CUDA kernels.

K/V of the new tokens are written into the paged cache through the slot mapping, then the
sequence's whole context (cached prefix + new tokens) is gathered through its block table and
attended with the bottom-right causal mask of ``attention.base.causal_attention``.
"""

import torch

from .base import AttentionBackend, causal_attention, gather_kv

__all__ = ['TorchPagedAttention']


class TorchPagedAttention(AttentionBackend):
    """Attention backend over the runner's KV tensor ``[layers, 2, blocks, block_size, Hkv, D]``.

    The runner calls ``prepare(...)`` before every model call; the decoder layers then call
    ``attend``. Per-step metadata are plain host ints here (this backend is not graph-safe; the
    CUDA backend reads the same metadata from device buffers instead).
    """

    def __init__(self, kv_cache: torch.Tensor):
        if kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
            raise ValueError(
                f'kv_cache must be [layers, 2, blocks, block_size, Hkv, D], got {kv_cache.shape}'
            )
        self.kv_cache = kv_cache
        self.block_size = kv_cache.shape[3]
        self._slots = None
        self._blocks = None
        self._num_prefix = 0
        self._context = 0

    def prepare(
        self,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        num_prefix: int,
        num_new: int,
    ) -> None:
        """Set the metadata of the next model call (see ``AttentionBackend.prepare``)."""
        self._slots = slot_mapping[:num_new]
        self._num_prefix = num_prefix
        self._context = num_prefix + num_new
        num_blocks = -(-self._context // self.block_size)
        self._blocks = block_table[:num_blocks]

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Write ``k``/``v`` by slot mapping, gather the context by block table, attend.

        ``q``/``k``/``v`` may carry padding rows after the ``num_new`` real ones (a prefill
        padded to a bucket): they are not written and their output rows are zeros.
        """
        rows = q.shape[0]
        num_new = self._slots.shape[0]
        if rows > num_new:
            q, k, v = q[:num_new], k[:num_new], v[:num_new]
        layer = self.kv_cache[layer_idx]  # [2, blocks, block_size, Hkv, D]
        hkv, d = layer.shape[-2:]
        flat = layer.view(2, -1, hkv, d)
        flat[0].index_copy_(0, self._slots, k.to(layer.dtype))
        flat[1].index_copy_(0, self._slots, v.to(layer.dtype))
        keys, values = gather_kv(layer, self._blocks, self._context)
        if q.shape[0] == 1:
            out = _single_query_attention(q, keys, values)
        else:
            out = causal_attention(q, keys, values, self._num_prefix)
        if rows > num_new:
            out = torch.cat([out, out.new_zeros(rows - num_new, *out.shape[1:])])
        return out


def _single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Decode: one query sees every key, so no mask. The query heads sharing a KV head are
    # folded into the query-length dim (no K/V copy for GQA), and two plain matmuls in fp32
    # avoid SDPA's CPU kernel, whose thread fan-out costs milliseconds on tiny decode shapes.
    hq, d = q.shape[1:]
    hkv = k.shape[1]
    qg = q[0].reshape(hkv, hq // hkv, d).float()
    scores = torch.matmul(qg, k.transpose(0, 1).float().transpose(1, 2)) * d**-0.5
    out = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(0, 1).float())
    return out.reshape(1, hq, d).to(q.dtype)
