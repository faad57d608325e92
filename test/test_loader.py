# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Checkpoint loading: single file vs shards, tying, dtype cast, and one-line errors."""

import json
from pathlib import Path
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file
import torch

from orin_llm_node.errors import ModelLoadError
from orin_llm_node.models import load_config, load_model
from orin_llm_node.models.loader import (
    checkpoint_names,
    checkpoint_target,
    checkpoint_to_param_name,
    checkpoint_view,
)

META_FILES = ('config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json',
              'preprocessor_config.json', 'chat_template.jinja')


def copy_without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in META_FILES:
        shutil.copy(src / name, dst / name)
    return dst


def assert_matches_file(model, tensors: dict) -> None:
    names = {hf for name, _ in model.named_parameters() for hf in checkpoint_names(name)}
    for key, t in tensors.items():
        name = checkpoint_to_param_name(key)
        if name == 'lm_head.weight' and model.config.tie_word_embeddings:
            continue
        assert torch.equal(checkpoint_view(model, key), t), key
    assert len(names) == len(tensors)


def load_error(path) -> str:
    with pytest.raises(ModelLoadError) as e:
        load_model(path)
    msg = str(e.value)
    assert '\n' not in msg
    return msg


def test_single_file_tied(tiny_ckpt):
    model = load_model(tiny_ckpt)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.language_model.embed_tokens.weight
    assert_matches_file(model, load_file(tiny_ckpt / 'model.safetensors'))
    assert not any(p.requires_grad for p in model.parameters())


def test_untied(make_ckpt):
    ckpt = make_ckpt('models-untied', tie_word_embeddings=False)
    model = load_model(ckpt)
    assert model.lm_head.weight is not model.language_model.embed_tokens.weight
    assert_matches_file(model, load_file(ckpt / 'model.safetensors'))


def test_three_shards_load_identically(tiny_ckpt, tmp_path):
    tensors = load_file(tiny_ckpt / 'model.safetensors')
    sharded = copy_without_weights(tiny_ckpt, tmp_path / 'sharded')
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        fname = f'model-{i + 1:05d}-of-00003.safetensors'
        part = names[i::3]
        save_file({n: tensors[n] for n in part}, str(sharded / fname), metadata={'format': 'pt'})
        weight_map.update(dict.fromkeys(part, fname))
    (sharded / 'model.safetensors.index.json').write_text(
        json.dumps({'metadata': {}, 'weight_map': weight_map}))
    a, b = load_model(tiny_ckpt), load_model(sharded)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert b.lm_head.weight is b.language_model.embed_tokens.weight

    # A shard that lost a tensor the index promises.
    (sharded / 'model-00002-of-00003.safetensors').unlink()
    save_file({n: tensors[n] for n in names[1::3][1:]},
              str(sharded / 'model-00002-of-00003.safetensors'))
    msg = load_error(sharded)
    assert names[1] in msg and 'model-00002-of-00003' in msg
    (sharded / 'model-00003-of-00003.safetensors').unlink()
    assert 'model-00003-of-00003.safetensors' in load_error(sharded)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_dtype_cast(tiny_ckpt, dtype):
    ref, model = load_model(tiny_ckpt), load_model(tiny_ckpt, dtype=dtype)
    for (name, a), b in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert b.dtype == dtype and torch.equal(a.to(dtype), b), name
    # RoPE frequencies stay fp32 whatever the weights are.
    assert model.language_model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(model.visual.inv_freq, ref.visual.inv_freq)


def test_missing_tensor(tiny_ckpt, tmp_path):
    tensors = load_file(tiny_ckpt / 'model.safetensors')
    bad = copy_without_weights(tiny_ckpt, tmp_path / 'bad')
    gone = 'model.language_model.layers.1.mlp.up_proj.weight'
    save_file({k: v for k, v in tensors.items() if k != gone}, str(bad / 'model.safetensors'))
    msg = load_error(bad)
    assert 'missing tensors' in msg and 'language_model.layers.1.mlp.up_proj.weight' in msg


def test_unexpected_and_misshapen_tensor(tiny_ckpt, tmp_path):
    tensors = load_file(tiny_ckpt / 'model.safetensors')
    bad = copy_without_weights(tiny_ckpt, tmp_path / 'extra')
    save_file({**tensors, 'model.visual.blocks.9.attn.qkv.weight': torch.zeros(3)},
              str(bad / 'model.safetensors'))
    assert 'unexpected tensors: model.visual.blocks.9.attn.qkv.weight' in load_error(bad)
    bad = copy_without_weights(tiny_ckpt, tmp_path / 'shape')
    key = 'model.language_model.norm.weight'
    save_file({**tensors, key: torch.ones(7)}, str(bad / 'model.safetensors'))
    msg = load_error(bad)
    assert key in msg and 'shape [7]' in msg


def test_truncated_file(tiny_ckpt, tmp_path):
    bad = copy_without_weights(tiny_ckpt, tmp_path / 'trunc')
    data = (tiny_ckpt / 'model.safetensors').read_bytes()
    (bad / 'model.safetensors').write_bytes(data[:len(data) // 2])
    assert 'cannot read safetensors' in load_error(bad)


def test_directory_and_config_errors(tiny_ckpt, tmp_path):
    assert 'not found' in load_error(tmp_path / 'nope')
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert 'no config.json' in load_error(empty)

    pickled = copy_without_weights(tiny_ckpt, tmp_path / 'pickled')
    (pickled / 'pytorch_model.bin').write_bytes(b'not loaded')
    assert 'pickle' in load_error(pickled)

    other = copy_without_weights(tiny_ckpt, tmp_path / 'llama')
    (other / 'config.json').write_text(json.dumps(
        {'model_type': 'llama', 'architectures': ['LlamaForCausalLM'], 'hidden_size': 64}))
    assert 'not a Qwen3-VL checkpoint' in load_error(other)

    cfg = json.loads((tiny_ckpt / 'config.json').read_text())
    cfg['text_config']['rope_parameters']['mrope_section'] = [6, 6, 6]
    broken = copy_without_weights(tiny_ckpt, tmp_path / 'section')
    (broken / 'config.json').write_text(json.dumps(cfg))
    assert 'mrope_section' in load_error(broken)


def test_token_ids_from_config(tiny_ckpt):
    raw = json.loads((tiny_ckpt / 'config.json').read_text())
    cfg = load_config(tiny_ckpt)
    assert cfg.image_token_id == raw['image_token_id'] != 151655
    assert cfg.vision_start_token_id == raw['vision_start_token_id']
    assert cfg.vision_end_token_id == raw['vision_end_token_id']
    assert cfg.video_token_id == raw['video_token_id']


@pytest.mark.parametrize('key, name', [
    ('model.visual.merger.norm.weight', 'visual.merger.norm.weight'),
    ('visual.blocks.0.attn.qkv.bias', 'visual.blocks.0.attn.qkv.bias'),
    ('model.language_model.norm.weight', 'language_model.norm.weight'),
    ('model.norm.weight', 'language_model.norm.weight'),
    ('lm_head.weight', 'lm_head.weight'),
])
def test_tensor_name_mapping(key, name):
    assert checkpoint_to_param_name(key) == name


@pytest.mark.parametrize('key, target, shard', [
    ('model.language_model.layers.3.self_attn.q_proj.weight',
     'language_model.layers.3.self_attn.qkv_proj.weight', 'q'),
    ('model.language_model.layers.0.self_attn.v_proj.bias',
     'language_model.layers.0.self_attn.qkv_proj.bias', 'v'),
    ('model.language_model.layers.1.mlp.up_proj.weight',
     'language_model.layers.1.mlp.gate_up_proj.weight', 1),
    ('model.language_model.layers.1.mlp.down_proj.weight',
     'language_model.layers.1.mlp.down_proj.weight', None),
    ('model.visual.blocks.0.attn.qkv.weight', 'visual.blocks.0.attn.qkv.weight', None),
])
def test_merged_projection_targets(key, target, shard):
    assert checkpoint_target(key) == (target, shard)


def test_the_model_declares_every_layer_it_holds_merged(tiny_ckpt):
    """``packed_modules_mapping`` (the loader reads it) names each merged layer of the model.

    Each checkpoint part's shard id is one of that layer's shards, in checkpoint order.
    """
    from orin_llm_node.layers import LinearBase
    from orin_llm_node.models import Qwen3VLForCausalLM

    mapping = Qwen3VLForCausalLM.packed_modules_mapping
    with torch.device('meta'):
        model = Qwen3VLForCausalLM(load_config(tiny_ckpt))
    merged = {name: m for name, m in model.named_modules()
              if isinstance(m, LinearBase) and len(m.shards) > 1}
    assert merged and {n.rpartition('.')[2] for n in merged} == {v[0] for v in mapping.values()}
    for name, layer in merged.items():
        parts = {hf: shard for hf, (ours, shard) in mapping.items()
                 if ours == name.rpartition('.')[2]}
        assert set(parts.values()) == set(layer.shards), name
        assert checkpoint_names(f'{name}.weight') == [
            f'{name.rpartition(".")[0]}.{hf}.weight' for hf in parts]


def test_merged_projections_hold_the_checkpoint_tensors_in_order(tiny_ckpt):
    """qkv_proj = [q; k; v] and gate_up_proj = [gate; up] along the output dim."""
    tensors = load_file(tiny_ckpt / 'model.safetensors')
    model = load_model(tiny_ckpt)
    layer = model.language_model.layers[1]
    pre = 'model.language_model.layers.1.'
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat(
        [tensors[pre + f'self_attn.{p}_proj.weight'] for p in 'qkv']))
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat(
        [tensors[pre + f'mlp.{p}_proj.weight'] for p in ('gate', 'up')]))


def test_misshapen_shard_is_reported(tiny_ckpt, tmp_path):
    tensors = load_file(tiny_ckpt / 'model.safetensors')
    key = 'model.language_model.layers.0.self_attn.k_proj.weight'
    bad = copy_without_weights(tiny_ckpt, tmp_path / 'kshape')
    save_file({**tensors, key: tensors[key][:-1]}, str(bad / 'model.safetensors'))
    msg = load_error(bad)
    assert key in msg and 'the config implies' in msg


def test_quantization_does_not_import_the_models_package():
    """Layering: models/ builds on quantization/, never the other way round.

    Both raise the ModelLoadError of orin_llm_node.errors.
    """
    code = ("import sys, orin_llm_node.quantization.checkpoint as c, orin_llm_node.errors as e;"
            " assert c.ModelLoadError is e.ModelLoadError; "
            "print(sorted(m for m in sys.modules if m.startswith('orin_llm_node.models')))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == '[]'
