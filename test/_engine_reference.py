# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The transformers reference for the engine tests (greedy generate on explicit prompt ids)."""

import copy

import numpy as np
import torch
from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration


def random_image(seed, height, width):
    """A reproducible random RGB uint8 image."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


class Reference:
    """transformers 5.23.0 Qwen3VLForConditionalGeneration on a checkpoint, fp32 CPU.

    ``generate`` takes the engine's ``prompt_token_ids`` and ``prompt_images`` as they are, so
    every turn of a conversation is checked against an independent run on its whole prompt.
    Results are memoised (the block-size variants of a test share them).
    """

    def __init__(self, ckpt):
        self.model = Qwen3VLForConditionalGeneration.from_pretrained(
            ckpt, dtype=torch.float32, local_files_only=True
        ).eval()
        self.processor = Qwen2VLImageProcessorPil.from_pretrained(ckpt, local_files_only=True)
        self.image_token_id = self.model.config.image_token_id
        self._memo = {}

    def generate(self, prompt_ids, images, max_new_tokens, ignore_eos=False):
        """Greedy continuation ids of ``prompt_ids`` (stop token included, as ours)."""
        key = (tuple(prompt_ids), tuple(img.tobytes() for img in images), max_new_tokens,
               ignore_eos)
        if key not in self._memo:
            self._memo[key] = self._generate(prompt_ids, images, max_new_tokens, ignore_eos)
        return self._memo[key]

    def _generate(self, prompt_ids, images, max_new_tokens, ignore_eos):
        ids = torch.tensor([prompt_ids])
        kwargs = {}
        if images:
            out = self.processor(images=list(images), return_tensors="pt")
            kwargs = {
                "pixel_values": out["pixel_values"],
                "image_grid_thw": out["image_grid_thw"],
                # transformers 5 needs the multimodal token types to build M-RoPE positions.
                "mm_token_type_ids": (ids == self.image_token_id).int(),
            }
        config = copy.deepcopy(self.model.generation_config)
        config.do_sample = False
        config.max_new_tokens = max_new_tokens
        if ignore_eos:
            config.eos_token_id = None
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                **kwargs,
            )
        return out[0, len(prompt_ids):].tolist()

    def tokens_per_image(self, image):
        """Image pad tokens the reference processor gives ``image``."""
        grid = self.processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
        return int(grid.prod()) // self.processor.merge_size**2
