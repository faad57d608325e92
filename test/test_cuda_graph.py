# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""CUDA Graph decode on a GPU (marker ``gpu``): graph == eager == transformers.

* graph decode == eager decode (``enable_cuda_graph=False``) token for token over 200 tokens
  (``ignore_eos``, block size 16, permuted free queue), fp32 and bf16;
* fp32 (TF32 off): each of our greedy tokens is transformers 5.23.0's choice given the same
  history, up to a near-tie of ``check.FP32_NEAR_TIE`` (teacher-forced: GPU and CPU round
  differently, and a cached, padded follow-up is not the reference's whole-prompt prefill);
* bf16: the reference drifts from itself after a few dozen tokens, so the check is
  teacher-forced: per-step logits of our bf16 graph decode against transformers fp32 on the
  same tokens must stay within twice the error of transformers' own bf16 run (+0.02);
* replay after a conversation reset (no re-capture), a prefix-cache turn under graphs;
* constrained decoding (a new grammar mask every step, in the pick graph) == eager;
* a capture that records nothing raises at capture time; on two GPUs, ``cuda:1`` graphs are
  captured on device 1 while device 0 is current (and after a capture on device 0).

Graph and eager engines run every step at the same row count: the eager engine gets the graph
engine's prefill buckets and runs short follow-ups padded, eagerly (``eager_like``). cuBLAS
does not promise identical rows for different row counts, so an unpadded eager prefill could
differ from a padded graph one in the last bits and flip a later token; at equal shapes graph
and eager run the same kernels and must agree token for token.

Skips without CUDA or CuPy.
"""

from collections import Counter
import copy

from _kernel_testing import assert_reference_greedy, eager_like, skip_without_cuda_kernels
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
skip_without_cuda_kernels()

from _engine_reference import Reference, random_image  # noqa: E402

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from orin_llm_node.engine.sampler import Sampler  # noqa: E402

MAX_TOKENS = 200


@pytest.fixture(autouse=True, scope='module')
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def make_engine(ckpt, dtype, graph, seed=11):
    engine = LLMEngine(EngineConfig(
        model_path=ckpt, device='cuda', dtype=dtype, block_size=16, num_kv_blocks=256,
        max_model_len=2048, enable_cuda_graph=graph, block_order_seed=seed,
    ))
    return engine if graph else eager_like(engine)


@pytest.fixture(scope='module', params=['float32', 'bfloat16'])
def engines(request, tiny_ckpt):
    graph = make_engine(tiny_ckpt, request.param, True)
    eager = make_engine(tiny_ckpt, request.param, False)
    assert graph.runner.decode_graph is not None and eager.runner.decode_graph is None
    yield request.param, graph, eager
    graph.reset()
    eager.reset()


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def chat(engine, conv, text, images=(), max_tokens=MAX_TOKENS):
    return engine.chat(conv, text, images=list(images),
                       sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def test_graph_equals_eager_200_tokens(engines, ref):
    dtype, graph, eager = engines
    img = random_image(21, 96, 128)
    results = []
    for eng in (graph, eager):
        conv = eng.new_conversation('You are a robot.')
        results.append(chat(eng, conv, 'Describe what you see, in detail.', [img]))
        assert conv.block_table != sorted(conv.block_table)  # permuted free queue
        eng.reset(conv)
    res_graph, res_eager = results
    assert len(res_graph.token_ids) == MAX_TOKENS and res_graph.finish_reason == 'length'
    assert res_graph.token_ids == res_eager.token_ids
    assert len(set(res_graph.token_ids)) >= 8  # not a degenerate repetition
    assert graph.runner.decode_graph.captures == 1
    if dtype == 'float32':
        assert_reference_greedy(ref, res_graph)


def test_replay_after_reset_and_prefix_cache_turn(engines, ref):
    dtype, graph, eager = engines
    img = random_image(22, 80, 80)
    turns = [('What is on the table?', [img]), ('And behind it?', [])]
    per_engine = []
    for eng in (graph, eager):
        conv = eng.new_conversation('You are a robot.')
        per_engine.append([chat(eng, conv, text, imgs, max_tokens=40) for text, imgs in turns])
        eng.reset(conv)
    for res_graph, res_eager in zip(*per_engine, strict=True):
        assert res_graph.token_ids == res_eager.token_ids
    assert per_engine[0][1].cached_tokens > 0  # the second turn hit the prefix cache
    # Reset changes buffer contents, not pointers: still the first capture.
    assert graph.runner.decode_graph.captures == 1
    if dtype == 'float32':
        for res in per_engine[0]:
            assert_reference_greedy(ref, res)


def _hf(ckpt, dtype):
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, dtype=dtype, local_files_only=True).to('cuda').eval()


@torch.inference_mode()
def test_bf16_teacher_forced_logits(tiny_ckpt):
    hf32, hf16 = _hf(tiny_ckpt, torch.float32), _hf(tiny_ckpt, torch.bfloat16)
    eng = make_engine(tiny_ckpt, 'bfloat16', True)
    prompt = eng.tokenizer.encode('Tell me a long story about a robot and a shelf.')
    ids = torch.tensor([prompt], device='cuda')
    config = copy.deepcopy(hf32.generation_config)
    config.do_sample, config.max_new_tokens, config.eos_token_id = False, 64, None
    gen = hf32.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                        generation_config=config)[0, len(prompt):].tolist()
    full = torch.tensor([prompt + gen], device='cuda')
    steps = slice(len(prompt) - 1, len(prompt) + len(gen) - 1)
    want = hf32(input_ids=full).logits[0, steps].float()
    ref16 = hf16(input_ids=full).logits[0, steps].float()

    runner = eng.runner
    n_blocks = -(-(len(prompt) + len(gen)) // runner.block_size)
    table = np.random.default_rng(0).permutation(runner.num_blocks)[:n_blocks].tolist()
    pos = np.tile(np.arange(len(prompt)), (3, 1))
    ours = [runner.prefill(prompt, pos, table, 0)]
    for i, tok in enumerate(gen[:-1]):
        context = len(prompt) + i + 1
        ours.append(runner.decode(tok, context - 1, table, context))
    ours = torch.stack(ours).float()
    err_ours = (ours - want).abs().amax(-1)
    err_ref = (ref16 - want).abs().amax(-1)
    assert runner.decode_graph.captures == 1
    assert err_ours.mean() <= 2 * err_ref.mean() + 0.02, (err_ours, err_ref)
    assert err_ours.max() <= 3 * err_ref.max() + 0.02, (err_ours, err_ref)


def test_sampled_decode_through_the_graph_equals_eager(engines):
    """Temperature > 0: the graph hands its logits to the seeded sampler, like eager."""
    _, graph, eager = engines
    sampling = SamplingParams(max_tokens=60, temperature=0.8, top_k=20, seed=5,
                              ignore_eos=True)
    tokens = []
    for eng in (graph, eager):
        conv = eng.new_conversation()
        tokens.append(eng.chat(conv, 'Say something.', sampling=sampling).token_ids)
        eng.reset(conv)
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize('temperature', [0.0, 0.9])
def test_constrained_decode_through_the_graph_equals_eager(engines, temperature):
    """A grammar's mask, new every step, is applied inside the pick graph: eager's tokens.

    Two schemas in a row (and a regex): one capture for all of them.
    """
    pytest.importorskip('llguidance')
    _, graph, eager = engines
    robot = {'type': 'object', 'properties': {
        'colour': {'enum': ['red', 'green', 'blue']}, 'count': {'type': 'integer'},
        'items': {'type': 'array', 'items': {'type': 'string'}, 'maxItems': 4}},
        'required': ['colour', 'count', 'items'], 'additionalProperties': False}
    formats = [{'type': 'json_schema', 'schema': robot}, {'type': 'json_object'},
               {'type': 'regex', 'pattern': r'(left|right), [0-9]{1,3} cm'}]
    for fmt in formats:
        sampling = SamplingParams(max_tokens=60, temperature=temperature, seed=3,
                                  response_format=fmt)
        results = []
        for eng in (graph, eager):
            conv = eng.new_conversation('You are a robot.')
            results.append(eng.chat(conv, 'Where is the box?', sampling=sampling))
            eng.reset(conv)
        assert results[0].token_ids == results[1].token_ids, fmt
        assert results[0].valid == results[1].valid
        assert results[0].finish_reason in ('stop', 'length')
    assert graph.runner.decode_graph.captures == 1


def _prefilled(engine, prompt_len: int = 40):
    """Prefill a random prompt straight through the runner; (last token, table, context).

    The blocks it writes may hold the engine's prefix cache: that cache is dropped first.
    """
    engine.pool.clear_cache()
    runner = engine.runner
    rng = np.random.default_rng(3)
    vocab = runner.model.config.text.vocab_size
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    table = rng.permutation(runner.num_blocks)[:8].tolist()
    runner.prefill(prompt, np.tile(np.arange(prompt_len), (3, 1)), table, 0)
    return prompt[-1], table, prompt_len + 1


def test_greedy_graph_step_masks_banned_ids(engines):
    """The in-graph argmax never returns a banned id, even when it has the largest logit."""
    _, graph, _ = engines
    runner = graph.runner
    token, table, context = _prefilled(graph)
    logits = runner.decode(token, context - 1, table, context)
    top = int(logits.argmax())

    greedy = Sampler(SamplingParams(), torch.device('cuda'), {top})
    got = runner.decode_sample(token, context - 1, table, context, greedy)
    assert got != top
    assert got == int(logits.index_fill(0, greedy.banned, float('-inf')).argmax())


def test_decode_step_kernel_count(engines):
    """At most 12 kernels per layer plus a constant (the fused step; 58 per layer before)."""
    from torch.profiler import ProfilerActivity, profile

    _, graph, _ = engines
    runner = graph.runner
    token, table, context = _prefilled(graph)
    runner.prepare_decode(token, context - 1, table, context)
    # The body as the graph captures it: inside the runner's fused-ops scope (a runner
    # installs its fused ops around its own steps only; outside it the torch bodies run).
    with runner.fused_ops_installed():
        runner._decode_graph_body()  # warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner._decode_graph_body()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    layers = graph.model.config.text.num_hidden_layers
    names = Counter(e.name.split('<')[0][:60] for e in kernels).most_common()
    assert len(kernels) <= 12 * layers + 16, (len(kernels), names)


def test_a_capture_that_records_nothing_raises():
    """A real empty graph: the capture's body launches nothing, its output was written before."""
    from orin_llm_node.engine.cuda_graph import GraphCapture, replay_writes

    out = torch.arange(4.0, device='cuda')
    graph, same = GraphCapture(torch.device('cuda', 0)).capture(lambda: out)
    assert same is out
    with pytest.raises(RuntimeError, match='wrote nothing when replayed'):
        replay_writes(graph, (out,), 'empty')


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs two CUDA GPUs')
def test_cuda_1_graphs_equal_eager_while_device_0_is_current(tiny_ckpt):
    """``device: cuda:1``: graphs captured on device 1's stream, not on the current device 0.

    A graph captured on device 0 first makes torch's process-wide default capture stream a
    device-0 stream, the trap for any later capture of device-1 work.
    """
    torch.cuda.set_device(0)
    warm = torch.zeros(1, device='cuda:0')
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        warm += 1
    results = []
    for use_graph in (True, False):
        engine = LLMEngine(EngineConfig(
            model_path=tiny_ckpt, device='cuda:1', dtype='bfloat16', block_size=16,
            num_kv_blocks=64, max_model_len=1024, enable_cuda_graph=use_graph,
            block_order_seed=4))
        if use_graph:
            engine.warmup()  # captures the prefill buckets
        else:
            eager_like(engine)
        conv = engine.new_conversation('You are a robot.')
        # The follow-up is a short text prefill: a prefill graph replay (padded eagerly).
        results.append([chat(engine, conv, text, max_tokens=50).token_ids
                        for text in ('Count the boxes.', 'And the shelves?')])
        assert engine.uses_cuda_graph == use_graph
        assert torch.cuda.current_device() == 0
        if use_graph:
            assert engine.runner.decode_graph.captures == 1
            assert engine.runner.prefill_graphs.captures == len(engine.runner.prefill_graphs
                                                                .buckets)
    assert results[0] == results[1]
    assert all(len(set(tokens)) >= 8 for tokens in results[0])  # not one token repeated


def test_warmup_captures_the_decode_graph_and_leaves_no_trace(tiny_ckpt):
    """The warm-up's throw-away turn captures the decode graph before any prompt."""
    with LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cuda', dtype='bfloat16',
                                num_kv_blocks=64, max_model_len=1024,
                                block_order_seed=6)) as engine:
        before = engine.stats()
        engine.warmup([(96, 96)])
        assert engine.runner.decode_graph.captures == 1
        assert engine.stats() == before
        chat(engine, engine.new_conversation(), 'Count the boxes.', max_tokens=20)
        assert engine.runner.decode_graph.captures == 1
