# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL language decoder over flattened tokens (batch 1, no batch dim, like nano-vllm).

Pre-norm layers with QK-norm GQA attention and a SiLU MLP; interleaved M-RoPE; DeepStack visual
features added to the hidden states at image positions after the first decoder layers. Attention
is delegated to an :class:`~orin_llm_node.attention.base.AttentionBackend`, which owns the KV.

The layers carry the residual stream separately (nano-vllm's ``RMSNorm(x, residual)``): each
norm adds the previous block's output to the residual and normalises the sum in one fused op.
The q/k/v and gate/up projections are merged weights (``layers.linear``), loaded from the
checkpoint's separate tensors.
"""

from collections.abc import Sequence

import torch
from torch import nn

from orin_llm_node.attention.base import AttentionBackend
from orin_llm_node.layers import (
    MergedLinear,
    MRotaryEmbedding,
    QKVLinear,
    ReplicatedLinear,
    RMSNorm,
    SiluAndMul,
)

from .config import TextConfig

__all__ = ['Qwen3VLTextModel']


class Attention(nn.Module):
    """QK-norm GQA self-attention; the KV store and the softmax live in the backend."""

    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        d, hq = cfg.head_dim, cfg.num_attention_heads
        self.qkv_proj = QKVLinear(cfg.hidden_size, d, hq, cfg.num_key_value_heads,
                                  bias=cfg.attention_bias)
        self.o_proj = ReplicatedLinear(hq * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)  # over head_dim, before RoPE
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        o = attn.attend_qkv(self.layer_idx, q, k, v, self.q_norm, self.k_norm, cos, sin)
        return self.o_proj(o.reshape(x.shape[0], -1))


class MLP(nn.Module):
    """SiLU-gated MLP over a merged gate/up projection."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = MergedLinear(cfg.hidden_size, [size, size], bias=False)
        self.act_fn = SiluAndMul()
        self.down_proj = ReplicatedLinear(size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block over ``(hidden, residual)``."""

    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        # The reference's h + block(norm(h)): the residual add happens in the next norm.
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, cos, sin, attn)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


def add_deepstack(h: torch.Tensor, visual_idx: torch.Tensor,
                  feature: torch.Tensor) -> torch.Tensor:
    """Add one DeepStack feature ``[n_vis, H]`` to the rows ``visual_idx`` of ``h``."""
    return h.index_add(0, visual_idx, feature.to(h.dtype))


class Qwen3VLTextModel(nn.Module):
    """The decoder stack: embed_tokens, layers, norm (names mirror the HF checkpoint)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = MRotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        visual_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """
        Run the decoder over ``inputs_embeds [N, H]``; return the final-normed hidden ``[N, H]``.

        ``positions`` is ``[3, N]`` (M-RoPE, prefill) or ``[N]`` (t=h=w, decode; no host sync).
        ``deepstack[i]`` (``[n_vis, H]``, one row per True in ``visual_mask [N]``) is added at the
        visual rows after decoder layer ``i``. ``inputs_embeds`` becomes the residual stream:
        with the fused CUDA kernels it is updated in place (pass a tensor you own).
        """
        cos, sin = self.rotary_emb(positions, inputs_embeds.dtype)  # once for every layer
        visual_idx = None
        if deepstack:
            visual_idx = visual_mask.nonzero().squeeze(1)
        h, residual = inputs_embeds, None
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, cos, sin, attn)
            if visual_idx is not None and i < len(deepstack):
                # The reference adds the feature to the layer's full output (residual + mlp).
                h, residual = add_deepstack(residual + h, visual_idx, deepstack[i]), None
        if residual is None:
            return self.norm(h)
        return self.norm(h, residual)[0]
