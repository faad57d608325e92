# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL vision tower: patch embed, learned + rotary positions, ViT blocks, mergers.

Patches arrive flattened in ``(C, T, py, px)`` order and, within each image, in 2x2 merge-window
order (the processor's layout), so every four consecutive patches form one output token. Runs
eagerly (grid-dependent shapes); attention never crosses an image boundary.
"""

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from .config import VisionConfig

__all__ = ["Qwen3VLVisionTower", "VisionOutput", "interpolation_taps", "rotary_positions"]


@dataclass
class VisionOutput:
    """Merged visual tokens and DeepStack features, rows in image-pad order."""

    embeds: torch.Tensor  # [n_tokens, text_hidden]
    deepstack: tuple[torch.Tensor, ...]  # one [n_tokens, text_hidden] per DeepStack level

    def __getitem__(self, rows: slice | torch.Tensor) -> "VisionOutput":
        """Select token rows (e.g. the uncached part of an image) from every output."""
        return VisionOutput(self.embeds[rows], tuple(d[rows] for d in self.deepstack))


def _merge_order_rows_cols(grid_thw: torch.Tensor, merge: int) -> tuple[torch.Tensor, ...]:
    """(row, col, height, width) of every patch, patches in merge-window order per image."""
    counts = grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2]
    heights = torch.repeat_interleave(grid_thw[:, 1], counts)
    widths = torch.repeat_interleave(grid_thw[:, 2], counts)
    starts = torch.repeat_interleave(F.pad(counts.cumsum(0)[:-1], (1, 0)), counts)
    flat = torch.arange(int(counts.sum()), device=grid_thw.device)
    within = (flat - starts) % (heights * widths)  # index inside the frame
    blocks_w = widths // merge
    row = within // (merge * merge * blocks_w) * merge + (within // merge) % merge
    col = (within // (merge * merge)) % blocks_w * merge + within % merge
    return row, col, heights, widths


def _axis_taps(index: torch.Tensor, size: torch.Tensor, side: int,
               align_corners: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps/weights of target ``index`` on an axis of ``size`` into ``side`` sources."""
    index = index.to(torch.float32)
    if align_corners:  # endpoints map to 0 and side-1 (same arithmetic as the reference)
        src = index * (side - 1) / torch.clamp(size - 1, min=1)
    else:
        src = (index + 0.5) * side / size - 0.5
    floor = torch.floor(src)
    offsets = torch.arange(0, 2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def interpolation_taps(grid_thw: torch.Tensor, side: int, merge: int,
                       align_corners: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Gather indices ``[P, 4]`` into the flat ``side x side`` position table and their weights.

    Bilinear resampling of the learned table to each image's patch grid with align-corners
    semantics, patches in merge-window order (transformers'
    ``get_vision_interpolation_indices_and_weights``).
    """
    row, col, heights, widths = _merge_order_rows_cols(grid_thw, merge)
    h_taps, h_w = _axis_taps(row, heights, side, align_corners)
    w_taps, w_w = _axis_taps(col, widths, side, align_corners)
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    return indices, weights


def rotary_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """``[P, 2]`` (row, col) of every patch for the 2-D rotary, merge-window order."""
    row, col, _, _ = _merge_order_rows_cols(grid_thw, merge)
    return torch.stack([row, col], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX rotation: ``(x1, x2) -> (-x2, x1)``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope_vision(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q/k ``[P, H, D]`` in fp32 (the reference does, whatever the model dtype)."""
    cos, sin = cos[:, None].float(), sin[:, None].float()
    qf, kf = q.float(), k.float()
    q_out = qf * cos + rotate_half(qf) * sin
    k_out = kf * cos + rotate_half(kf) * sin
    return q_out.to(q.dtype), k_out.to(k.dtype)


class PatchEmbed(nn.Module):
    """Conv3d with kernel == stride: one flattened ``(C, T, py, px)`` patch in, one vector out.

    Mathematically a Linear; kept a Conv3d so low-precision rounding matches the reference.
    """

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.kernel = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=self.kernel[1:],
                              stride=self.kernel[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.proj.weight.dtype).view(-1, *self.kernel)
        return self.proj(x).view(x.shape[0], -1)


class VisionAttention(nn.Module):
    """Bidirectional attention with fused qkv, restricted to each image (cu_seqlens)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, cfg.hidden_size * 3)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                seqlens: list[int]) -> torch.Tensor:
        p = x.shape[0]
        q, k, v = self.qkv(x).reshape(p, 3, self.num_heads, -1).unbind(1)
        q, k = apply_rope_vision(q, k, cos, sin)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, P, D] like the reference
        outs = [
            F.scaled_dot_product_attention(qi, ki, vi)
            for qi, ki, vi in zip(*(t.split(seqlens, dim=2) for t in (q, k, v)), strict=True)
        ]
        return self.proj(torch.cat(outs, dim=2)[0].transpose(0, 1).reshape(p, -1))


class VisionMLP(nn.Module):
    """tanh-GELU MLP."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    """Pre-LayerNorm ViT block."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                seqlens: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """2x2 patches -> one text-width token: LayerNorm, view, Linear, exact GELU, Linear.

    The final merger normalises each patch before the view; the DeepStack mergers
    (``postshuffle``) normalise the concatenated 4-patch vector after it.
    """

    def __init__(self, cfg: VisionConfig, postshuffle: bool) -> None:
        super().__init__()
        self.width = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.postshuffle else self.norm(x)
        return self.linear_fc2(F.gelu(self.linear_fc1(x.view(-1, self.width))))


class Qwen3VLVisionTower(nn.Module):
    """The whole vision model (names mirror ``model.visual.*`` in the checkpoint)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, postshuffle=True) for _ in cfg.deepstack_visual_indexes
        )
        d = cfg.head_dim // 2  # half the head rotates by the row, half by the column
        self.register_buffer("inv_freq", torch.empty(d // 2), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute the rotary frequencies, e.g. after materialising from ``meta``."""
        if self.inv_freq.device.type == "meta":
            return
        d = self.config.head_dim // 2
        inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        self.inv_freq = inv.to(self.inv_freq.device)

    def rotary(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(cos, sin)`` ``[P, head_dim]``: ``cat(row*f, col*f)`` twice (rotate-half)."""
        pos = rotary_positions(grid_thw, self.config.spatial_merge_size)
        freqs = pos[..., None].float() * self.inv_freq  # [P, 2, D/4]
        freqs = freqs.flatten(1)  # row frequencies then column frequencies
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
        """Encode ``pixel_values [P, C*T*p*p]`` of the images ``grid_thw [n_img, 3]``."""
        cfg = self.config
        grid_thw = grid_thw.to(device=self.pos_embed.weight.device, dtype=torch.long)
        x = self.patch_embed(pixel_values)
        idx, w = interpolation_taps(grid_thw, cfg.num_grid_per_side, cfg.spatial_merge_size)
        x = x + (self.pos_embed(idx) * w[:, :, None]).sum(1).to(x.dtype)
        cos, sin = self.rotary(grid_thw)
        # Every frame of every image is its own attention segment.
        seqlens = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])
        seqlens = seqlens.tolist()
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, seqlens)
            if i in cfg.deepstack_visual_indexes:
                level = cfg.deepstack_visual_indexes.index(i)
                deepstack.append(self.deepstack_merger_list[level](x))
        return VisionOutput(self.merger(x), tuple(deepstack))
