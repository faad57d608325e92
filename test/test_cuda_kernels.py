# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA kernels on a GPU against a float64 torch reference (marker ``gpu``).

Paged prefill: many lengths (one compiled code path, no per-shape planning), padding rows
under a captured graph replayed with new lengths, prefixes and block tables, and the tiny
model's bucketed prefill graphs against eager prefill (the same logic runs on the CPU in
test_paged_prefill_emulated.py and test_prefill_buckets.py).

Dtypes x head dims x GQA ratios, random block tables, context lengths across many blocks and
split-K partitions; fp16 max |err| <= 2e-3. Also: KV write (strided input, slot -1), the
backend against the torch paged backend, kernels captured in a CUDA graph reading new
metadata at replay, and bitwise determinism. Skips without CUDA or CuPy.
"""

import random

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy", reason="needs CuPy (cupy-cuda12x / cupy-cuda13x)")

from orin_llm_node import kernel_sources as ks  # noqa: E402
from orin_llm_node.attention.cuda_backend import CudaPagedAttention  # noqa: E402
from orin_llm_node.attention.torch_backend import TorchPagedAttention  # noqa: E402

DEV = torch.device("cuda")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Kernels accumulate in fp32 and round once to the output dtype.
_ATOL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}
CONTEXTS = [1, 15, 16, 17, 255, 256, 257, 1000, 3001]


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def make_backend(dtype, head_dim, hq, hkv, num_blocks=256, block_size=16, max_model_len=4096,
                 max_rows=1, layers=2, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    kv = torch.randn(layers, 2, num_blocks, block_size, hkv, head_dim, generator=gen, device=DEV)
    attn = CudaPagedAttention(kv.to(_DTYPES[dtype]), hq, max_model_len, max_rows=max_rows)
    attn.warmup()
    return attn, gen


def reference_decode(kv_layer, q, block_tables, context_lens, block_size):
    """float64 softmax(q k^T / sqrt(D)) v of each row over its context, via its block table."""
    hq, d = q.shape[1:]
    hkv = kv_layer.shape[-2]
    outs = []
    for r in range(q.shape[0]):
        t = torch.arange(int(context_lens[r]), device=q.device)
        slots = block_tables[r][t // block_size] * block_size + t % block_size
        k = kv_layer[0].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
        v = kv_layer[1].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
        s = torch.einsum("hd,thd->ht", q[r].double(), k) * d ** -0.5
        outs.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def random_decode_batch(attn, gen, contexts):
    """Per-row random block tables / new K,V / q; the new token at each row's last position."""
    rows, bs = len(contexts), attn.block_size
    nb = attn.kv_cache.shape[2]
    width = -(-max(contexts) // bs)
    tables = torch.stack([torch.randperm(nb, generator=gen, device=DEV)[:width]
                          for _ in range(rows)])
    ctx = torch.tensor(contexts, dtype=torch.int32, device=DEV)
    last = ctx.long() - 1
    slots = tables[torch.arange(rows, device=DEV), last // bs] * bs + last % bs
    shape = (rows, attn.num_q_heads, attn.head_dim)
    q = torch.randn(shape, generator=gen, device=DEV).to(attn.dtype)
    kv_shape = (rows, attn.num_kv_heads, attn.head_dim)
    k = torch.randn(kv_shape, generator=gen, device=DEV).to(attn.dtype)
    v = torch.randn(kv_shape, generator=gen, device=DEV).to(attn.dtype)
    return tables.contiguous(), ctx, slots, q, k, v


@pytest.mark.parametrize("max_model_len", [512, 4096])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (16, 8), (32, 8), (20, 2)],
                         ids=["mha", "gqa2", "gqa4", "gqa10"])
@pytest.mark.parametrize("head_dim", ks.HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(_DTYPES))
def test_decode_matches_reference(dtype, head_dim, hq, hkv, max_model_len):
    contexts = CONTEXTS if max_model_len >= 4096 else [c for c in CONTEXTS if c <= 1000]
    attn, gen = make_backend(dtype, head_dim, hq, hkv, max_model_len=max_model_len,
                             max_rows=len(contexts))
    tables, ctx, slots, q, k, v = random_decode_batch(attn, gen, contexts)
    attn.prepare_decode(slots, tables, ctx)
    out = attn.attend(1, q, k, v)
    layer = attn.kv_cache[1]
    assert torch.equal(layer[0].reshape(-1, hkv, head_dim)[slots], k)
    assert torch.equal(layer[1].reshape(-1, hkv, head_dim)[slots], v)
    err = (out.double() - reference_decode(layer, q, tables, ctx, 16)).abs().max().item()
    assert err <= _ATOL[dtype], f"max |err| {err}"


def test_context_longer_than_the_split_grid():
    """Contexts beyond max_model_len stay correct: a split walks several partitions."""
    attn, gen = make_backend("float16", 128, 32, 8, max_model_len=256, max_rows=2)
    assert attn.num_splits == 1
    tables, ctx, slots, q, k, v = random_decode_batch(attn, gen, [700, 2000])
    attn.prepare_decode(slots, tables, ctx)
    out = attn.attend(0, q, k, v)
    ref = reference_decode(attn.kv_cache[0], q, tables, ctx, 16)
    assert (out.double() - ref).abs().max().item() <= 2e-3


def test_kv_write_strided_and_skipped():
    attn, gen = make_backend("bfloat16", 128, 16, 8)
    before = attn.kv_cache.clone()
    big = torch.randn(6, 8, 3, 128, generator=gen, device=DEV).to(torch.bfloat16)
    k, v = big[:, :, 0], big[:, :, 2]
    slots = torch.tensor([5, -1, 4000, 17, -1, 4095], device=DEV)
    attn.prepare(slots, torch.arange(256, device=DEV), 0, 6)
    attn.attend(1, torch.zeros(6, 16, 128, dtype=torch.bfloat16, device=DEV), k, v)
    want = before.clone()
    flat = want[1].view(2, -1, 8, 128)
    keep = slots >= 0
    flat[0, slots[keep]] = k[keep]
    flat[1, slots[keep]] = v[keep]
    assert torch.equal(attn.kv_cache, want)


@pytest.mark.parametrize("dtype", list(_DTYPES))
def test_backend_matches_torch_backend_prefill_then_decode(dtype):
    attn, gen = make_backend(dtype, 128, 16, 8)
    ref = TorchPagedAttention(attn.kv_cache.clone())
    table = torch.randperm(256, generator=gen, device=DEV)[:40]
    context = 0
    for n in (300, 1, 1, 45, 1):  # prefill, decode, decode, a second-turn prefill, decode
        t = torch.arange(context, context + n, device=DEV)
        slots = table[t // 16] * 16 + t % 16
        q = torch.randn(n, 16, 128, generator=gen, device=DEV).to(attn.dtype)
        k = torch.randn(n, 8, 128, generator=gen, device=DEV).to(attn.dtype)
        v = torch.randn(n, 8, 128, generator=gen, device=DEV).to(attn.dtype)
        outs = []
        for backend in (attn, ref):
            backend.prepare(slots, table, context, n)
            outs.append(backend.attend(0, q, k, v))
        tol = 2 * _ATOL[dtype]  # decode / paged prefill kernels vs gather + SDPA
        assert (outs[0].double() - outs[1].double()).abs().max().item() <= tol
        context += n
    assert torch.equal(attn.kv_cache, ref.kv_cache)


def test_graph_replay_reads_new_metadata():
    """Captured once, replayed with new context lengths and block tables: still correct."""
    rows = 3
    attn, gen = make_backend("bfloat16", 128, 32, 8, max_rows=rows)
    width = 4096 // 16
    tables = torch.zeros(rows, width, dtype=torch.long, device=DEV)
    ctx = torch.ones(rows, dtype=torch.int32, device=DEV)
    slots = torch.zeros(rows, dtype=torch.long, device=DEV)
    q = torch.zeros(rows, 32, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.zeros(rows, 8, 128, dtype=torch.bfloat16, device=DEV)
    v = torch.zeros_like(k)
    attn.prepare_decode(slots, tables, ctx)
    attn.attend(0, q, k, v)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = attn.attend(0, q, k, v)
    for contexts in ([1, 16, 17], [300, 2000, 4096], [33, 1, 257]):
        new_tables, new_ctx, new_slots, new_q, new_k, new_v = random_decode_batch(
            attn, gen, contexts)
        tables.zero_()
        tables[:, : new_tables.shape[1]] = new_tables
        for dst, src in ((ctx, new_ctx), (slots, new_slots), (q, new_q), (k, new_k),
                         (v, new_v)):
            dst.copy_(src)
        graph.replay()
        ref = reference_decode(attn.kv_cache[0], q, tables, ctx, 16)
        assert (out.double() - ref).abs().max().item() <= 1.6e-2, contexts


def test_deterministic():
    attn, gen = make_backend("bfloat16", 128, 16, 8, max_rows=4)
    tables, ctx, slots, q, k, v = random_decode_batch(attn, gen, [100, 999, 3000, 7])
    attn.prepare_decode(slots, tables, ctx)
    first = attn.attend(0, q, k, v)
    for _ in range(3):
        assert torch.equal(attn.attend(0, q, k, v), first)


def reference_prefill(kv_layer, q, table, num_prefix, num_new):
    hq, d = q.shape[1:]
    hkv = kv_layer.shape[-2]
    t = torch.arange(num_prefix + num_new, device=DEV)
    slots = table[t // 16] * 16 + t % 16
    k = kv_layer[0].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    v = kv_layer[1].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    s = torch.einsum("nhd,thd->nht", q[:num_new].double(), k) * d ** -0.5
    visible = t[None] <= num_prefix + torch.arange(num_new, device=DEV)[:, None]
    s = s.masked_fill(~visible[:, None], float("-inf"))
    return torch.einsum("nht,thd->nhd", s.softmax(-1), v)


@pytest.mark.parametrize("dtype", list(_DTYPES))
@pytest.mark.parametrize("head_dim,hq,hkv", [(128, 16, 8), (128, 32, 8), (64, 8, 2),
                                             (32, 4, 2)])
def test_prefill_kernel_matches_reference(dtype, head_dim, hq, hkv):
    attn, gen = make_backend(dtype, head_dim, hq, hkv, num_blocks=512, max_model_len=8192)
    table = torch.randperm(512, generator=gen, device=DEV)
    for num_prefix, n in ((0, 242), (243, 31), (1000, 7), (17, 64), (4000, 129)):
        t = torch.arange(num_prefix, num_prefix + n, device=DEV)
        slots = table[t // 16] * 16 + t % 16
        q, k, v = (torch.randn(n, h, head_dim, generator=gen, device=DEV).to(attn.dtype)
                   for h in (hq, hkv, hkv))
        attn.prepare(slots, table, num_prefix, n)
        out = attn.attend(1, q, k, v)
        ref = reference_prefill(attn.kv_cache[1], q, table, num_prefix, n)
        err = (out.double() - ref).abs().max().item()
        assert err <= _ATOL[dtype], (num_prefix, n, err)


def test_padded_prefill_graph_replays_new_lengths():
    """One capture of a 64-row padded prefill, replayed for new prefixes and lengths."""
    attn, gen = make_backend("bfloat16", 128, 16, 8, num_blocks=512, max_model_len=8192)
    size = 64
    table = torch.zeros(512, dtype=torch.long, device=DEV)
    slots = torch.full((size,), -1, dtype=torch.long, device=DEV)
    q = torch.zeros(size, 16, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.zeros(size, 8, 128, dtype=torch.bfloat16, device=DEV)
    v = torch.zeros_like(k)
    attn.prepare(slots, table, 0, 1)
    attn.attend(0, q, k, v)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = attn.attend(0, q, k, v)
    perm = torch.randperm(512, generator=gen, device=DEV)
    for num_prefix, n in ((0, 64), (243, 5), (1001, 33), (16, 64), (3000, 1)):
        table.copy_(perm)
        t = torch.arange(num_prefix, num_prefix + n, device=DEV)
        slots.fill_(-1)
        slots[:n] = table[t // 16] * 16 + t % 16
        for buf, h in ((q, 16), (k, 8), (v, 8)):
            buf.copy_(torch.randn(size, h, 128, generator=gen, device=DEV))
        before = attn.kv_cache.clone()
        attn.prepare(slots, table, num_prefix, n)
        graph.replay()
        ref = reference_prefill(attn.kv_cache[0], q, table, num_prefix, n)
        assert (out[:n].double() - ref).abs().max().item() <= 1.6e-2, (num_prefix, n)
        assert not out[n:].any()
        changed = (attn.kv_cache != before).flatten(4).any(-1)  # [layers, 2, blocks, bs]
        flat = changed[0].reshape(2, -1)
        assert set(flat.any(0).nonzero().flatten().tolist()) <= set(slots[:n].tolist())


def test_runner_prefill_graphs_match_eager(tiny_ckpt):
    """The tiny model: follow-ups replayed from prefill graphs == eager prefill (fp32)."""
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32, device=DEV).eval()
    tc = model.config.text
    graphs = ModelRunner(model, 64, 16, 1024, DEV, torch.float32, enable_cuda_graph=True)
    eager = ModelRunner(model, 64, 16, 1024, DEV, torch.float32, enable_cuda_graph=False)
    assert graphs.prefill_graphs is not None and eager.prefill_graphs is None
    graphs.capture_prefill_graphs()
    captured = graphs.prefill_graphs.captures
    assert captured == len(graphs.prefill_graphs.buckets)
    rng = random.Random(0)
    table = rng.sample(range(64), 40)
    prompt = [rng.randrange(tc.vocab_size) for _ in range(600)]
    pos = np.tile(np.arange(600), (3, 1))
    done = 0
    for n in (200, 9, 23, 64, 1, 40, 128, 77):
        chunk = slice(done, done + n)
        want = eager.prefill(prompt[chunk], pos[:, chunk], table, done)
        got = graphs.prefill(prompt[chunk], pos[:, chunk], table, done)
        assert (want - got).abs().max().item() < 1e-3, n
        assert int(want.argmax()) == int(got.argmax())
        done += n
    assert graphs.prefill_graphs.captures == captured, "a new length must not re-capture"
