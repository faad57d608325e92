# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The transformers reference for the engine tests (greedy generate on explicit prompt ids)."""

import copy
import importlib
import json
from pathlib import Path
import types

import numpy as np
import torch
from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration

# The reference video processor's module imports without torchvision (its class cannot be
# built); its plain functions -- sample_frames, smart_resize, patchify -- are called with a
# namespace standing in for the processor.
QWEN3VL_VIDEO = importlib.import_module(
    'transformers.models.qwen3_vl.video_processing_qwen3_vl')


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
        self.video_token_id = self.model.config.video_token_id
        self.video_config = json.loads(
            (Path(ckpt) / 'video_preprocessor_config.json').read_text())
        self._memo = {}

    def generate(self, prompt_ids, images, max_new_tokens, ignore_eos=False, videos=()):
        """Greedy continuation ids of ``prompt_ids`` (stop token included, as ours).

        ``videos``: the clips as the model saw them (``ChatResult.prompt_videos``).
        """
        key = (tuple(prompt_ids), tuple(img.tobytes() for img in images),
               tuple(np.stack(v.frames).tobytes() for v in videos), max_new_tokens, ignore_eos)
        if key not in self._memo:
            self._memo[key] = self._generate(prompt_ids, images, max_new_tokens, ignore_eos,
                                             videos)
        return self._memo[key]

    def video_inputs(self, frames):
        """``(pixel_values_videos, video_grid_thw)`` of one clip's sampled, resized frames.

        ``frames``: uint8 ``[T, H, W, 3]``; the reference's fused normalise and its patchify.
        """
        cfg = self.video_config
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)[None]
        mean = torch.tensor(cfg['image_mean']) * (1.0 / cfg['rescale_factor'])
        std = torch.tensor(cfg['image_std']) * (1.0 / cfg['rescale_factor'])
        video = (video.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
        ns = types.SimpleNamespace()
        patches, t, h, w = QWEN3VL_VIDEO.Qwen3VLVideoProcessor.patchify(
            ns, video, cfg['patch_size'], cfg['merge_size'], cfg['temporal_patch_size'])
        return patches[0], torch.tensor([[t, h, w]])

    def next_token_logits(self, prompt_ids, images, tokens):
        """fp32 logits ``[len(tokens), V]``: the reference's scores for each of ``tokens``.

        Teacher-forced: row ``i`` scores the position of ``tokens[i]`` after ``prompt_ids`` and
        ``tokens[:i]`` (one forward over the whole sequence), so another implementation's
        greedy tokens can be checked step by step without following the reference's own.
        """
        ids = torch.tensor([list(prompt_ids) + list(tokens)])
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                             **self._media_inputs(ids, images, ()))
        return out.logits[0, len(prompt_ids) - 1:ids.shape[1] - 1].float()

    def _media_inputs(self, ids, images, videos) -> dict:
        kwargs = {}
        if images:
            out = self.processor(images=list(images), return_tensors='pt')
            kwargs = {
                'pixel_values': out['pixel_values'],
                'image_grid_thw': out['image_grid_thw'],
            }
        if videos:
            inputs = [self.video_inputs(np.stack(v.frames)) for v in videos]
            kwargs['pixel_values_videos'] = torch.cat([p for p, _ in inputs])
            kwargs['video_grid_thw'] = torch.cat([g for _, g in inputs])
        if kwargs:
            # transformers 5 needs the multimodal token types to build M-RoPE positions.
            kwargs['mm_token_type_ids'] = ((ids == self.image_token_id).int()
                                           + 2 * (ids == self.video_token_id).int())
        return kwargs

    def _generate(self, prompt_ids, images, max_new_tokens, ignore_eos, videos=()):
        ids = torch.tensor([prompt_ids])
        kwargs = self._media_inputs(ids, images, videos)
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
        grid = self.processor(images=[image], return_tensors='pt')['image_grid_thw'][0]
        return int(grid.prod()) // self.processor.merge_size**2
