# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Interleaved M-RoPE: cos/sin computed once per model call, applied (or fused) per layer."""

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ['MRotaryEmbedding', 'apply_rope', 'mrope_axis_map', 'rotate_half']


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
    """Interleaved M-RoPE cos/sin for 3-D positions ``[3, N]`` or 1-D positions ``[N]``.

    The decoder calls it once per model call (prefill chunk or decode step), never per layer;
    every layer reads the same ``cos``/``sin``.
    """

    def __init__(self, head_dim: int, rope_theta: float, mrope_section: Sequence[int]) -> None:
        super().__init__()
        self.head_dim, self.theta, self.section = head_dim, rope_theta, tuple(mrope_section)
        self.register_buffer('inv_freq', torch.empty(head_dim // 2), persistent=False)
        self.register_buffer('axis', torch.empty(head_dim // 2, dtype=torch.long),
                             persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the non-persistent buffers, e.g. after materialising from ``meta``."""
        dev = self.inv_freq.device
        if dev.type == 'meta':
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
    """Rotate ``x [N, H, D]`` by ``cos/sin [N, D]`` (products and sum rounded to the dtype)."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin
