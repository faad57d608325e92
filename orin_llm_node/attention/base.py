# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The attention backend contract the decoder and the runner use, and the shared torch math.

The model never owns a KV cache: each decoder layer hands its new q/k/v projections to a
backend, which applies q/k-norm and RoPE, stores k/v wherever it keeps them (contiguous
tensors, paged blocks) and returns the attention output over everything the sequence has
cached so far plus the new tokens. The runner talks to a backend only through this contract
(``prepare``, ``attend_qkv``/``attend``, ``graph_safe``/``graph_key``); the torch bodies every
backend shares (q/k-norm + RoPE, gather through a block table + causal SDPA) live here, once.
"""

from typing import Protocol

import torch
from torch.nn.attention.bias import causal_lower_right
import torch.nn.functional as F

from orin_llm_node.layers.layernorm import rms_norm
from orin_llm_node.layers.rotary_embedding import apply_rope

__all__ = ['SDPA_ENABLE_GQA', 'AttentionBackend', 'causal_attention', 'gather_kv',
           'sdpa_takes_enable_gqa']


def sdpa_takes_enable_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa``.

    Asked of the function itself on a tiny input, not of the version string: ``enable_gqa``
    came with torch 2.5, JetPack 6.0 ships 2.3, and NVIDIA's Jetson builds carry pre-release
    versions (``2.5.0a0+...``) whose features depend on their commit. Without the keyword,
    torch raises ``TypeError``.
    """
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


#: Asked once at import; ``causal_attention`` expands the KV heads itself when False.
SDPA_ENABLE_GQA = sdpa_takes_enable_gqa()


class AttentionBackend(Protocol):
    """What a decoder layer and the model runner need from a KV store.

    Concrete backends subclass it to inherit the torch :meth:`attend_qkv` and
    :meth:`graph_key`; a backend with a fused kernel overrides them. ``graph_safe``: whether a
    model call through the backend may be captured in a CUDA graph (its kernels read every
    per-step value from device buffers that :meth:`prepare` refills). ``name``: what the
    diagnostics report (an ``attention_backend`` value: ``cuda`` or ``torch``).
    """

    graph_safe: bool = False
    name: str = 'torch'

    def prepare(self, slot_mapping: torch.Tensor, block_table: torch.Tensor, num_prefix: int,
                num_new: int) -> None:
        """
        Set the metadata of the next model call (paged backends).

        ``slot_mapping [>= num_new]``: flat KV slot (block * block_size + offset) of each new
        token, then -1 for padding rows of a prefill padded to a bucket (the model runs every
        row of ``slot_mapping``; padding rows write no KV and their output is zeros);
        ``block_table``: the sequence's block ids (at least ``ceil(context / block_size)``);
        ``num_prefix``: tokens already cached before the new ones.
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
        qk = _joint_view(q, k)
        if qk is None or q_norm.eps != k_norm.eps:
            q = apply_rope(q_norm(q), cos, sin)
            k = apply_rope(k_norm(k), cos, sin)
        else:
            # k's heads follow q's in the merged qkv row: norm and rotate them together (half
            # the torch ops; bit-identical, the per-head weight is broadcast the same way).
            hq, d = q.shape[1], q.shape[2]
            weight = torch.cat((q_norm.weight.expand(hq, d), k_norm.weight.expand(k.shape[1], d)))
            q, k = apply_rope(rms_norm(qk, weight, q_norm.eps), cos, sin).split(
                (hq, k.shape[1]), dim=1)
        return self.attend(layer_idx, q, k, v)

    def graph_key(self) -> tuple | None:
        """
        What a captured model call bakes in (pointers, launch scalars), or None.

        None for a backend that is not ``graph_safe``. Call after :meth:`prepare`; the runner
        re-captures a decode step or padded prefill whenever the tuple changes.
        """
        return None


def _joint_view(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``[N, Hq + Hkv, D]`` over q and k when k's heads directly follow q's in memory."""
    n, hq, d = q.shape
    if (k.dtype != q.dtype or k.shape[0] != n or k.shape[2] != d or q.stride(1) != d
            or q.stride(2) != 1 or k.stride() != q.stride()
            or k.data_ptr() != q.data_ptr() + hq * d * q.element_size()):
        return None
    return q.as_strided((n, hq + k.shape[1], d), q.stride())


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
        raise ValueError(f'expected {num_prefix + n} keys, got {num_keys}')
    # [1, H, L, D]: the 4-D layout picks the same CPU/GPU SDPA kernels as the reference.
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
    extra = {}
    if q.shape[1] != k.shape[1]:
        if SDPA_ENABLE_GQA:
            extra['enable_gqa'] = True
        else:
            # torch < 2.5 (JetPack 6.0): each KV head repeated for its group of query heads,
            # which is what enable_gqa does inside SDPA (the same outputs, bit for bit).
            group = q.shape[1] // k.shape[1]
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    if n == 1 or num_prefix == 0:
        # One query sees every key; with no prefix top-left == bottom-right.
        mask, causal = None, n > 1
    else:
        mask, causal = causal_lower_right(n, num_keys), False
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=causal, scale=q.shape[-1] ** -0.5, **extra
    )
    return out[0].transpose(0, 1)


def gather_kv(kv_layer: torch.Tensor, blocks: torch.Tensor,
              context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[context, Hkv, D]`` of a sequence, gathered through its ``blocks``.

    ``kv_layer`` is one layer of the paged KV tensor, ``[2, blocks, block_size, Hkv, D]``.
    """
    hkv, d = kv_layer.shape[-2:]
    # One index_select for K and V; not layer[:, blocks]: mixed basic/advanced indexing is
    # ~1000x slower.
    kv = kv_layer.index_select(1, blocks).view(2, -1, hkv, d)[:, :context]
    return kv[0], kv[1]
