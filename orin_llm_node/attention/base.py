# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The attention backend contract the decoder and the runner use, and the shared torch math.

The model never owns a KV cache: each decoder layer hands its new q/k/v projections to a
backend, which applies q/k-norm and RoPE, stores k/v wherever it keeps them (contiguous
tensors, paged blocks) and returns the attention output over everything the sequence has
cached so far plus the new tokens. The runner talks to a backend only through this contract
(``prepare``, ``attend_qkv``/``attend``, ``graph_key``); the torch bodies every backend shares
(q/k-norm + RoPE, gather through a block table + causal SDPA) live here, once.
"""

from typing import Protocol

import torch
import torch.nn.functional as F

from orin_llm_node.layers.rotary_embedding import apply_rope

__all__ = ["AttentionBackend", "causal_attention", "gather_kv"]


class AttentionBackend(Protocol):
    """What a decoder layer and the model runner need from a KV store.

    Concrete backends subclass it to inherit the torch :meth:`attend_qkv` and
    :meth:`graph_key`; a backend with a fused kernel overrides them.
    """

    def prepare(self, slot_mapping: torch.Tensor, block_table: torch.Tensor, num_prefix: int,
                num_new: int) -> None:
        """
        Set the metadata of the next model call (paged backends).

        ``slot_mapping [>= num_new]``: flat KV slot (block * block_size + offset) of each new
        token; ``block_table``: the sequence's block ids (at least ``ceil(context /
        block_size)``); ``num_prefix``: tokens already cached before the new ones.
        """
        ...

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """
        Store ``k``/``v`` of the new tokens for ``layer_idx`` and attend causally.

        ``q`` is ``[N, Hq, D]``, ``k``/``v`` are ``[N, Hkv, D]`` (already q/k-normed and
        rotated); returns ``[N, Hq, D]`` with softmax scale ``D ** -0.5``.
        """
        ...

    def attend_qkv(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q_norm, k_norm, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """
        :meth:`attend` on the raw projections: q/k-norm and RoPE applied first.

        ``q [N, Hq, D]``, ``k``/``v [N, Hkv, D]`` may be views into one merged qkv output;
        ``q_norm``/``k_norm`` are the layer's RMSNorm modules (over ``D``), ``cos``/``sin``
        ``[N, D]`` the step's rotary tables. Torch body: the CPU path and the oracle of the
        fused q/k-norm + RoPE + KV-write kernel.
        """
        q = apply_rope(q_norm(q), cos, sin)
        k = apply_rope(k_norm(k), cos, sin)
        return self.attend(layer_idx, q, k, v)

    def graph_key(self) -> tuple | None:
        """
        What a captured decode step bakes in (pointers, launch scalars), or None.

        None means this backend's decode step cannot be captured in a CUDA graph. Call after
        :meth:`prepare`; the runner re-captures whenever the tuple changes.
        """
        return None


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_prefix: int
) -> torch.Tensor:
    """
    Causal GQA attention of ``N`` new queries over ``num_prefix + N`` keys.

    ``q``: ``[N, Hq, D]``; ``k``/``v``: ``[num_prefix + N, Hkv, D]`` (cached prefix first).
    Query ``i`` sees keys ``<= num_prefix + i`` (bottom-right aligned). SDPA's ``is_causal`` is
    top-left aligned when there are more keys than queries, so it is only used when the two
    alignments coincide (no prefix).
    """
    n, num_keys = q.shape[0], k.shape[0]
    if num_keys != num_prefix + n:
        raise ValueError(f"expected {num_prefix + n} keys, got {num_keys}")
    # [1, H, L, D]: the 4-D layout picks the same CPU/GPU SDPA kernels as the reference.
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    if n == 1 or num_prefix == 0:
        # One query sees every key; with no prefix top-left == bottom-right.
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=n > 1, scale=q.shape[-1] ** -0.5, enable_gqa=gqa
        )
    else:
        mask = torch.ones(n, num_keys, dtype=torch.bool, device=q.device).tril(num_prefix)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=q.shape[-1] ** -0.5, enable_gqa=gqa
        )
    return out[0].transpose(0, 1)


def gather_kv(kv_layer: torch.Tensor, blocks: torch.Tensor,
              context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[context, Hkv, D]`` of a sequence, gathered through its ``blocks``.

    ``kv_layer`` is one layer of the paged KV tensor, ``[2, blocks, block_size, Hkv, D]``.
    """
    hkv, d = kv_layer.shape[-2:]
    # index_select, not layer[0, blocks]: mixed basic/advanced indexing is ~1000x slower.
    keys = kv_layer[0].index_select(0, blocks).view(-1, hkv, d)[:context]
    values = kv_layer[1].index_select(0, blocks).view(-1, hkv, d)[:context]
    return keys, values
