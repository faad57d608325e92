# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Reference logits (transformers) and ours on prompts built the reference way.

Shared by ``test_model_parity.py`` and ``test_quantization.py``: no test imports another test.
"""

from dataclasses import dataclass
from pathlib import Path

from contiguous_attention import ContiguousAttention
import numpy as np
import pytest
import torch

from orin_llm_node.processing.rope_index import rope_positions

transformers = pytest.importorskip('transformers')
PIL_Image = pytest.importorskip('PIL.Image')

LOGIT_TOL = 1e-4
VISION_REL_TOL = 1e-5
IMAGE_PAD = '<|image_pad|>'


_cache: dict = {}


def reference(ckpt: Path):
    key = ('ref', str(ckpt))
    if key not in _cache:
        _cache[key] = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
            ckpt, dtype=torch.float32).eval()
    return _cache[key]


def preprocessing(ckpt: Path):
    key = ('pre', str(ckpt))
    if key not in _cache:
        _cache[key] = (transformers.AutoTokenizer.from_pretrained(ckpt),
                       transformers.Qwen2VLImageProcessorPil.from_pretrained(ckpt))
    return _cache[key]


@dataclass
class Prompt:
    """One reference-built prompt: ids [N], pixel patches and grids (None without images)."""

    ids: torch.Tensor
    pixel_values: torch.Tensor | None
    grids: torch.Tensor | None
    turn_starts: list[int]  # index of each user turn's first token


def random_image(h: int, w: int, seed: int):
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return PIL_Image.fromarray(rgb)


def build_prompt(ckpt: Path, turns: list[tuple[list[tuple[int, int]], str, str | None]]):
    """``turns``: (image sizes (h, w), user text, assistant answer or None) per user turn."""
    tok, proc = preprocessing(ckpt)
    messages, images = [], []
    for sizes, text, answer in turns:
        images += [random_image(h, w, seed=len(images) + 7 * h + w) for h, w in sizes]
        content = [{'type': 'image'} for _ in sizes] + [{'type': 'text', 'text': text}]
        messages.append({'role': 'user', 'content': content})
        if answer is not None:
            messages.append({'role': 'assistant', 'content': answer})
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pixel_values = grids = None
    if images:
        out = proc(images=images, return_tensors='pt')
        pixel_values, grids = out['pixel_values'], out['image_grid_thw']
        merge = proc.merge_size ** 2
        parts = text.split(IMAGE_PAD)
        assert len(parts) == len(images) + 1
        pads = [IMAGE_PAD * (int(g.prod()) // merge) for g in grids]
        text = parts[0] + ''.join(a + b for a, b in zip(pads, parts[1:], strict=True))
    ids = torch.tensor(tok(text)['input_ids'])
    im_start = tok.convert_tokens_to_ids('<|im_start|>')
    user = tok('<|im_start|>user')['input_ids']
    starts = [i for i in range(len(ids)) if ids[i:i + len(user)].tolist() == user]
    assert ids[starts[0]] == im_start
    return Prompt(ids, pixel_values, grids, starts)


def reference_logits(ref, p: Prompt, image_token_id: int) -> torch.Tensor:
    kwargs = {}
    if p.pixel_values is not None:
        kwargs = dict(pixel_values=p.pixel_values, image_grid_thw=p.grids,
                      mm_token_type_ids=(p.ids == image_token_id).int()[None])
    with torch.no_grad():
        return ref(input_ids=p.ids[None], **kwargs).logits[0]


def our_logits(model, p: Prompt, chunks: list[int] | None = None) -> torch.Tensor:
    """Our logits for every position, prefilled chunk by chunk (a turn each) through one KV."""
    cfg = model.config
    merge = cfg.vision.spatial_merge_size
    bounds = [0, *(chunks or []), len(p.ids)]
    grids = p.grids.tolist() if p.grids is not None else []
    vis = model.encode_images(p.pixel_values, p.grids) if grids else None
    attn = ContiguousAttention(cfg.text.num_hidden_layers)
    out, start, used_grids, used_rows = [], 0, 0, 0
    with torch.no_grad():
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            ids = p.ids[lo:hi]
            n_img = int((ids == cfg.vision_start_token_id).sum())  # one per image
            rows = int((ids == cfg.image_token_id).sum())
            pos, start = rope_positions(ids.tolist(), grids[used_grids:used_grids + n_img],
                                        cfg.image_token_id, merge, start=start)
            chunk_vis = vis[used_rows:used_rows + rows] if rows else None
            h = model(ids, torch.from_numpy(pos), attn, chunk_vis)
            out.append(model.compute_logits(h))
            used_grids, used_rows = used_grids + n_img, used_rows + rows
    return torch.cat(out)


def vision_rel_errors(model, ref, p: Prompt) -> list[float]:
    """Relative error (Frobenius) per image of the merger output and every DeepStack level."""
    with torch.no_grad():
        want = ref.model.get_image_features(p.pixel_values, p.grids)
        got = model.encode_images(p.pixel_values, p.grids)
    sizes = (p.grids.prod(-1) // model.config.vision.spatial_merge_size ** 2).tolist()
    assert len(got.deepstack) == len(want.deepstack_features) > 0
    errs = []
    for ours_all, theirs in [(got.embeds, want.pooler_output),
                             *zip(got.deepstack, want.deepstack_features, strict=True)]:
        for a, b in zip(ours_all.split(sizes), theirs, strict=True):
            errs.append(((a - b).norm() / b.norm()).item())
    return errs


def assert_logits_parity(model, ckpt: Path, p: Prompt, chunks=None) -> float:
    want = reference_logits(reference(ckpt), p, model.config.image_token_id)
    got = our_logits(model, p, chunks)
    diff = (got - want).abs().max().item()
    assert diff <= LOGIT_TOL, f'logits max|diff| {diff:.3g} > {LOGIT_TOL}'
    return diff


def assert_vision_parity(model, ckpt: Path, p: Prompt) -> float:
    errs = vision_rel_errors(model, reference(ckpt), p)
    assert max(errs) <= VISION_REL_TOL, f'vision rel errors {errs}'
    return max(errs)
