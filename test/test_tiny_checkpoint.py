# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The tiny checkpoints load in transformers, run generate with an image and are not flat."""

import json

import numpy as np
import pytest
from safetensors import safe_open

from orin_llm_node.testing.tiny_checkpoint import REAL_SPECIAL_IDS, SPECIAL_TOKENS, tensor_shapes

transformers = pytest.importorskip('transformers')


def _reference(ckpt):
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(ckpt, local_files_only=True)
    return model, tok, proc


def _greedy_with_image(model, tok, proc, image, max_new_tokens=32):
    messages = [{'role': 'user', 'content': [
        {'type': 'image'}, {'type': 'text', 'text': 'What is in front of you?'}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pix = proc(images=[image], return_tensors='pt')
    n = int(pix['image_grid_thw'].prod()) // 4
    text = text.replace('<|image_pad|>', '<|image_pad|>' * n)
    enc = tok(text, return_tensors='pt')
    mm = (enc.input_ids == model.config.image_token_id).long()
    out = model.generate(**enc, pixel_values=pix['pixel_values'],
                         image_grid_thw=pix['image_grid_thw'], mm_token_type_ids=mm,
                         max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, enc.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize('tie', [True, False])
def test_loads_in_transformers_without_missing_keys(make_ckpt, tie):
    ckpt = make_ckpt(f'tie_{tie}', tie_word_embeddings=tie)
    model, info = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, local_files_only=True, output_loading_info=True)
    assert not info['missing_keys'] and not info['unexpected_keys'], info
    assert model.config.tie_word_embeddings is tie
    cfg = json.loads((ckpt / 'config.json').read_text())
    with safe_open(ckpt / 'model.safetensors', 'pt') as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert stored == tensor_shapes(cfg)


def test_generate_with_image_is_not_flat(tiny_ckpt):
    model, tok, proc = _reference(tiny_ckpt)
    rng = np.random.default_rng(0)
    a = _greedy_with_image(model, tok, proc, rng.integers(0, 255, (96, 160, 3), np.uint8))
    b = _greedy_with_image(model, tok, proc, rng.integers(0, 255, (96, 160, 3), np.uint8))
    assert len(set(a)) >= 8, a
    assert a != b


def test_special_ids_come_from_the_tokenizer_and_differ_from_real(tiny_ckpt):
    cfg = json.loads((tiny_ckpt / 'config.json').read_text())
    tok = transformers.AutoTokenizer.from_pretrained(tiny_ckpt, local_files_only=True)
    assert cfg['image_token_id'] == tok.convert_tokens_to_ids('<|image_pad|>')
    assert cfg['vision_start_token_id'] == tok.convert_tokens_to_ids('<|vision_start|>')
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert not set(ids.values()) & set(REAL_SPECIAL_IDS.values())
    assert cfg['text_config']['vocab_size'] == len(tok)


def test_deterministic_and_overrides(tmp_path, make_ckpt):
    from orin_llm_node.testing import make_tiny_checkpoint
    a = make_tiny_checkpoint(tmp_path / 'a', seed=3)
    b = make_tiny_checkpoint(tmp_path / 'b', seed=3)
    assert (a / 'model.safetensors').read_bytes() == (b / 'model.safetensors').read_bytes()
    assert (a / 'tokenizer.json').read_bytes() == (b / 'tokenizer.json').read_bytes()
    c = make_tiny_checkpoint(
        tmp_path / 'c', seed=3,
        text_config={'head_dim': 64, 'num_hidden_layers': 4,
                     'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0,
                                         'mrope_section': [12, 10, 10],
                                         'mrope_interleaved': True}},
        vision_config={'depth': 4, 'deepstack_visual_indexes': [0, 1, 2]})
    cfg = json.loads((c / 'config.json').read_text())
    assert cfg['text_config']['head_dim'] == 64
    assert cfg['vision_config']['deepstack_visual_indexes'] == [0, 1, 2]
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        c, local_files_only=True)
    assert len(model.model.language_model.layers) == 4
    with pytest.raises(ValueError, match='mrope_section'):
        make_tiny_checkpoint(tmp_path / 'd', text_config={'head_dim': 64})
