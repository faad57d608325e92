# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The paged prefill kernel and bucketed prefill graphs on a GPU (marker ``gpu``).

The kernel against a float64 reference over many lengths (one compiled code path, no
per-shape planning), padding rows under a captured graph replayed with new lengths, prefixes
and block tables, and the tiny model's prefill graphs against eager prefill. Skips without CUDA
or CuPy; the same logic runs on the CPU in test_paged_prefill_emulated.py and
test_prefill_buckets.py.
"""

import random

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy", reason="needs CuPy (cupy-cuda12x / cupy-cuda13x)")

from orin_llm_node.attention.cuda_backend import CudaPagedAttention  # noqa: E402

DEV = torch.device("cuda")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ATOL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _backend(dtype, head_dim, hq, hkv, num_blocks=512):
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = torch.randn(2, 2, num_blocks, 16, hkv, head_dim, generator=gen, device=DEV)
    attn = CudaPagedAttention(kv.to(_DTYPES[dtype]), hq, 8192)
    attn.warmup()
    return attn, gen


def _reference(kv_layer, q, table, num_prefix, num_new):
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
    attn, gen = _backend(dtype, head_dim, hq, hkv)
    table = torch.randperm(512, generator=gen, device=DEV)
    for num_prefix, n in ((0, 242), (243, 31), (1000, 7), (17, 64), (4000, 129)):
        t = torch.arange(num_prefix, num_prefix + n, device=DEV)
        slots = table[t // 16] * 16 + t % 16
        q, k, v = (torch.randn(n, h, head_dim, generator=gen, device=DEV).to(attn.dtype)
                   for h in (hq, hkv, hkv))
        attn.prepare(slots, table, num_prefix, n)
        out = attn.attend(1, q, k, v)
        ref = _reference(attn.kv_cache[1], q, table, num_prefix, n)
        err = (out.double() - ref).abs().max().item()
        assert err <= _ATOL[dtype], (num_prefix, n, err)


def test_padded_prefill_graph_replays_new_lengths():
    """One capture of a 64-row padded prefill, replayed for new prefixes and lengths."""
    attn, gen = _backend("bfloat16", 128, 16, 8)
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
        ref = _reference(attn.kv_cache[0], q, table, num_prefix, n)
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
