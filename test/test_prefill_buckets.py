# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Bucketed prefill (engine/prefill_graph.py) on the CPU: the padding logic of the CUDA graphs.

On a GPU a short text-only suffix replays a graph captured for its bucket; here the same padded
static buffers run eagerly through the torch backend (and through the emulated kernels), so the
padding itself is checked without a GPU: padding rows write no KV slot, do not change the real
rows, and greedy tokens stay those of transformers across block boundaries.

A note on exactness: CPU sgemm rounds a row differently depending on how many rows the matrix
has (small M takes another kernel, and threads split M), so padded and unpadded logits agree to
fp32 rounding, not bit for bit; greedy tokens and every KV slot outside the real ones are exact.
"""

import random

from _engine_reference import Reference
from cpu_graphs import CpuGraphCapture
import numpy as np
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.model_runner import ModelRunner
from orin_llm_node.engine.prefill_graph import PrefillGraphs
from orin_llm_node.models.loader import load_model

CPU = torch.device('cpu')


@pytest.fixture(scope='module')
def model(tiny_ckpt):
    return load_model(tiny_ckpt, dtype=torch.float32).eval()


def _runner(model, buckets, num_blocks=32, block_size=16):
    return ModelRunner(model, num_blocks, block_size, 512, CPU, torch.float32,
                       prefill_buckets=buckets)


@pytest.mark.parametrize('suffix', [1, 2, 5, 15, 16, 17, 31, 50, 64])
def test_padded_suffix_matches_unpadded(model, suffix):
    """A 37-token cached prefix (ends mid-block), then ``suffix`` new tokens padded to a bucket."""
    tc = model.config.text
    rng = random.Random(suffix)
    prompt = [rng.randrange(tc.vocab_size) for _ in range(37 + suffix)]
    pos = np.tile(np.arange(len(prompt)), (3, 1))
    table = rng.sample(range(32), 7)
    plain, padded = _runner(model, ()), _runner(model, (16, 32, 64))
    assert plain.prefill_graphs is None and padded.prefill_graphs.bucket(suffix) >= suffix
    outs = []
    for runner in (plain, padded):
        runner.prefill(prompt[:37], pos[:, :37], table, 0)  # longer than no bucket: eager
        before = runner.kv_cache.clone()
        outs.append((runner.prefill(prompt[37:], pos[:, 37:], table, 37), before))
    (want, before_plain), (got, before_padded) = outs
    assert torch.equal(before_plain, before_padded)
    assert int(got.argmax()) == int(want.argmax())
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    # Only the suffix's real slots changed, to the unpadded values up to fp32 rounding.
    t = np.arange(37, 37 + suffix)
    slots = torch.as_tensor(np.asarray(table)[t // 16] * 16 + t % 16)
    flat = [r.kv_cache.view(tc.num_hidden_layers, 2, -1, tc.num_key_value_heads, tc.head_dim)
            for r in (plain, padded)]
    untouched = torch.ones(flat[0].shape[2], dtype=torch.bool)
    untouched[slots] = False
    before = before_padded.view_as(flat[1])
    assert torch.equal(flat[1][:, :, untouched], before[:, :, untouched])
    assert torch.allclose(flat[1][:, :, slots], flat[0][:, :, slots], rtol=0, atol=1e-5)


def test_suffix_longer_than_every_bucket_runs_eagerly(model):
    runner = _runner(model, (16,))
    calls = []
    runner.prefill_graphs._forward = lambda size: calls.append(size)
    prompt = list(range(3, 3 + 17))
    runner.prefill(prompt, np.tile(np.arange(17), (3, 1)), [0, 1], 0)
    assert not calls and runner.prefill_graphs.bucket(17) is None
    with pytest.raises(ValueError, match='largest prefill bucket'):
        runner.prefill_graphs.run(prompt, np.zeros((3, 17), dtype=np.int64), [0, 1], 0)


def test_engine_follow_ups_through_buckets_match_transformers(tiny_ckpt):
    """Follow-ups of new lengths, each padded, crossing block boundaries: tokens == reference."""
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', block_size=4,
                                 num_kv_blocks=512, block_order_seed=3))
    graphs = eng.runner.prefill_graphs = PrefillGraphs(eng.runner, (8, 16, 32, 64))
    sizes = []
    run = graphs.run

    def spy(token_ids, *args):
        sizes.append((len(token_ids), graphs.bucket(len(token_ids))))
        return run(token_ids, *args)

    graphs.run = spy
    ref = Reference(tiny_ckpt)
    conv = eng.new_conversation('You are a robot.')
    questions = ['Hi.', 'Is the door open or closed right now?', 'Why?',
                 'Count the boxes on the left shelf and tell me which one is the largest.']
    for q in questions:
        res = eng.chat(conv, q, sampling=SamplingParams(max_tokens=7, ignore_eos=True))
        assert res.token_ids == ref.generate(res.prompt_token_ids, [], 7, ignore_eos=True)
    # The first turn (system prompt + question) may run eagerly; follow-ups all padded.
    assert len(sizes) >= len(questions) - 1
    assert all(n <= bucket for n, bucket in sizes), sizes


def test_prefill_graph_bookkeeping_with_emulated_kernels(model):
    """PrefillGraphs with the emulated CUDA kernels and a stand-in for its capture.

    One capture per bucket at load; later prompts of new lengths and prefixes only rewrite
    buffer contents (no re-capture) and track the torch backend; a new backend re-captures.
    """
    kernel_emulator = pytest.importorskip('kernel_emulator')
    if not kernel_emulator.compiler_available():
        pytest.skip('g++ is needed to build the emulator')
    from orin_llm_node.attention.cuda_backend import CudaPagedAttention

    tc = model.config.text
    launch = kernel_emulator.emulated_launch('float32', tc.head_dim)
    ref = _runner(model, ())
    runner = _runner(model, ())

    def kernels():
        attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, 512, launch=launch)
        attn.warmup()
        return attn

    runner.attn = kernels()
    graphs = runner.prefill_graphs = PrefillGraphs(runner, (16, 32))
    graphs.use_graphs = True
    graphs.capturer = CpuGraphCapture()
    runner.capture_prefill_graphs()
    assert graphs.captures == 2
    rng = random.Random(5)
    table = rng.sample(range(32), 8)
    prompt = [rng.randrange(tc.vocab_size) for _ in range(120)]
    pos = np.tile(np.arange(120), (3, 1))
    done = 0
    for n in (40, 7, 13, 30, 3):  # 40: eager; then padded to 16, 16, 32, 16
        want = ref.prefill(prompt[done:done + n], pos[:, done:done + n], table, done)
        got = runner.prefill(prompt[done:done + n], pos[:, done:done + n], table, done)
        assert (want - got).abs().max().item() < 1e-4, n
        assert int(want.argmax()) == int(got.argmax())
        done += n
    assert graphs.captures == 2
    runner.attn = kernels()  # new workspace pointers: the graph must be re-captured
    runner.prefill(prompt[done:done + 5], pos[:, done:done + 5], table, done)
    assert graphs.captures == 3
