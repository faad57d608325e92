# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL vision tower: patch embed, learned + rotary positions, ViT blocks, mergers.

Patches arrive flattened in ``(C, T, py, px)`` order and, within each image, in 2x2 merge-window
order (the processor's layout), so every four consecutive patches form one output token. Runs
eagerly (grid-dependent shapes); attention never crosses an image boundary.

What depends only on the image grid (interpolated position embeddings, rotary cos/sin, the
attention segments) is computed once per grid and kept (``grid_inputs``), so a warm-up over the
image sizes a node produces leaves only the tower's matmuls and kernels for each frame.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from orin_llm_node.layers import apply_rope

from .config import VisionConfig

__all__ = [
    'GridInputs',
    'Qwen3VLVisionTower',
    'VisionOutput',
    'interpolation_taps',
    'rotary_positions',
    'segment_mask',
]


@dataclass
class VisionOutput:
    """Merged visual tokens and DeepStack features, rows in image-pad order."""

    embeds: torch.Tensor  # [n_tokens, text_hidden]
    deepstack: tuple[torch.Tensor, ...]  # one [n_tokens, text_hidden] per DeepStack level

    def __getitem__(self, rows: slice | torch.Tensor) -> 'VisionOutput':
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


def apply_rope_vision(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q/k ``[P, H, D]`` in fp32 (the reference does, whatever the model dtype)."""
    cos, sin = cos.float(), sin.float()
    return (apply_rope(q.float(), cos, sin).to(q.dtype),
            apply_rope(k.float(), cos, sin).to(k.dtype))


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d (kernel == stride), run as the one GEMM it is.

    Each flattened ``(C, T, py, px)`` patch meets the whole kernel exactly once, so the
    convolution is ``patches @ weight.view(hidden, -1).T + bias``: the same sums, in a different
    order than a convolution algorithm's (fp32 results differ by rounding only, ~1e-6
    relative), and 6x (CPU) faster than Conv3d, which does not special-case stride == kernel.
    """

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        # The parameter keeps the checkpoint's name and 5-D shape.
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(x.to(w.dtype), w.view(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    """Bidirectional attention with fused qkv, restricted to each image (cu_seqlens)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, cfg.hidden_size * 3)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None, segments: int = 1) -> torch.Tensor:
        p = x.shape[0]
        q, k, v = self.qkv(x).reshape(p, 3, self.num_heads, -1).unbind(1)
        q, k = apply_rope_vision(q, k, cos, sin)
        # [segments, H, P / segments, D]: equal segments (the frames of a clip) are a batch.
        q, k, v = (t.reshape(segments, p // segments, *t.shape[1:]).transpose(1, 2)
                   for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(p, -1))


class VisionMLP(nn.Module):
    """tanh-GELU MLP."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate='tanh'))


class VisionBlock(nn.Module):
    """Pre-LayerNorm ViT block."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None, segments: int = 1) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask, segments)
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


@dataclass
class GridInputs:
    """What the tower's input depends on besides the pixels, for one tuple of image grids."""

    pos: torch.Tensor  # [P, hidden] interpolated learned position embeddings
    cos: torch.Tensor  # [P, head_dim] fp32 rotary
    sin: torch.Tensor
    mask: torch.Tensor | None  # [P, P] block-diagonal (one block per frame); None for one frame
    # or for frames of one size (a clip, or images of one grid): then ``segments`` frames of
    # equal length attend as a batch, without a mask (a masked SDPA over a clip's every frame
    # costs ``segments`` times the work and takes a slower kernel).
    segments: int = 1


def segment_mask(seqlens: torch.Tensor) -> torch.Tensor | None:
    """Boolean block-diagonal attention mask of consecutive segments (None for a single one).

    One SDPA over every frame of every image instead of one call per frame: a key is visible
    to a query only inside its own segment (the reference's ``cu_seqlens`` windows).
    """
    if seqlens.numel() == 1:
        return None
    segment = torch.repeat_interleave(torch.arange(seqlens.numel(), device=seqlens.device),
                                      seqlens)
    return segment[:, None] == segment[None, :]


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
        self.register_buffer('inv_freq', torch.empty(d // 2), persistent=False)
        self._grids: OrderedDict[tuple, GridInputs] = OrderedDict()
        self.init_buffers()

    #: Grid tuples whose inputs are kept (LRU); a node sees one or two image sizes.
    MAX_GRIDS = 8

    def init_buffers(self) -> None:
        """(Re)compute the rotary frequencies, e.g. after materialising from ``meta``.

        Also forgets the per-grid inputs, which depend on the weights and the device.
        """
        self._grids.clear()
        if self.inv_freq.device.type == 'meta':
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

    def grid_inputs(self, grid_thw: torch.Tensor) -> GridInputs:
        """Position embeddings, rotary and attention mask of ``grid_thw [n_img, 3]`` (cached).

        Computed on the weights' device the first time a grid tuple is seen (kept only without
        autograd: a cached tensor must not carry a graph); the engine's warm-up fills this for
        the image sizes it will get. Pass ``grid_thw`` on the CPU to avoid a device sync.
        """
        key = tuple(map(tuple, grid_thw.tolist()))
        hit = self._grids.get(key)
        if hit is not None:
            self._grids.move_to_end(key)
            return hit
        cfg = self.config
        grid = grid_thw.to(device=self.pos_embed.weight.device, dtype=torch.long)
        idx, w = interpolation_taps(grid, cfg.num_grid_per_side, cfg.spatial_merge_size)
        pos = (self.pos_embed(idx) * w[:, :, None]).sum(1)
        cos, sin = self.rotary(grid)
        # Every frame of every image is its own attention segment.
        seqlens = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])
        if bool((seqlens == seqlens[0]).all()):
            entry = GridInputs(pos, cos, sin, None, seqlens.numel())
        else:
            entry = GridInputs(pos, cos, sin, segment_mask(seqlens))
        if torch.is_grad_enabled():
            return entry
        self._grids[key] = entry
        if len(self._grids) > self.MAX_GRIDS:
            self._grids.popitem(last=False)
        return entry

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
        """Encode ``pixel_values [P, C*T*p*p]`` of the images ``grid_thw [n_img, 3]``."""
        cfg = self.config
        g = self.grid_inputs(grid_thw)
        x = self.patch_embed(pixel_values)
        x = x + g.pos.to(x.dtype)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, g.cos, g.sin, g.mask, g.segments)
            if i in cfg.deepstack_visual_indexes:
                level = cfg.deepstack_visual_indexes.index(i)
                deepstack.append(self.deepstack_merger_list[level](x))
        return VisionOutput(self.merger(x), tuple(deepstack))
