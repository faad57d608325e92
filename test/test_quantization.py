# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Weight-only INT8 / INT4 / FP8: formats, quantize-at-load, and checkpoints made elsewhere.

The references are independent of our code: compressed-tensors packs and quantizes the INT
checkpoints and transformers 5.23 loads them (decompressed to dense fp32) as the reference
model; the FP8 checkpoint is dequantised by integer bit arithmetic written in the test. Our
logits must equal the reference's to fp32 rounding (the same 1e-4 as the float parity tests).
"""

import json
from pathlib import Path

from _model_reference import LOGIT_TOL, build_prompt, our_logits, reference_logits
from _quantized_checkpoints import (
    compressed_tensors_checkpoint,
    e4m3_to_float,
    fp8_checkpoint,
    load_ct_reference,
)
import pytest
import torch

from orin_llm_node.errors import ModelLoadError
from orin_llm_node.models import load_model
from orin_llm_node.models.loader import checkpoint_target, checkpoint_view
from orin_llm_node.quantization import Fp8Linear, Int4Linear, Int8Linear, QuantLinear
from orin_llm_node.quantization.checkpoint_formats import _unpack_dense
from orin_llm_node.quantization.int4 import pack_int4, unpack_int4

transformers = pytest.importorskip('transformers')
ct = pytest.importorskip('compressed_tensors')

# Quantized modules per decoder layer: qkv_proj, o_proj, gate_up_proj, down_proj.
PROJECTIONS = 4
PROMPTS = [
    [([], 'Is the path clear? Answer briefly.', None)],
    [([(96, 160)], 'What is in front of you?', None)],
]


# ------------------------------------------------------------------------------ formats

def test_int4_packing_is_compressed_tensors_layout():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    g = torch.Generator().manual_seed(0)
    for cols in (64, 200, 8):
        q = torch.randint(-8, 8, (5, cols), generator=g, dtype=torch.int8)
        theirs = pack_to_int32(q, 4)
        assert torch.equal(pack_int4(q.to(torch.int32) + 8), theirs)
        assert torch.equal(unpack_int4(theirs, cols).to(torch.int32) - 8, q.to(torch.int32))
        q8 = torch.randint(-128, 128, (5, cols), generator=g, dtype=torch.int8)
        assert torch.equal(_unpack_dense(pack_to_int32(q8, 8), 8, cols).to(torch.int32) - 128,
                           q8.to(torch.int32))


@pytest.mark.parametrize('cls,asym', [(Int8Linear, False), (Int4Linear, False),
                                      (Int4Linear, True)])
@pytest.mark.parametrize('cols', [64, 200, 384])
def test_round_to_nearest_error_bound(cls, asym, cols):
    """Every dequantised weight is within half a step of the float weight.

    Groups of 128, a shorter last group when 128 does not divide the columns.
    """
    w = torch.randn(96, cols, generator=torch.Generator().manual_seed(cols))
    layer = cls(cols, 96, group_size=128, asymmetric=asym)
    layer.quantize_from(w[:40])
    layer.quantize_from(w[40:], row0=40)
    assert layer.num_groups == -(-cols // min(128, cols))
    step = layer.scale.repeat_interleave(layer.group_size, 1)[:, :cols]
    err = (layer.dequantize() - w).abs()
    assert (err <= step / 2 + 1e-6).all()
    # The scale is not trivially large: the codes use (nearly) the whole range.
    levels = 255 if cls is Int8Linear else 15
    assert ((w.abs().amax() / step.amin()) > levels / 2 - 1).item()


def test_fp8_quantize_and_independent_decode():
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(1))
    layer = Fp8Linear(200, 300)
    layer.quantize_from(w)
    assert layer.scale.shape == (300, 2)
    # Rows 0..127 share a 128x128 block's scale.
    assert torch.equal(layer.scale[0], layer.scale[127])
    ours = layer.dequantize()
    theirs = e4m3_to_float(layer.qweight) * layer.scale.repeat_interleave(128, 1)[:, :200]
    assert torch.equal(ours, theirs)
    rel = ((ours - w).abs() / w.abs().clamp(min=1e-3)).median()
    assert rel < 1 / 16


def test_forward_is_dequantise_then_matmul():
    layer = Int4Linear(64, 32, group_size=32, bias=True)
    layer.quantize_from(torch.randn(32, 64))
    layer.bias.data.normal_()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x, layer.dequantize(torch.bfloat16),
                                      layer.bias.to(torch.bfloat16))
    assert torch.equal(layer(x), want)
    assert layer(x).dtype == torch.bfloat16


# ------------------------------------------------------------------- compressed-tensors

CT_SCHEMES = {
    'w4a16-g32-sym': dict(bits=4, strategy='group', group_size=32, symmetric=True),
    'w4a16-g32-asym': dict(bits=4, strategy='group', group_size=32, symmetric=False),
    'w8a16-channel': dict(bits=8, strategy='channel', symmetric=True),
    'w4a16-channel-asym': dict(bits=4, strategy='channel', symmetric=False),
}
_made: dict = {}


def quantized_layers(model) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def dequantized_view(model, ckpt_name: str) -> torch.Tensor:
    """The dense rows our model holds for a checkpoint weight (merged layers: its shard)."""
    target, shard_id = checkpoint_target(ckpt_name)
    layer = model.get_submodule(target.rpartition('.')[0])
    w = layer.quant.dequantize()
    return w if shard_id is None else layer.shard(w, shard_id)


def ct_ckpt(tiny_ckpt, ckpt_root, name) -> Path:
    if name not in _made:
        _made[name] = compressed_tensors_checkpoint(tiny_ckpt, ckpt_root / f'ct-{name}',
                                                    **CT_SCHEMES[name])
    return _made[name]


@pytest.mark.parametrize('name', list(CT_SCHEMES))
def test_compressed_tensors_logits_equal_reference(tiny_ckpt, ckpt_root, name):
    ckpt = ct_ckpt(tiny_ckpt, ckpt_root, name)
    qc = json.loads((ckpt / 'config.json').read_text())['quantization_config']
    assert qc['format'] == 'pack-quantized'
    model = load_model(ckpt)
    scheme = CT_SCHEMES[name]
    cls = Int4Linear if scheme['bits'] == 4 else Int8Linear
    layers = quantized_layers(model)
    assert len(layers) == PROJECTIONS * model.config.text.num_hidden_layers
    assert all(type(m) is cls and m.asymmetric != scheme['symmetric'] for m in layers.values())
    assert all(n.startswith('language_model.layers.') for n in layers)  # visual, lm_head ignored
    ref = load_ct_reference(ckpt)
    # The reference really is quantized: its weights differ from the float checkpoint's...
    dense = load_model(tiny_ckpt)
    for part in ('self_attn.k_proj', 'mlp.up_proj', 'mlp.down_proj'):
        tensor = f'model.language_model.layers.1.{part}.weight'
        ref_w = ref.get_parameter(tensor)
        assert not torch.equal(ref_w, checkpoint_view(dense, tensor))
        # ... and ours, dequantised, are the same numbers.
        assert torch.equal(dequantized_view(model, tensor), ref_w)
    for turns in PROMPTS:
        p = build_prompt(tiny_ckpt, turns)
        want = reference_logits(ref, p, model.config.image_token_id)
        got = our_logits(model, p)
        diff = (got - want).abs().max().item()
        print(f'{name}: logits max|diff| {diff:.3g}')
        assert diff <= LOGIT_TOL
        assert (got - our_logits(dense, p)).abs().max() > 100 * LOGIT_TOL  # not the float model


def test_compressed_tensors_ignore_list_is_checked(tiny_ckpt, ckpt_root, tmp_path):
    src = ct_ckpt(tiny_ckpt, ckpt_root, 'w4a16-g32-sym')
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / 'config.json').read_text())
    cfg['quantization_config']['ignore'].append('model.language_model.layers.1.mlp.up_proj')
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match='disagree'):
        load_model(tmp_path)


@pytest.mark.parametrize('change,match', [
    ({'quant_method': 'awq'}, 'not supported'),
    ({'format': 'float-quantized'}, 'not supported'),
    ({'config_groups': {'group_0': {'targets': ['Linear'], 'weights': {
        'num_bits': 4, 'type': 'int', 'strategy': 'group', 'group_size': 32},
        'input_activations': {'num_bits': 8, 'type': 'int'}}}}, 'activations'),
])
def test_unsupported_quantization_is_one_sentence(tiny_ckpt, ckpt_root, tmp_path, change,
                                                  match):
    src = ct_ckpt(tiny_ckpt, ckpt_root, 'w4a16-g32-sym')
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / 'config.json').read_text())
    cfg['quantization_config'].update(change)
    if 'config_groups' not in change:
        for g in cfg['quantization_config']['config_groups'].values():
            g.pop('format', None)
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=match) as info:
        load_model(tmp_path)
    msg = str(info.value)
    assert '\n' not in msg and 'supported:' in msg


def test_quantize_at_load_refuses_quantized_checkpoint(tiny_ckpt, ckpt_root):
    with pytest.raises(ModelLoadError, match='already quantized'):
        load_model(ct_ckpt(tiny_ckpt, ckpt_root, 'w4a16-g32-sym'), quantization='int8')


# ----------------------------------------------------------------------------------- FP8

@pytest.mark.parametrize('scale_dtype', [torch.float32, torch.bfloat16])
def test_fp8_checkpoint_equals_independent_dequantisation(make_ckpt, tmp_path, scale_dtype):
    """Hidden 256 / MLP 384: several 128x128 blocks per matrix, partial ones in k/v."""
    src = make_ckpt('fp8-src', text_config={'hidden_size': 256, 'intermediate_size': 384,
                                            'num_attention_heads': 4, 'num_key_value_heads': 1,
                                            'head_dim': 32})
    ckpt, dense = fp8_checkpoint(src, tmp_path / 'fp8', scale_dtype)
    model = load_model(ckpt)
    assert model.weight_format == 'fp8:fp8'
    layers = quantized_layers(model)
    assert len(layers) == PROJECTIONS * model.config.text.num_hidden_layers
    assert all(isinstance(m, Fp8Linear) for m in layers.values())
    for name, w in dense.items():
        assert torch.equal(dequantized_view(model, name), w), name
    ref = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        src, dtype=torch.float32).eval()
    state = ref.state_dict()
    for name, w in dense.items():
        state[name].copy_(w)
    for turns in PROMPTS:
        p = build_prompt(src, turns)
        want = reference_logits(ref, p, model.config.image_token_id)
        diff = (our_logits(model, p) - want).abs().max().item()
        print(f'fp8 (scales {scale_dtype}): logits max|diff| {diff:.3g}')
        assert diff <= LOGIT_TOL


def test_fp8_block_grid_is_checked(make_ckpt, tmp_path):
    ckpt, _ = fp8_checkpoint(make_ckpt('default'), tmp_path / 'fp8')
    cfg = json.loads((ckpt / 'config.json').read_text())
    cfg['quantization_config']['weight_block_size'] = [64, 64]
    (ckpt / 'config.json').write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r'weight_block_size'):
        load_model(ckpt)


# ------------------------------------------------------------------------ quantize at load

@pytest.mark.parametrize('quantization,cls', [('int8', Int8Linear), ('int4', Int4Linear),
                                              ('int4_asym', Int4Linear), ('fp8', Fp8Linear)])
def test_quantize_at_load(tiny_ckpt, quantization, cls):
    dense = load_model(tiny_ckpt)
    model = load_model(tiny_ckpt, quantization=quantization)
    assert model.weight_format == f'at-load:{quantization}'
    layers = quantized_layers(model)
    assert len(layers) == PROJECTIONS * model.config.text.num_hidden_layers
    assert all(type(m) is cls and n.startswith('language_model.layers.')
               for n, m in layers.items())
    for name, layer in layers.items():
        owner = model.get_submodule(name.rpartition('.')[0])
        w = dense.get_submodule(name.rpartition('.')[0]).weight
        again = cls(layer.in_features, layer.out_features, group_size=layer.group_size,
                    asymmetric=layer.asymmetric)
        for offset, size in owner.shards.values():  # each checkpoint part on its own rows
            again.quantize_from(w[offset:offset + size], offset)
        # Loaded on the CPU: the codes moved to the CPU layout (cpu_layout.py) as they loaded.
        assert layer.qweight is None and layer.cpu_codes is not None
        again.use_cpu_layout()
        assert torch.equal(again.cpu_codes, layer.cpu_codes)  # deterministic round-to-nearest
        rel = (layer.dequantize() - w).norm() / w.norm()
        assert rel < {'int8': 0.01, 'fp8': 0.04}.get(quantization, 0.15)


def test_engine_quantization_option(tiny_ckpt):
    from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams

    with pytest.raises(ValueError, match='quantization'):
        EngineConfig(model_path=tiny_ckpt, quantization='int3')
    engines = {q: LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', quantization=q,
                                         block_order_seed=3))
               for q in ('none', 'int8', 'int4')}
    assert engines['none'].weight_format == 'float32'
    assert engines['int4'].weight_format == 'at-load:int4'
    sizes = {q: e.weight_bytes for q, e in engines.items()}
    assert sizes['int4'] < sizes['int8'] < sizes['none']
    # The decoder projections shrink 8x (fp32 -> int4 + fp32 scales per 64 columns).
    tc = engines['none'].model.config.text
    proj = tc.num_hidden_layers * (tc.hidden_size * (tc.num_attention_heads
                                                     + 2 * tc.num_key_value_heads) * tc.head_dim
                                   + tc.hidden_size * tc.num_attention_heads * tc.head_dim
                                   + 3 * tc.hidden_size * tc.intermediate_size)
    assert sizes['none'] - sizes['int4'] > 0.8 * proj * 4
    for q, eng in engines.items():
        res = eng.chat(eng.new_conversation(), 'Is the path clear?',
                       sampling=SamplingParams(max_tokens=20, ignore_eos=True))
        assert len(res.token_ids) == 20, q
