# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The attention backend interface the decoder calls, and the shared causal attention math.

The model never owns a KV cache: each decoder layer hands its new q/k/v to a backend, which
stores k/v wherever it keeps them (contiguous tensors, paged blocks) and returns the attention
output over everything the sequence has cached so far plus the new tokens.
"""

from typing import Protocol

import torch
from torch.nn.attention.bias import causal_lower_right
import torch.nn.functional as F

__all__ = ["AttentionBackend", "causal_attention"]


class AttentionBackend(Protocol):
    """What a decoder layer needs from a KV store (paged backends also take ``prepare``).

    ``graph_safe``: whether a model call through this backend may be captured in a CUDA graph
    (its kernels read every per-step value from device buffers that ``prepare`` refills).
    """

    graph_safe: bool

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """
        Store ``k``/``v`` of the new tokens for ``layer_idx`` and attend causally.

        ``q`` is ``[N, Hq, D]``, ``k``/``v`` are ``[N, Hkv, D]`` (already q/k-normed and
        rotated); returns ``[N, Hq, D]`` with softmax scale ``D ** -0.5``.
        """
        ...


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_prefix: int
) -> torch.Tensor:
    """
    Causal GQA attention of ``N`` new queries over ``num_prefix + N`` keys.

    ``q``: ``[N, Hq, D]``; ``k``/``v``: ``[num_prefix + N, Hkv, D]`` (cached prefix first).
    Query ``i`` sees keys ``<= num_prefix + i`` (bottom-right aligned). SDPA's ``is_causal`` is
    top-left aligned when there are more keys than queries, so it is only used when the two
    alignments coincide (no prefix). With a prefix the mask is ``causal_lower_right``: on a GPU
    it selects the flash kernel's native bottom-right mode, which is shape-stable (a boolean
    mask picks a backend that plans per shape: 50-70 ms on each new length on an H100); on the
    CPU it is materialised into the same boolean mask as before, so results are unchanged.
    """
    n, num_keys = q.shape[0], k.shape[0]
    if num_keys != num_prefix + n:
        raise ValueError(f"expected {num_prefix + n} keys, got {num_keys}")
    # [1, H, L, D]: the 4-D layout picks the same CPU/GPU SDPA kernels as the reference.
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    if n == 1 or num_prefix == 0:
        # One query sees every key; with no prefix top-left == bottom-right.
        mask, causal = None, n > 1
    else:
        mask, causal = causal_lower_right(n, num_keys), False
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=causal, scale=q.shape[-1] ** -0.5, enable_gqa=gqa
    )
    return out[0].transpose(0, 1)
