# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA kernels on a GPU against a float64 torch reference (marker ``gpu``).

Paged prefill (tensor cores in fp16/bf16, CUDA cores in fp32): many lengths (one compiled
code path, no per-shape planning), more row tiles than gridDim.y holds, padding rows
under a captured graph replayed with new lengths, prefixes and block tables, and the tiny
model's bucketed prefill graphs against eager prefill (the same logic runs on the CPU in
test_paged_prefill_emulated.py and test_prefill_buckets.py).

Dtypes x head dims x GQA ratios, random block tables, context lengths across many blocks and
decode splits; fp16 max |err| <= 2e-3. Also: KV write (strided input, slot -1), the fused
RMSNorm / add+RMSNorm / SiLU x up / q-k-norm + M-RoPE + KV-write kernels against their torch
bodies (the CPU path), the backend against the torch paged backend, kernels captured in a
CUDA graph reading new metadata at replay, and bitwise determinism; every fused op through a
launch counter (an op that ran its torch body instead would compare torch with torch). Skips
without CUDA or CuPy.
"""

import random

from _kernel_testing import ATOL, DTYPES, skip_without_cuda_kernels
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
skip_without_cuda_kernels()

from orin_llm_node.attention.cuda_backend import CudaPagedAttention  # noqa: E402
from orin_llm_node.attention.torch_backend import TorchPagedAttention  # noqa: E402
from orin_llm_node.kernels import kernel_sources as ks  # noqa: E402
from orin_llm_node.kernels.cuda_ops import FusedOps, LaunchCounter, kernel_launcher  # noqa: E402
from orin_llm_node.layers import RMSNorm  # noqa: E402
from orin_llm_node.layers.activation import silu_and_mul  # noqa: E402
from orin_llm_node.layers.layernorm import add_rms_norm, rms_norm  # noqa: E402
from orin_llm_node.layers.rotary_embedding import MRotaryEmbedding  # noqa: E402

DEV = torch.device('cuda')
CONTEXTS = [1, 15, 16, 17, 255, 256, 257, 1000, 3001]


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def make_backend(dtype, head_dim, hq, hkv, num_blocks=256, block_size=16, max_model_len=4096,
                 layers=2, seed=0, num_sms=None):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    kv = torch.randn(layers, 2, num_blocks, block_size, hkv, head_dim, generator=gen, device=DEV)
    attn = CudaPagedAttention(kv.to(DTYPES[dtype]), hq, max_model_len, num_sms=num_sms)
    attn.warmup()
    return attn, gen


def reference_decode(kv_layer, q, table, context, block_size):
    """float64 softmax(q k^T / sqrt(D)) v of one query row over its context, via its table."""
    hq, d = q.shape[1:]
    hkv = kv_layer.shape[-2]
    t = torch.arange(context, device=q.device)
    slots = table[t // block_size] * block_size + t % block_size
    k = kv_layer[0].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    v = kv_layer[1].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    s = torch.einsum('hd,thd->ht', q[0].double(), k) * d ** -0.5
    return torch.einsum('ht,thd->hd', s.softmax(-1), v)[None]


def random_decode_step(attn, gen, table, context):
    """New K, V, q of one decode step; the new token at the context's last position."""
    bs = attn.block_size
    last = context - 1
    slot = (table[last // bs] * bs + last % bs).reshape(1)
    q = torch.randn(1, attn.num_q_heads, attn.head_dim, generator=gen, device=DEV)
    k = torch.randn(1, attn.num_kv_heads, attn.head_dim, generator=gen, device=DEV)
    v = torch.randn(1, attn.num_kv_heads, attn.head_dim, generator=gen, device=DEV)
    return slot, q.to(attn.dtype), k.to(attn.dtype), v.to(attn.dtype)


@pytest.mark.parametrize('max_model_len', [512, 4096])
@pytest.mark.parametrize('hq,hkv', [(8, 8), (16, 8), (32, 8), (20, 2)],
                         ids=['mha', 'gqa2', 'gqa4', 'gqa10'])
@pytest.mark.parametrize('head_dim', ks.HEAD_DIMS)
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_decode_matches_reference(dtype, head_dim, hq, hkv, max_model_len):
    contexts = CONTEXTS if max_model_len >= 4096 else [c for c in CONTEXTS if c <= 1000]
    attn, gen = make_backend(dtype, head_dim, hq, hkv, max_model_len=max_model_len)
    table = torch.randperm(256, generator=gen, device=DEV)
    for context in contexts:
        slot, q, k, v = random_decode_step(attn, gen, table, context)
        attn.prepare(slot, table, context - 1, 1)
        out = attn.attend(1, q, k, v)
        layer = attn.kv_cache[1]
        assert torch.equal(layer[0].reshape(-1, hkv, head_dim)[slot], k)
        assert torch.equal(layer[1].reshape(-1, hkv, head_dim)[slot], v)
        err = (out.double() - reference_decode(layer, q, table, context, 16)).abs().max()
        assert err.item() <= ATOL[dtype], f'context {context}: max |err| {err.item()}'


def test_context_longer_than_the_split_grid():
    """Contexts beyond max_model_len stay correct: a split walks several passes."""
    attn, gen = make_backend('float16', 128, 32, 8, max_model_len=256)
    table = torch.randperm(256, generator=gen, device=DEV)
    for context in (700, 2000):
        slot, q, k, v = random_decode_step(attn, gen, table, context)
        attn.prepare(slot, table, context - 1, 1)
        out = attn.attend(0, q, k, v)
        ref = reference_decode(attn.kv_cache[0], q, table, context, 16)
        assert (out.double() - ref).abs().max().item() <= 2e-3


@pytest.mark.parametrize('dtype', list(DTYPES))
@pytest.mark.parametrize('rows,cols', [(1, 2048), (1, 4096), (7, 2560), (300, 128)])
def test_fused_norms_and_silu_match_torch(dtype, rows, cols):
    """Each op launches its kernel (DEV is ``cuda``, tensors report ``cuda:0``) and matches."""
    torch_dtype = DTYPES[dtype]
    launch = LaunchCounter(kernel_launcher(torch_dtype, 128, DEV))
    ops = FusedOps(torch_dtype, 128, DEV, launch=launch)
    gen = torch.Generator(device=DEV).manual_seed(cols)
    x = (3 * torch.randn(rows, cols, generator=gen, device=DEV)).to(torch_dtype)
    res = torch.randn(rows, cols, generator=gen, device=DEV).to(torch_dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=gen, device=DEV)).to(torch_dtype)
    tol = {'float32': 1e-5, 'bfloat16': 2 ** -7, 'float16': 2 ** -10}[dtype]

    def close(a, b):
        return (a.double() - b.double()).abs().max().item() <= tol * b.abs().max().item()

    assert close(ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    want, want_res = add_rms_norm(x, res, w, 1e-6)
    got, got_res = ops.add_rms_norm(x, res.clone(), w, 1e-6)
    assert torch.equal(got_res, want_res) and close(got, want)
    gu = torch.randn(rows, 2 * cols, generator=gen, device=DEV).to(torch_dtype)
    assert close(ops.silu_and_mul(gu), silu_and_mul(gu))
    assert launch.counts == {'rms_norm': 1, 'add_rms_norm': 1, 'silu_and_mul': 1}


@torch.no_grad()
@pytest.mark.parametrize('n', [1, 300])
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_fused_qk_norm_rope_kv_write_matches_torch(dtype, n):
    """attend_qkv (one fused kernel, then attention) vs the torch body, decode and prefill."""
    attn, gen = make_backend(dtype, 128, 16, 8)
    ref = TorchPagedAttention(attn.kv_cache.clone())
    rope = MRotaryEmbedding(128, 5e6, (24, 20, 20))
    num_prefix = 37
    pos = torch.stack([torch.arange(n, device=DEV) // 3 + 10, torch.arange(n, device=DEV) % 7,
                       torch.arange(n, device=DEV) % 5]) if n > 1 else torch.tensor([40],
                                                                                   device=DEV)
    cos, sin = rope.to(DEV)(pos, attn.dtype)
    table = torch.randperm(256, generator=gen, device=DEV)[:40]
    t = torch.arange(num_prefix, num_prefix + n, device=DEV)
    slots = table[t // 16] * 16 + t % 16
    qkv = torch.randn(n, 32 * 128, generator=gen, device=DEV).to(attn.dtype)
    q, k, v = qkv.split([16 * 128, 8 * 128, 8 * 128], dim=-1)
    q, k, v = q.view(n, 16, 128), k.view(n, 8, 128), v.view(n, 8, 128)
    norms = [RMSNorm(128, 1e-6).to(DEV, attn.dtype) for _ in range(2)]
    for m in norms:
        m.weight.copy_(1 + 0.2 * torch.randn(128, generator=gen, device=DEV))
    outs = []
    for backend in (attn, ref):
        backend.prepare(slots, table, num_prefix, n)
        outs.append(backend.attend_qkv(0, q, k, v, *norms, cos, sin))
    tol = 2 * ATOL[dtype]
    assert (outs[0].double() - outs[1].double()).abs().max().item() <= tol
    assert (attn.kv_cache.double() - ref.kv_cache.double()).abs().max().item() <= tol * 8


def test_paged_decode_keeps_the_sms_busy():
    """The split grid covers about two CTAs per SM whatever max_model_len allows."""
    attn, _ = make_backend('bfloat16', 128, 16, 8, max_model_len=32768)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    assert attn.num_splits * attn.num_kv_heads >= 2 * sms - attn.num_kv_heads


def test_kv_write_strided_and_skipped():
    attn, gen = make_backend('bfloat16', 128, 16, 8)
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


@pytest.mark.parametrize('dtype', list(DTYPES))
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
        tol = 2 * ATOL[dtype]  # decode / paged prefill kernels vs gather + SDPA
        assert (outs[0].double() - outs[1].double()).abs().max().item() <= tol
        context += n
    assert torch.equal(attn.kv_cache, ref.kv_cache)


def test_graph_replay_reads_new_metadata():
    """Captured once, replayed with new context lengths, slots and tables: still correct."""
    attn, gen = make_backend('bfloat16', 128, 32, 8)
    table = torch.zeros(4096 // 16, dtype=torch.long, device=DEV)
    slot = torch.zeros(1, dtype=torch.long, device=DEV)
    q = torch.zeros(1, 32, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.zeros(1, 8, 128, dtype=torch.bfloat16, device=DEV)
    v = torch.zeros_like(k)
    attn.prepare(slot, table, 0, 1)
    attn.attend(0, q, k, v)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode='thread_local'):
        out = attn.attend(0, q, k, v)
    for context in (1, 16, 17, 300, 2000, 4096, 33):
        new_table = torch.randperm(256, generator=gen, device=DEV)
        new_slot, new_q, new_k, new_v = random_decode_step(attn, gen, new_table, context)
        table.copy_(new_table)
        for dst, src in ((slot, new_slot), (q, new_q), (k, new_k), (v, new_v)):
            dst.copy_(src)
        attn.prepare(slot, table, context - 1, 1)  # refills the device context length only
        graph.replay()
        ref = reference_decode(attn.kv_cache[0], q, table, context, 16)
        assert (out.double() - ref).abs().max().item() <= 1.6e-2, context


def test_deterministic():
    attn, gen = make_backend('bfloat16', 128, 16, 8)
    table = torch.randperm(256, generator=gen, device=DEV)
    slot, q, k, v = random_decode_step(attn, gen, table, 3000)
    attn.prepare(slot, table, 2999, 1)
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
    s = torch.einsum('nhd,thd->nht', q[:num_new].double(), k) * d ** -0.5
    visible = t[None] <= num_prefix + torch.arange(num_new, device=DEV)[:, None]
    s = s.masked_fill(~visible[:, None], float('-inf'))
    return torch.einsum('nht,thd->nhd', s.softmax(-1), v)


@pytest.mark.parametrize('dtype', list(DTYPES))
@pytest.mark.parametrize('head_dim,hq,hkv', [(128, 16, 8), (128, 32, 8), (64, 8, 2),
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
        assert err <= ATOL[dtype], (num_prefix, n, err)


@pytest.mark.parametrize('dtype,num_rows', [('float32', 262_200), ('bfloat16', 1_048_600)])
def test_prefill_with_more_row_tiles_than_grid_y_holds(dtype, num_rows):
    """More than 65,535 row tiles (gridDim.y's limit): 33 real tokens then padding rows.

    Tiles are handed out last first, so the real rows sit in the CTAs with the highest
    blockIdx.x; they must match the reference, twice bit for bit.
    """
    attn, gen = make_backend(dtype, 32, 4, 1, num_blocks=64, max_model_len=1024)
    assert -(-num_rows * 4 // ks.prefill_rows(dtype)) > 65_535
    table = torch.randperm(64, generator=gen, device=DEV)
    num_prefix, n = 300, 33
    t = torch.arange(num_prefix, num_prefix + n, device=DEV)
    slots = torch.full((num_rows,), -1, dtype=torch.long, device=DEV)
    slots[:n] = table[t // 16] * 16 + t % 16
    q = torch.zeros(num_rows, 4, 32, dtype=attn.dtype, device=DEV)
    k, v = (torch.zeros(num_rows, 1, 32, dtype=attn.dtype, device=DEV) for _ in range(2))
    for buf in (q, k, v):
        buf[:n] = torch.randn(n, *buf.shape[1:], generator=gen, device=DEV)
    attn.prepare(slots, table, num_prefix, n)
    out = attn.attend(0, q, k, v)
    ref = reference_prefill(attn.kv_cache[0], q[:n], table, num_prefix, n)
    assert (out[:n].double() - ref).abs().max().item() <= ATOL[dtype]
    assert torch.equal(attn.attend(0, q, k, v)[:n], out[:n])


def test_padded_prefill_graph_replays_new_lengths():
    """One capture of a 64-row padded prefill, replayed for new prefixes and lengths."""
    attn, gen = make_backend('bfloat16', 128, 16, 8, num_blocks=512, max_model_len=8192)
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
    with torch.cuda.graph(graph, capture_error_mode='thread_local'):
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
    """The tiny model: follow-ups replayed from prefill graphs == eager prefill (fp32).

    The eager runner pads to the same buckets (without graphs): both sides multiply at the same
    row counts, which is all cuBLAS promises to reproduce. The logits still get a tolerance
    (1e-3, fp32 with TF32 off) rather than bit equality: a graph replay need not pick the same
    cuBLAS workspace as the eager call.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.engine.prefill_graph import DEFAULT_BUCKETS
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32, device=DEV).eval()
    tc = model.config.text
    graphs = ModelRunner(model, 64, 16, 1024, DEV, torch.float32, enable_cuda_graph=True)
    eager = ModelRunner(model, 64, 16, 1024, DEV, torch.float32, enable_cuda_graph=False,
                        prefill_buckets=DEFAULT_BUCKETS)
    assert graphs.prefill_graphs.use_graphs and not eager.prefill_graphs.use_graphs
    assert graphs.prefill_graphs.buckets == eager.prefill_graphs.buckets
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
    assert graphs.prefill_graphs.captures == captured, 'a new length must not re-capture'
