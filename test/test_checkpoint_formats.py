# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Quantized checkpoint formats describe themselves: a new one is one class, no other edit.

The test's own format (INT8 codes as ``weight`` plus a per-row ``weight_scale``) is declared
by a ``quant_method`` of its own; the loader plans, collects and loads it through the format's
``layers`` / ``tensors`` / ``load`` alone, and the model holds exactly its codes and scales.
"""

import json
from pathlib import Path
import shutil

import pytest
from safetensors.torch import load_file, save_file
import torch

from orin_llm_node.models import load_model
from orin_llm_node.models.loader import checkpoint_target
from orin_llm_node.quantization import AT_LOAD_FORMATS, Int8Linear
from orin_llm_node.quantization.checkpoint import plan_quantization
from orin_llm_node.quantization.checkpoint_formats import (
    AT_LOAD,
    DECLARED,
    CheckpointFormat,
    LayerQuant,
)


class RowScaledInt8(CheckpointFormat):
    """int8 ``weight`` codes and a float ``weight_scale [out, 1]``: ``w = q * s``."""

    name = 'row-int8'

    def tensors(self, asymmetric):
        return frozenset({'weight', 'weight_scale'})

    def load(self, tensors, layer, row0):
        return layer.load_rows({'qweight': tensors['weight'], 'scale': tensors['weight_scale']},
                               row0)

    def layers(self, model_dir, qc, keys, linears):
        lq = LayerQuant(Int8Linear, None, False, self)
        return {k.removesuffix('.weight_scale'): lq for k in keys if k.endswith('.weight_scale')}


def _row_int8_checkpoint(src, dst):
    """``src`` with its decoder projections stored as :class:`RowScaledInt8`; the dense values."""
    shutil.copytree(src, dst)
    tensors, dense = load_file(str(src / 'model.safetensors')), {}
    for name, w in list(tensors.items()):
        if '.language_model.layers.' in name and name.endswith('_proj.weight'):
            scale = w.float().abs().amax(dim=1, keepdim=True) / 127
            codes = torch.round(w.float() / scale).clamp(-127, 127).to(torch.int8)
            tensors[name] = codes
            tensors[name.replace('.weight', '.weight_scale')] = scale
            dense[name] = codes.float() * scale
    save_file(tensors, str(dst / 'model.safetensors'))
    cfg = json.loads((src / 'config.json').read_text())
    cfg['quantization_config'] = {'quant_method': RowScaledInt8.name}
    (dst / 'config.json').write_text(json.dumps(cfg))
    return dense


@pytest.fixture(scope='module')
def row_int8(tiny_ckpt, tmp_path_factory):
    """(the checkpoint, its dense values): read-only, one for the module."""
    ckpt = tmp_path_factory.mktemp('row_int8') / 'ckpt'
    return ckpt, _row_int8_checkpoint(tiny_ckpt, ckpt)


def test_a_new_format_is_one_class(row_int8, monkeypatch):
    ckpt, dense = row_int8
    monkeypatch.setitem(DECLARED, RowScaledInt8.name, RowScaledInt8())
    model = load_model(ckpt)
    assert model.weight_format == 'row-int8:int8'
    assert dense
    for name, want in dense.items():
        target, shard = checkpoint_target(name)
        layer = model.get_submodule(target.rpartition('.')[0])
        got = layer.quant.dequantize()
        assert torch.equal(got if shard is None else layer.shard(got, shard), want), name


def test_an_undeclared_format_is_one_sentence(row_int8):
    from orin_llm_node.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="quant_method='row-int8'.*unknown method"):
        load_model(row_int8[0])


@pytest.mark.parametrize('quantization', sorted(AT_LOAD_FORMATS))
def test_quantize_at_load_takes_the_layer_classs_group(quantization):
    cls, asymmetric = AT_LOAD_FORMATS[quantization]
    linears = {'model.language_model.layers.0.mlp.up_proj': 'language_model.layers.0.mlp.up_proj'}
    plan = plan_quantization(Path('ckpt'), None, [], linears, quantization)
    (lq,) = plan.layers.values()
    assert (lq.cls, lq.group_size, lq.asymmetric, lq.storage) == (
        cls, cls.at_load_group, asymmetric, AT_LOAD)
    assert lq.tensors == {'weight'}
    assert plan.description == f'at-load:{quantization}'
