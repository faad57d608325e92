# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The published 2B/4B/8B configs parse, and build on ``meta`` with the reference's wiring."""

import json
from pathlib import Path

import pytest
import torch

from orin_llm_node.models import build_model, config_from_dict, load_config
from orin_llm_node.models.loader import checkpoint_names, checkpoint_to_param_name, checkpoint_view

# Copies of the published config.json files (data only, no weights).
CONFIGS = Path(__file__).resolve().parent / 'data' / 'qwen3_vl_configs'
# Text-decoder parameters (embedding + layers + norm + untied lm_head) of the published configs.
EXPECTED = {'2b': 1.721e9, '4b': 4.022e9, '8b': 8.191e9}


def published(size: str) -> dict:
    return json.loads((CONFIGS / f'qwen3-vl-{size}-instruct.config.json').read_text())


@pytest.mark.parametrize('size', sorted(EXPECTED))
def test_text_decoder_param_count(size, tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(published(size)))
    cfg = load_config(tmp_path)
    model = build_model(cfg, torch.bfloat16, 'meta')
    text = {id(p): p.numel() for m in (model.language_model, model.lm_head)
            for p in m.parameters()}  # a tied lm_head counts once
    count = sum(text.values())
    assert abs(count - EXPECTED[size]) / EXPECTED[size] < 0.01, count
    assert model.config.tie_word_embeddings == (size != '8b')
    assert all(p.device.type == 'meta' for p in model.parameters())


@pytest.mark.parametrize('size', sorted(EXPECTED))
def test_both_formats_and_reference_wiring(size):
    """Transformers 5 rewrites rope_scaling as rope_parameters: same config, same tensors."""
    transformers = pytest.importorskip('transformers')
    raw = published(size)
    cfg = config_from_dict(raw)
    assert cfg.text.rope_theta == 5e6 and cfg.text.mrope_section == (24, 20, 20)
    assert list(cfg.vision.deepstack_visual_indexes) == \
        raw['vision_config']['deepstack_visual_indexes']
    hf_cfg = transformers.Qwen3VLConfig(**raw)
    v5 = hf_cfg.to_dict()
    assert 'rope_parameters' in v5['text_config'] and 'rope_scaling' not in v5['text_config']
    assert config_from_dict(v5) == cfg
    with torch.device('meta'):
        ref = transformers.Qwen3VLForConditionalGeneration(hf_cfg)
    want = {checkpoint_to_param_name(k): tuple(v.shape) for k, v in ref.state_dict().items()}
    model = build_model(cfg)
    # Our merged qkv_proj / gate_up_proj hold the reference's separate tensors as shards.
    got = {hf: tuple(checkpoint_view(model, hf).shape)
           for name in model.state_dict() for hf in checkpoint_names(name)}
    if cfg.tie_word_embeddings:
        want.pop('lm_head.weight', None)
        got.pop('lm_head.weight', None)
    assert got == want
