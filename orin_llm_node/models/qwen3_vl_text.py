# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL language decoder over flattened tokens (batch 1, no batch dim, like nano-vllm).

Pre-norm layers with QK-norm GQA attention and a SiLU MLP; interleaved M-RoPE; DeepStack visual
features added to the hidden states at image positions after the first decoder layers. Attention
is delegated to an :class:`~orin_llm_node.attention.base.AttentionBackend`, which owns the KV.
"""

from collections.abc import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from orin_llm_node.attention.base import AttentionBackend

from .config import TextConfig

__all__ = ["MRotaryEmbedding", "Qwen3VLTextModel", "RMSNorm", "mrope_axis_map"]


class RMSNorm(nn.Module):
    """RMSNorm that normalises in fp32, casts back, then scales (the reference's order)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dim of ``x``."""
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def mrope_axis_map(head_dim: int, mrope_section: Sequence[int]) -> torch.Tensor:
    """
    For each of the ``head_dim/2`` frequencies, the position axis (0=T, 1=H, 2=W) it rotates by.

    Interleaved layout: frequency ``j`` uses H if ``j % 3 == 1 and j < 3*s_h``, W if
    ``j % 3 == 2 and j < 3*s_w``, else T.
    """
    axis = torch.zeros(head_dim // 2, dtype=torch.long)
    for dim, offset in ((1, 1), (2, 2)):
        axis[offset:mrope_section[dim] * 3:3] = dim
    return axis


class MRotaryEmbedding(nn.Module):
    """Interleaved M-RoPE cos/sin for 3-D positions ``[3, N]`` or 1-D positions ``[N]``."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.head_dim, self.theta, self.section = cfg.head_dim, cfg.rope_theta, cfg.mrope_section
        self.register_buffer("inv_freq", torch.empty(cfg.head_dim // 2), persistent=False)
        self.register_buffer("axis", torch.empty(cfg.head_dim // 2, dtype=torch.long),
                             persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the non-persistent buffers, e.g. after materialising from ``meta``."""
        dev = self.inv_freq.device
        if dev.type == "meta":
            return
        d = self.head_dim
        # Computed on the CPU in fp32 exactly like the reference, then moved.
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        self.inv_freq = inv.to(dev)
        self.axis = mrope_axis_map(d, self.section).to(dev)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Return ``(cos, sin)`` of shape ``[N, head_dim]`` in ``dtype``."""
        if positions.dim() == 2:
            # Pick each frequency's axis first; the elementwise math after is the same as for the
            # 1-D path, so t=h=w positions give bit-identical cos/sin on both paths.
            pos = positions[self.axis].t()  # [N, D/2]
        else:
            pos = positions[:, None].expand(-1, self.inv_freq.shape[0])
        freqs = pos.float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX rotation: ``(x1, x2) -> (-x2, x1)`` over the last dim halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [N, H, D]`` by ``cos/sin [N, D]``."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """QK-norm GQA self-attention; the KV store and the softmax live in the backend."""

    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = d = cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)  # over head_dim, before RoPE
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, d))
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv, d))
        v = self.v_proj(x).view(n, self.num_kv, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attn.attend(self.layer_idx, q, k, v)
        return self.o_proj(o.reshape(n, self.num_heads * d))


class MLP(nn.Module):
    """SiLU-gated MLP."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block."""

    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


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
        self.rotary_emb = MRotaryEmbedding(cfg)

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
        visual rows after decoder layer ``i``.
        """
        cos, sin = self.rotary_emb(positions, inputs_embeds.dtype)
        visual_idx = None
        if deepstack:
            visual_idx = visual_mask.nonzero().squeeze(1)
        h = inputs_embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, attn)
            if visual_idx is not None and i < len(deepstack):
                h = add_deepstack(h, visual_idx, deepstack[i])
        return self.norm(h)
