# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The torch attention path on a torch whose SDPA has no ``enable_gqa`` (before 2.5).

JetPack 6.0 ships torch 2.3. The torch here has the keyword, so the old signature is stood
in for where ``attention.base`` calls SDPA: a wrapper that raises the ``TypeError`` older
torch raises for the keyword and hands every other call to the real SDPA. On it the feature
check must say no, attention must equal the ``enable_gqa`` path bit for bit, and the engine
must keep greedy parity with transformers (which runs on the real, unwrapped torch).
"""

from types import SimpleNamespace

from _engine_reference import Reference, random_image
import pytest
import torch
import torch.nn.functional as F

from orin_llm_node.attention import base
from orin_llm_node.attention.base import causal_attention
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams


def _old_sdpa(monkeypatch):
    # What attention.base sees: SDPA without enable_gqa, and its import-time answer to that.
    monkeypatch.setattr(base, 'F',
                        SimpleNamespace(scaled_dot_product_attention=_without_enable_gqa))
    monkeypatch.setattr(base, 'SDPA_ENABLE_GQA', False, raising=False)


def _without_enable_gqa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                        scale=None, **unknown):
    if unknown:
        raise TypeError("scaled_dot_product_attention() got an unexpected keyword argument "
                        f"'{next(iter(unknown))}'")
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                          dropout_p=dropout_p, is_causal=is_causal, scale=scale)


def test_the_feature_is_asked_of_the_function(monkeypatch):
    assert base.sdpa_takes_enable_gqa()  # this torch (>= 2.5) has it
    _old_sdpa(monkeypatch)
    assert not base.sdpa_takes_enable_gqa()


def _qkv(n, prefix, hq, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    k, v = (torch.randn(prefix + n, hkv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16],
                         ids=['fp32', 'bf16', 'fp16'])
@pytest.mark.parametrize('n, prefix', [(37, 0), (29, 40), (1, 50), (2, 1)])
@pytest.mark.parametrize('hq, hkv', [(16, 8), (32, 8), (4, 4)], ids=['gqa2', 'gqa4', 'mha'])
def test_expanded_heads_equal_enable_gqa_bit_for_bit(monkeypatch, dtype, n, prefix, hq, hkv):
    q, k, v = _qkv(n, prefix, hq, hkv, 64, dtype, seed=n * 131 + prefix)
    want = causal_attention(q, k, v, prefix)  # this torch: enable_gqa inside SDPA
    _old_sdpa(monkeypatch)
    got = causal_attention(q, k, v, prefix)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(got, want)


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


@pytest.mark.parametrize('block_size', [16, 4])
def test_engine_keeps_greedy_parity_with_transformers(monkeypatch, tiny_ckpt, ref, block_size):
    """Multi-token prefills (no prefix, then after a cached prefix), an image, decode."""
    _old_sdpa(monkeypatch)
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', block_size=block_size,
                                 num_kv_blocks=2048 // block_size, attention_backend='torch',
                                 block_order_seed=5 + block_size))
    assert eng.model.config.text.num_attention_heads != eng.model.config.text.num_key_value_heads
    conv = eng.new_conversation('You are a robot. Answer briefly.')
    turns = [('What is in front of you?', [random_image(21, 96, 128)]),
             ('And what colour is it?', [])]
    for text, images in turns:
        res = eng.chat(conv, text, images, SamplingParams(max_tokens=20, ignore_eos=True))
        assert res.finish_reason == 'length'
        expected = ref.generate(res.prompt_token_ids, res.prompt_images, 20, True)
        assert res.token_ids == expected
    assert res.cached_tokens > 0  # the second prefill ran after a cached prefix
    eng.reset()
