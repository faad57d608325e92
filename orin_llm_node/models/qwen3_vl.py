# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The whole Qwen3-VL model: vision tower, decoder, lm_head.

State-dict keys are the checkpoint's with ``model.`` dropped: ``visual.*``, ``language_model.*``,
``lm_head.weight`` (absent from the state dict's sources when tied: it *is* embed_tokens).
"""

import torch
from torch import nn

from orin_llm_node.attention.base import AttentionBackend

from .config import Qwen3VLConfig
from .qwen3_vl_text import Qwen3VLTextModel
from .qwen3_vl_vision import Qwen3VLVisionTower, VisionOutput

__all__ = ['Qwen3VLForCausalLM']


class Qwen3VLForCausalLM(nn.Module):
    """Qwen3-VL for generation, split into the steps the engine schedules separately."""

    #: The checkpoint's separate projections that this model holds merged (nano-vllm's
    #: name): checkpoint module -> (our merged module, shard id), read by the loader. The
    #: decoder's q/k/v and gate/up; the vision tower's checkpoint has its qkv merged already.
    packed_modules_mapping = {
        'q_proj': ('qkv_proj', 'q'),
        'k_proj': ('qkv_proj', 'k'),
        'v_proj': ('qkv_proj', 'v'),
        'gate_proj': ('gate_up_proj', 0),
        'up_proj': ('gate_up_proj', 1),
    }

    def __init__(self, cfg: Qwen3VLConfig) -> None:
        super().__init__()
        self.config = cfg
        self.visual = Qwen3VLVisionTower(cfg.vision)
        self.language_model = Qwen3VLTextModel(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share embed_tokens with lm_head when the top-level config says so."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.language_model.embed_tokens.weight

    def init_buffers(self) -> None:
        """Recompute the non-persistent (rotary) buffers after materialising the weights."""
        self.visual.init_buffers()
        self.language_model.rotary_emb.init_buffers()

    def encode_images(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
        """Vision tower over the patches of one or more images (see ``Qwen3VLVisionTower``)."""
        return self.visual(pixel_values, grid_thw)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[N, H]`` of ``input_ids [N]``."""
        return self.language_model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[M, V]`` of final-normed hidden states ``[M, H]``."""
        return self.lm_head(hidden).float()  # a module call: lm_head may be quantized

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        visual: VisionOutput | None = None,
    ) -> torch.Tensor:
        """
        Hidden states ``[N, H]`` of ``input_ids [N]`` (a new chunk of one sequence).

        ``visual`` holds one row per image- or video-pad token *present in this chunk*, in
        order (slice a cached ``VisionOutput`` when part of an image or clip is already in the
        KV cache); its embeds replace the pads and its DeepStack features are added after the
        first decoder layers (the reference adds them at image and video tokens alike).
        """
        h = self.embed(input_ids)
        mask = None
        if visual is not None:
            mask = ((input_ids == self.config.image_token_id)
                    | (input_ids == self.config.video_token_id))
            n_pad, n_vis = int(mask.sum()), visual.embeds.shape[0]
            if n_pad != n_vis:
                raise ValueError(f'{n_pad} image/video pad tokens but {n_vis} visual embeddings')
            h = h.masked_scatter(mask[:, None], visual.embeds.to(h.dtype))
        return self.language_model(
            h, positions, attn, mask, visual.deepstack if visual is not None else None
        )
