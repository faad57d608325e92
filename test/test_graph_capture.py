# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""An empty CUDA-graph capture fails loudly, at capture time (engine/cuda_graph.py), on the CPU.

A capture on another device's stream records nothing while the step runs eagerly once, so the
graph's outputs hold right values until the first replay -- which does nothing: decode would
repeat one token and never write new KV. The capture code replays each new graph once over
poisoned outputs and raises unless the replay wrote them. The CPU stand-in for the capture
(test/cpu_graphs.py) has both behaviours, over the attention kernels on the CPU emulator (a
graph needs the graph-safe backend); the capture on the right device's stream itself needs
GPUs (test_cuda_graph.py: one GPU for a real empty graph, two for ``cuda:1``).
"""

from cpu_graphs import CpuGraphCapture
import kernel_emulator
import numpy as np
import pytest
import torch

from orin_llm_node.attention.cuda_backend import CudaPagedAttention
from orin_llm_node.engine.config import SamplingParams
from orin_llm_node.engine.cuda_graph import CudaGraphDecode, replay_writes
from orin_llm_node.engine.model_runner import ModelRunner
from orin_llm_node.engine.sampler import Sampler
from orin_llm_node.models.loader import load_model

CPU = torch.device('cpu')


@pytest.fixture(scope='module')
def model(tiny_ckpt):
    if not kernel_emulator.compiler_available():
        pytest.skip('g++ is needed to build the kernel emulator')
    return load_model(tiny_ckpt, dtype=torch.float32).eval()


def _runner(model, **kwargs):
    """A CPU runner whose attention runs the emulated kernels (graph-safe, as on a GPU)."""
    runner = ModelRunner(model, 8, 16, 128, CPU, torch.float32, **kwargs)
    tc = model.config.text
    runner.attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, 128,
                                     launch=kernel_emulator.emulated_launch('float32',
                                                                            tc.head_dim))
    runner.attn.warmup()
    return runner


def _prefilled(runner, prompt_len=20):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, runner.model.config.text.vocab_size, prompt_len).tolist()
    table = [5, 2, 7]
    runner.prefill(prompt, np.tile(np.arange(prompt_len), (3, 1)), table, 0)
    return prompt[-1], table, prompt_len + 1


@pytest.mark.parametrize('records', [True, False], ids=['recording', 'empty'])
def test_decode_capture_is_replayed_once_and_an_empty_one_raises(model, records):
    eager, runner = _runner(model), _runner(model)
    runner.decode_graph = CudaGraphDecode(runner)
    runner.decode_graph.capturer = capture = CpuGraphCapture(records)
    token, table, context = _prefilled(eager)
    _prefilled(runner)
    want = eager.decode(token, context - 1, table, context)
    if not records:
        with pytest.raises(RuntimeError, match='decode graph on cpu: the captured CUDA graph '
                                               'wrote nothing when replayed'):
            runner.decode(token, context - 1, table, context)
        return
    sampler = Sampler(SamplingParams(), CPU, set())
    got = runner.decode_sample(token, context - 1, table, context, sampler)
    assert capture.captures == 2 and got == int(want.argmax())
    torch.testing.assert_close(runner.decode_graph.logits, want, atol=1e-4, rtol=1e-4)


def test_the_samplers_greedy_rule_decides_where_the_token_is_picked(model):
    """The sampler's greedy rule (temperature 0) decides where the graph decode picks.

    Greedy picks inside the graph; otherwise the sampler draws from the graph's masked logits
    -- the same tokens as from the eager step.
    """
    eager, runner = _runner(model), _runner(model)
    runner.decode_graph = CudaGraphDecode(runner)
    runner.decode_graph.capturer = CpuGraphCapture()
    token, table, context = _prefilled(eager)
    _prefilled(runner)
    logits = eager.decode(token, context - 1, table, context)
    for params in (SamplingParams(), SamplingParams(temperature=0.9, seed=11),
                   SamplingParams(temperature=1e-30)):
        want, got = Sampler(params, CPU, {3}), Sampler(params, CPU, {3})
        assert got.greedy is (params.temperature == 0)
        assert runner.decode_sample(token, context - 1, table, context, got) == want(logits)
    assert runner.decode_graph.captures == 1


@pytest.mark.parametrize('records', [True, False], ids=['recording', 'empty'])
def test_prefill_capture_at_load_raises_on_an_empty_graph(model, records):
    runner = _runner(model, prefill_buckets=(16, 32))
    graphs = runner.prefill_graphs
    graphs.use_graphs = True
    graphs.capturer = CpuGraphCapture(records)
    if records:
        runner.capture_prefill_graphs()
        assert graphs.captures == 2
        assert all(graph.replays == 1 for graph, _, _ in graphs.graphs.values())
    else:
        with pytest.raises(RuntimeError, match='prefill graph of 16 tokens on cpu'):
            runner.capture_prefill_graphs()


def test_a_replay_that_leaves_one_output_unwritten_raises():
    logits, token = torch.zeros(8), torch.zeros(1, dtype=torch.long)

    class WritesLogitsOnly:
        def replay(self):
            logits.copy_(torch.arange(8.0))

    with pytest.raises(RuntimeError, match='^pick: '):
        replay_writes(WritesLogitsOnly(), (logits, token), 'pick')

    class WritesBoth(WritesLogitsOnly):
        def replay(self):
            super().replay()
            token.fill_(3)

    replay_writes(WritesBoth(), (logits, token), 'pick')
    assert int(token) == 3 and logits[7] == 7
