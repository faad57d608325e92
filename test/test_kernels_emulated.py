# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA kernels and ``CudaPagedAttention`` checked on the CPU, through the kernel emulator.

``kernel_emulator`` compiles ``cuda_kernels/*.cu`` as host C++ and runs each CTA with real
threads, barriers and warp shuffles; ``CudaPagedAttention(..., launch=emulated)`` then drives
them exactly as it drives the CuPy kernels on a GPU (same grids, argument lists and buffers,
every argument checked against the C signature). So this file tests kernel numerics, the
split-K decomposition, the backend's launch code and the model runner's decode metadata across
block boundaries without a GPU. The GPU itself is covered by test_cuda_kernels.py.
"""

import contextlib
import random

import kernel_emulator
import numpy as np
import pytest
import torch

from orin_llm_node import kernel_sources as ks
from orin_llm_node.attention.cuda_backend import CudaPagedAttention

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason="g++ is needed to build the emulator"
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Output tolerance: the kernels accumulate in fp32 and round the result to the dtype once.
_ATOL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


def _backend(dtype, head_dim, hq, hkv, num_blocks=64, block_size=16, max_model_len=512,
             max_rows=1, layers=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(layers, 2, num_blocks, block_size, hkv, head_dim, generator=gen)
    kv = kv.to(_DTYPES[dtype])
    attn = CudaPagedAttention(kv, hq, max_model_len, max_rows=max_rows,
                              launch=kernel_emulator.emulated_launch(dtype, head_dim))
    attn.warmup()
    return attn, gen


def _reference_decode(kv_layer, q, block_tables, context_lens, block_size):
    """float64 softmax(q k^T / sqrt(D)) v over each row's context, through its block table."""
    hq, d = q.shape[1], q.shape[2]
    hkv = kv_layer.shape[-2]
    outs = []
    for r in range(q.shape[0]):
        ctx = int(context_lens[r])
        t = torch.arange(ctx)
        slots = block_tables[r][t // block_size] * block_size + t % block_size
        k = kv_layer[0].reshape(-1, hkv, d)[slots].double()
        v = kv_layer[1].reshape(-1, hkv, d)[slots].double()
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("hd,thd->ht", q[r].double(), k) * d ** -0.5
        outs.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(outs)


@pytest.mark.parametrize("max_model_len", [256, 1024])
@pytest.mark.parametrize(
    "dtype,head_dim,hq,hkv",
    [("float32", 32, 4, 2), ("bfloat16", 64, 8, 2), ("float16", 128, 20, 2)],
    ids=["fp32-d32-gqa2", "bf16-d64-gqa4", "fp16-d128-gqa10"],
)
def test_decode_matches_reference(dtype, head_dim, hq, hkv, max_model_len):
    """Random block tables, contexts across many blocks and partitions, several rows.

    max_model_len 256: one split walks two partitions (online softmax inside a CTA);
    1024: four splits, two of them empty for the longest row (early exit + reduce).
    GQA 10 > MAX_GROUP exercises the head chunking.
    """
    block_size, num_blocks = 16, 64
    attn, gen = _backend(dtype, head_dim, hq, hkv, num_blocks, block_size, max_model_len,
                         max_rows=3)
    context_lens = [1, 37, 300]
    width = -(-max(context_lens) // block_size)
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:width] for _ in range(3)])
    q = torch.randn(3, hq, head_dim, generator=gen).to(_DTYPES[dtype])
    new_k = torch.randn(3, hkv, head_dim, generator=gen).to(_DTYPES[dtype])
    new_v = torch.randn(3, hkv, head_dim, generator=gen).to(_DTYPES[dtype])
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    # The new token of each row sits at its last context position.
    last = ctx.long() - 1
    slots = tables[torch.arange(3), last // block_size] * block_size + last % block_size
    layer = 1
    attn.prepare_decode(slots, tables.contiguous(), ctx)
    out = attn.attend(layer, q, new_k, new_v)

    kv_layer = attn.kv_cache[layer]
    flat_k = kv_layer[0].reshape(-1, hkv, head_dim)
    assert torch.equal(flat_k[slots], new_k), "kv_write did not land at the slot mapping"
    ref = _reference_decode(kv_layer, q, tables, ctx, block_size)
    err = (out.double() - ref).abs().max().item()
    assert out.dtype == _DTYPES[dtype] and out.shape == (3, hq, head_dim)
    assert err <= _ATOL[dtype], f"max |err| {err}"


def test_kv_write_strided_input_and_skipped_slots():
    attn, gen = _backend("bfloat16", 64, 8, 2)
    before = attn.kv_cache.clone()
    big = torch.randn(5, 2, 3, 64, generator=gen).to(torch.bfloat16)
    k, v = big[:, :, 0], big[:, :, 1]  # row stride 3*2*64 elements: not contiguous
    slots = torch.tensor([7, -1, 100, 33, -1])
    table = torch.arange(64)
    attn.prepare(slots, table, num_prefix=0, num_new=5)
    attn.attend(0, torch.zeros(5, 8, 64, dtype=torch.bfloat16), k, v)
    flat = attn.kv_cache[0].reshape(2, -1, 2, 64)
    expect = before[0].reshape(2, -1, 2, 64).clone()
    keep = slots >= 0
    expect[0, slots[keep]] = k[keep]
    expect[1, slots[keep]] = v[keep]
    assert torch.equal(flat, expect)
    assert torch.equal(attn.kv_cache[1], before[1]), "another layer was written"


def test_arguments_are_typed_like_the_c_signature():
    launch = kernel_emulator.emulated_launch("float32", 32)
    with pytest.raises(TypeError, match="argument 5"):
        launch("kv_write", (1,), (ks.NUM_THREADS,), (0, 0, 0, 0, 0, np.int64(2), np.int64(0),
                                                      np.int64(0)))


def test_backend_validation():
    kv = torch.zeros(1, 2, 4, 16, 2, 32)
    with pytest.raises(ValueError, match="CUDA device"):
        CudaPagedAttention(kv, 4, 128)
    launch = kernel_emulator.emulated_launch("float32", 32)
    with pytest.raises(ValueError, match="head_dim"):
        CudaPagedAttention(torch.zeros(1, 2, 4, 16, 2, 48), 4, 128, launch=launch)
    with pytest.raises(ValueError, match="multiple"):
        CudaPagedAttention(kv, 3, 128, launch=launch)
    attn = CudaPagedAttention(kv, 4, 128, launch=launch)
    with pytest.raises(RuntimeError, match="warmup"):
        attn.attend(0, torch.zeros(1, 4, 32), torch.zeros(1, 2, 32), torch.zeros(1, 2, 32))


def test_model_runner_decode_across_blocks(tiny_ckpt):
    """The tiny model prefilling and decoding through the emulated kernels tracks torch.

    A 300-token prompt (two decode partitions, three splits with max_model_len 600) and 24
    teacher-forced decode steps across block boundaries, with a shuffled block table; logits
    must agree step by step. The runner's static decode buffers feed the kernels directly.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    tc = model.config.text
    num_blocks, block_size, max_len = 48, 16, 600
    runners = []
    for use_kernels in (False, True):
        runner = ModelRunner(model, num_blocks, block_size, max_len, torch.device("cpu"),
                             torch.float32)
        if use_kernels:
            runner.attn = CudaPagedAttention(
                runner.kv_cache, tc.num_attention_heads, max_len,
                launch=kernel_emulator.emulated_launch("float32", tc.head_dim),
            )
            runner.attn.warmup()
            assert runner.attn.num_splits == 3
        runners.append(runner)
    rng = random.Random(0)
    table = rng.sample(range(num_blocks), 22)
    prompt = [rng.randrange(tc.vocab_size) for _ in range(300)]
    pos = np.tile(np.arange(len(prompt)), (3, 1))
    logits = [r.prefill(prompt, pos, table, 0) for r in runners]  # SDPA vs paged prefill
    assert (logits[0] - logits[1]).abs().max().item() < 1e-4
    token = int(logits[0].argmax())
    for step in range(24):
        context = len(prompt) + step + 1
        logits = [r.decode(token, context - 1, table, context) for r in runners]
        err = (logits[0] - logits[1]).abs().max().item()
        assert err < 1e-4, f"step {step}: logits differ by {err}"
        assert int(logits[1].argmax()) == int(logits[0].argmax())
        token = int(logits[0].argmax())


def test_graph_decode_bookkeeping_with_a_fake_graph(tiny_ckpt, monkeypatch):
    """CudaGraphDecode on the CPU with a stand-in for torch.cuda.graph.

    The stand-in replays by recomputing into the tensor the capture returned, so this checks
    the bookkeeping, not CUDA: the pointers a graph bakes in stay the same over a whole
    generation and a new sequence (one capture), a changed pointer forces a new capture, and
    the replayed logits track the torch backend across block boundaries.
    """
    from orin_llm_node.engine.cuda_graph import CudaGraphDecode
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    tc = model.config.text
    launch = kernel_emulator.emulated_launch("float32", tc.head_dim)
    cpu = torch.device("cpu")
    ref = ModelRunner(model, 32, 16, 256, cpu, torch.float32)
    runner = ModelRunner(model, 32, 16, 256, cpu, torch.float32)

    def kernels_backend():
        attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, 256, launch=launch)
        attn.warmup()
        return attn

    runner.attn = kernels_backend()
    runner.decode_graph = CudaGraphDecode(runner)
    forward = runner._decode_forward

    class FakeGraph:
        out = None

        def replay(self):
            self.out.copy_(forward())

    @contextlib.contextmanager
    def fake_capture(graph, pool=None, capture_error_mode=None):
        assert capture_error_mode == "thread_local"

        def recording():
            graph.out = forward()
            return graph.out

        runner._decode_forward = recording
        try:
            yield
        finally:
            del runner._decode_forward

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    rng = random.Random(1)

    def generate(table, prompt_len, steps):
        prompt = [rng.randrange(tc.vocab_size) for _ in range(prompt_len)]
        pos = np.tile(np.arange(prompt_len), (3, 1))
        token = int(ref.prefill(prompt, pos, table, 0).argmax())
        runner.prefill(prompt, pos, table, 0)
        for step in range(steps):
            context = prompt_len + step + 1
            want = ref.decode(token, context - 1, table, context)
            got = runner.decode(token, context - 1, table, context)
            assert (want - got).abs().max().item() < 1e-4, step
            token = int(want.argmax())

    generate(rng.sample(range(32), 4), 13, 20)  # crosses blocks at 16, 32
    assert runner.decode_graph.captures == 1
    generate(rng.sample(range(32), 3), 5, 12)  # a new sequence: contents change only
    assert runner.decode_graph.captures == 1
    runner.attn = kernels_backend()  # new workspace pointers: the graph must be re-captured
    generate(rng.sample(range(32), 2), 7, 3)
    assert runner.decode_graph.captures == 2
