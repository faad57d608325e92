# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA kernels, ``CudaPagedAttention`` and ``FusedOps`` checked on the CPU (emulator).

``kernel_emulator`` compiles ``cuda_kernels/*.cu`` as host C++ and runs each CTA with real
threads, barriers and warp shuffles; ``CudaPagedAttention(..., launch=emulated)`` and
``FusedOps(..., launch=emulated)`` then drive them exactly as they drive the CuPy kernels on a
GPU (same grids, argument lists and buffers, every argument checked against the C signature).
So this file tests kernel numerics against the torch paths (the oracle), the split-K
decomposition, the launch code and the model runner's fused decode step across block
boundaries without a GPU. The GPU itself is covered by test_cuda_kernels.py.
"""

import random

from _kernel_testing import ATOL, DTYPES
from cpu_graphs import CpuGraphCapture
import kernel_emulator
from kernel_emulator import CountingLaunch
import numpy as np
import pytest
import torch

from orin_llm_node.attention.cuda_backend import CudaPagedAttention
from orin_llm_node.attention.torch_backend import TorchPagedAttention
from orin_llm_node.engine.structured import host_bitmask
from orin_llm_node.kernels import dispatch
from orin_llm_node.kernels import kernel_sources as ks
from orin_llm_node.kernels.cuda_ops import FusedOps
from orin_llm_node.layers import RMSNorm
from orin_llm_node.layers.activation import silu_and_mul
from orin_llm_node.layers.layernorm import add_rms_norm, rms_norm
from orin_llm_node.layers.rotary_embedding import MRotaryEmbedding

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason='g++ is needed to build the emulator'
)



def _backend(dtype, head_dim, hq, hkv, num_blocks=64, block_size=16, max_model_len=512,
             layers=2, seed=0, num_sms=16):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(layers, 2, num_blocks, block_size, hkv, head_dim, generator=gen)
    kv = kv.to(DTYPES[dtype])
    attn = CudaPagedAttention(kv, hq, max_model_len, num_sms=num_sms,
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
        s = torch.einsum('hd,thd->ht', q[r].double(), k) * d ** -0.5
        outs.append(torch.einsum('ht,thd->hd', s.softmax(-1), v))
    return torch.stack(outs)


@pytest.mark.parametrize('num_sms,max_model_len', [(1, 600), (16, 1024), (64, 4096)],
                         ids=['1-split', 'split-by-context', 'many-splits'])
@pytest.mark.parametrize(
    'dtype,head_dim,hq,hkv',
    [('float32', 32, 4, 2), ('bfloat16', 64, 8, 2), ('float16', 128, 20, 2)],
    ids=['fp32-d32-gqa2', 'bf16-d64-gqa4', 'fp16-d128-gqa10'],
)
def test_decode_matches_reference(dtype, head_dim, hq, hkv, num_sms, max_model_len):
    """Random block table, contexts across many blocks and split boundaries.

    One SM: a single split walks a 300-token context in two shared-memory passes (online
    softmax inside a CTA). 16 / 64 SMs: the context is spread over up to num_splits ranges
    of >= SPLIT_MIN_TOKENS tokens (unused splits exit at once, the reduce combines the used
    ones). GQA 10 > MAX_GROUP exercises the head chunking.
    """
    block_size, num_blocks = 16, 64
    attn, gen = _backend(dtype, head_dim, hq, hkv, num_blocks, block_size, max_model_len,
                         num_sms=num_sms)
    table = torch.randperm(num_blocks, generator=gen)
    layer = 1
    for context in (1, 17, 37, 300):
        q = torch.randn(1, hq, head_dim, generator=gen).to(DTYPES[dtype])
        new_k = torch.randn(1, hkv, head_dim, generator=gen).to(DTYPES[dtype])
        new_v = torch.randn(1, hkv, head_dim, generator=gen).to(DTYPES[dtype])
        last = context - 1
        slot = table[last // block_size] * block_size + last % block_size
        attn.prepare(slot.reshape(1), table, last, 1)
        out = attn.attend(layer, q, new_k, new_v)

        kv_layer = attn.kv_cache[layer]
        assert torch.equal(kv_layer[0].reshape(-1, hkv, head_dim)[slot], new_k[0]), \
            'kv_write did not land at the slot mapping'
        ref = _reference_decode(kv_layer, q, table[None], torch.tensor([context]), block_size)
        err = (out.double() - ref).abs().max().item()
        assert out.dtype == DTYPES[dtype] and out.shape == (1, hq, head_dim)
        assert err <= ATOL[dtype], f'context {context}: max |err| {err}'


def test_split_count_follows_the_grid_and_the_sm_count():
    kv = torch.zeros(1, 2, 4, 16, 8, 128, dtype=torch.bfloat16)
    launch = kernel_emulator.emulated_launch('bfloat16', 128)
    # 2 CTAs per SM over 8 KV heads: an H100 (132 SMs) gets 33 splits, an AGX Orin (16) 4.
    assert CudaPagedAttention(kv, 16, 32768, launch=launch, num_sms=132).num_splits == 33
    assert CudaPagedAttention(kv, 16, 32768, launch=launch, num_sms=16).num_splits == 4
    # Never more splits than SPLIT_MIN_TOKENS ranges of max_model_len.
    assert CudaPagedAttention(kv, 16, 40, launch=launch, num_sms=132).num_splits == 3


def test_kv_write_strided_input_and_skipped_slots():
    attn, gen = _backend('bfloat16', 64, 8, 2)
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
    assert torch.equal(attn.kv_cache[1], before[1]), 'another layer was written'


def test_arguments_are_typed_like_the_c_signature():
    launch = kernel_emulator.emulated_launch('float32', 32)
    with pytest.raises(TypeError, match='argument 5'):
        launch('kv_write', (1,), (ks.NUM_THREADS,), (0, 0, 0, 0, 0, np.int64(2), np.int64(0),
                                                      np.int64(0)))


def test_backend_validation():
    kv = torch.zeros(1, 2, 4, 16, 2, 32)
    with pytest.raises(ValueError, match='CUDA device'):
        CudaPagedAttention(kv, 4, 128)
    launch = kernel_emulator.emulated_launch('float32', 32)
    with pytest.raises(ValueError, match='head_dim'):
        CudaPagedAttention(torch.zeros(1, 2, 4, 16, 2, 48), 4, 128, launch=launch)
    with pytest.raises(ValueError, match='multiple'):
        CudaPagedAttention(kv, 3, 128, launch=launch)
    attn = CudaPagedAttention(kv, 4, 128, launch=launch)
    with pytest.raises(RuntimeError, match='warmup'):
        attn.attend(0, torch.zeros(1, 4, 32), torch.zeros(1, 2, 32), torch.zeros(1, 2, 32))


# One rounding step of the dtype (the fused kernels round where torch rounds; only fp32
# summation order and rsqrt differ, which can flip the last bit before a rounding).
_ULP_TOL = {'float32': 1e-5, 'bfloat16': 2 ** -7, 'float16': 2 ** -10}


def _close(got, want, dtype, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    tol = _ULP_TOL[dtype] * max(1.0, want.abs().max().item())
    err = (got.double() - want.double()).abs().max().item()
    assert err <= tol, f'{what}: max |err| {err} > {tol}'


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16', 'float16'])
@pytest.mark.parametrize('rows,cols', [(1, 64), (5, 2048), (3, 96)])
def test_fused_norms_and_silu_match_the_torch_bodies(dtype, rows, cols):
    """rms_norm, add_rms_norm (residual updated in place) and silu_and_mul vs layers/."""
    torch_dtype = DTYPES[dtype]
    gen = torch.Generator().manual_seed(rows * cols)
    ops = FusedOps(torch_dtype, 32, torch.device('cpu'),
                   launch=CountingLaunch(kernel_emulator.emulated_launch(dtype, 32)))
    x = (3 * torch.randn(rows, cols, generator=gen)).to(torch_dtype)
    residual = torch.randn(rows, cols, generator=gen).to(torch_dtype)
    weight = (1 + 0.1 * torch.randn(cols, generator=gen)).to(torch_dtype)
    _close(ops.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6), dtype, 'rms_norm')
    want_out, want_res = add_rms_norm(x, residual, weight, 1e-6)
    res = residual.clone()
    got_out, got_res = ops.add_rms_norm(x, res, weight, 1e-6)
    assert got_res is res and torch.equal(got_res, want_res), 'residual add must be exact'
    _close(got_out, want_out, dtype, 'add_rms_norm')
    gate_up = torch.randn(rows, 2 * cols, generator=gen).to(torch_dtype)
    _close(ops.silu_and_mul(gate_up), silu_and_mul(gate_up), dtype, 'silu_and_mul')
    assert ops._launch.counts == {'rms_norm': 1, 'add_rms_norm': 1, 'silu_and_mul': 1}


def test_kernels_run_with_flush_to_zero_as_cupy_compiles_them():
    """CuPy's -ftz=true: an fp32 subnormal reads as 0 inside a kernel, as on a GPU.

    Here a bf16 subnormal activation (its fp32 value is a subnormal); the caller's arithmetic,
    after the launch, still keeps subnormals (the mode is restored).
    """
    assert kernel_emulator.flushes_subnormals('bfloat16', 32)
    ops = FusedOps(torch.bfloat16, 32, torch.device('cpu'),
                   launch=kernel_emulator.emulated_launch('bfloat16', 32))
    x = torch.ones(1, 64, dtype=torch.bfloat16)
    x[0, 0] = 1e-39  # a bf16 (and fp32) subnormal
    weight = torch.ones(64, dtype=torch.bfloat16)
    want = rms_norm(x, weight, 1e-6)
    assert want[0, 0] != 0  # torch's CPU path computes through the subnormal
    got = ops.rms_norm(x, weight, 1e-6)
    assert got[0, 0] == 0, 'the emulated kernel did not flush the subnormal to zero'
    assert torch.equal(got[0, 1:], want[0, 1:])
    assert torch.tensor([1e-39]) * 2 != 0 and 5e-324 * 1.0 > 0, 'flush-to-zero leaked out'


def test_fused_ops_fall_back_to_torch_for_inputs_the_kernels_cannot_take():
    launch = CountingLaunch(kernel_emulator.emulated_launch('float32', 32))
    ops = FusedOps(torch.float32, 32, torch.device('cpu'), launch=launch)
    x = torch.randn(3, 30)  # 30 columns: not whole 16-byte vectors
    w = torch.ones(30)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    norm = RMSNorm(32, 1e-6)
    with dispatch.installed('cpu', torch.float32, ops):
        norm(torch.randn(2, 4, 32))  # q/k-norm shaped (3-D): the torch body
        norm(torch.randn(2, 32))  # the kernel
    assert launch.counts == {'rms_norm': 1}


@pytest.mark.parametrize('positions', ['1d-decode', '3d-prefill'])
@pytest.mark.parametrize(
    'dtype,head_dim,hq,hkv',
    [('float32', 32, 4, 2), ('bfloat16', 64, 8, 2), ('float16', 128, 16, 8)],
    ids=['fp32-d32', 'bf16-d64', 'fp16-d128'],
)
@torch.no_grad()
def test_fused_qk_norm_rope_kv_write_matches_the_torch_path(dtype, head_dim, hq, hkv,
                                                            positions):
    """attend_qkv: one kernel vs the base torch body (q/k-norm, M-RoPE, KV write).

    Views into one merged qkv output (strided rows), 1-D decode positions or 3-D image
    positions (t, h, w all different); the K/V written to the cache and the attention output
    must match the torch backend within one rounding step.
    """
    torch_dtype = DTYPES[dtype]
    attn, gen = _backend(dtype, head_dim, hq, hkv)
    ref = TorchPagedAttention(attn.kv_cache.clone())
    rope = MRotaryEmbedding(head_dim, 10000.0, [head_dim // 6, head_dim // 6 - 1,
                                                 head_dim // 2 - 2 * (head_dim // 6) + 1])
    n = 1 if positions == '1d-decode' else 12
    if n == 1:
        pos = torch.tensor([40])
        num_prefix = 40
    else:
        num_prefix = 5
        pos = torch.stack([torch.full((n,), 5), 5 + torch.arange(n) // 4, 5 + torch.arange(n) % 4])
    cos, sin = rope(pos, torch_dtype)
    table = torch.randperm(64, generator=gen)[:4]
    t = torch.arange(num_prefix, num_prefix + n)
    slots = table[t // 16] * 16 + t % 16
    qkv = torch.randn(n, (hq + 2 * hkv) * head_dim, generator=gen).to(torch_dtype)
    q, k, v = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    q, k, v = q.view(n, hq, head_dim), k.view(n, hkv, head_dim), v.view(n, hkv, head_dim)
    q_norm, k_norm = RMSNorm(head_dim, 1e-6), RMSNorm(head_dim, 1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.2 * torch.randn(head_dim, generator=gen))
        k_norm.weight.copy_(1 + 0.2 * torch.randn(head_dim, generator=gen))
    q_norm.to(torch_dtype)
    k_norm.to(torch_dtype)
    outs = []
    for backend in (attn, ref):
        backend.prepare(slots, table, num_prefix, n)
        outs.append(backend.attend_qkv(1, q, k, v, q_norm, k_norm, cos, sin))
    _close(outs[0], outs[1], dtype, 'attention output')
    flat, flat_ref = (b.kv_cache[1].reshape(2, -1, hkv, head_dim) for b in (attn, ref))
    _close(flat[0, slots], flat_ref[0, slots], dtype, 'k in the cache')
    assert torch.equal(flat[1], flat_ref[1]), 'v copied as is, nothing else written'
    assert torch.equal(attn.kv_cache[0], ref.kv_cache[0]), 'another layer was written'


def test_warmup_launches_write_nothing():
    """warmup() runs every attention kernel with slot -1 and an empty context: no-ops."""
    attn, _ = _backend('bfloat16', 64, 8, 2)
    before = attn.kv_cache.clone()
    attn.warmup()
    assert torch.equal(attn.kv_cache, before)


def test_model_runner_fused_decode_across_blocks(tiny_ckpt):
    """The tiny model's fused step (every custom kernel, emulated) tracks the torch path.

    A 300-token prompt and 24 teacher-forced decode steps across block boundaries with a
    shuffled block table; logits must agree step by step. The runner's static decode buffers
    feed the kernels directly. Also counts the custom kernels of a decode step: per layer
    two (add+)RMSNorms, q/k-norm + RoPE + KV write, paged decode split + reduce, SiLU x up
    -- plus the final add+RMSNorm.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    tc = model.config.text
    num_blocks, block_size, max_len = 48, 16, 600
    cpu = torch.device('cpu')
    ref = ModelRunner(model, num_blocks, block_size, max_len, cpu, torch.float32)
    launch = CountingLaunch(kernel_emulator.emulated_launch('float32', tc.head_dim))
    runner, ops = kernel_emulator.fused_runner(model, num_blocks, block_size, max_len, launch)
    assert runner.attn.num_splits > 1
    rng = random.Random(0)
    table = rng.sample(range(num_blocks), 22)
    prompt = [rng.randrange(tc.vocab_size) for _ in range(300)]
    steps = kernel_emulator.fused_and_torch_steps(ref, runner, ops, launch, prompt, table, 24)
    want, got = next(steps)
    assert (want - got).abs().max().item() < 1e-4
    for step, (want, got) in enumerate(steps):
        err = (want - got).abs().max().item()
        assert err < 1e-4, f'step {step}: logits differ by {err}'
        assert int(got.argmax()) == int(want.argmax())
    layers = tc.num_hidden_layers
    assert launch.counts == {
        'rms_norm': 1,  # layer 0's input norm (no residual yet)
        'add_rms_norm': 2 * layers,  # the rest, the final norm's residual add included
        'qk_norm_rope_kv_write': layers,
        'paged_decode_split': layers,
        'paged_decode_reduce': layers,
        'silu_and_mul': layers,
    }


class _RandomGrammar:
    """A stand-in grammar: allows a fresh random third of the ids at every step.

    Writes its mask into the runner's host buffer and keeps a copy in ``seen`` (the test's
    ``mask``) so that the expected token can be computed from the same mask.
    """

    def __init__(self, vocab_size, seen, seed):
        self.rng = np.random.default_rng(seed)
        self.vocab_size, self.seen = vocab_size, seen
        self.allowed_ids = set()

    def fill_bitmask(self, out):
        ids = self.rng.choice(self.vocab_size, self.vocab_size // 3, replace=False)
        self.allowed_ids = set(ids.tolist())
        out[:] = host_bitmask(self.vocab_size, allowed=ids)
        self.seen[:] = out

    def allowed(self, token):
        return token in self.allowed_ids

    def accept(self, token):
        assert token in self.allowed_ids


def test_graph_decode_bookkeeping_with_a_fake_graph(tiny_ckpt):
    """CudaGraphDecode on the CPU with a stand-in for its capture (test/cpu_graphs.py).

    The stand-in replays by recomputing into the tensors the capture returned, so this checks
    the bookkeeping, not CUDA: the pointers a graph bakes in stay the same over a whole
    generation and a new sequence (one capture), a changed pointer forces a new capture, the
    replayed logits track the torch backend across block boundaries, and greedy decoding
    through the graph (banned ids masked inside it) picks the sampler's token, and a
    constrained step picks the best token its per-step grammar mask allows, written into the
    static mask buffer before the pick graph replays (no re-capture for a new mask).
    """
    from orin_llm_node.engine.config import SamplingParams
    from orin_llm_node.engine.cuda_graph import CudaGraphDecode
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.engine.sampler import Sampler
    from orin_llm_node.engine.structured import apply_bitmask
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    tc = model.config.text
    launch = kernel_emulator.emulated_launch('float32', tc.head_dim)
    cpu = torch.device('cpu')
    ref = ModelRunner(model, 32, 16, 256, cpu, torch.float32)
    runner = ModelRunner(model, 32, 16, 256, cpu, torch.float32)

    def kernels_backend():
        attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, 256, launch=launch)
        attn.warmup()
        return attn

    runner.attn = kernels_backend()
    runner.decode_graph = CudaGraphDecode(runner)
    runner.decode_graph.capturer = CpuGraphCapture()

    rng = random.Random(1)

    def generate(table, prompt_len, steps, greedy_banned=None, grammar=None):
        prompt = [rng.randrange(tc.vocab_size) for _ in range(prompt_len)]
        pos = np.tile(np.arange(prompt_len), (3, 1))
        token = int(ref.prefill(prompt, pos, table, 0).argmax())
        runner.prefill(prompt, pos, table, 0)
        for step in range(steps):
            context = prompt_len + step + 1
            want = ref.decode(token, context - 1, table, context)
            if greedy_banned is None:
                got = runner.decode(token, context - 1, table, context)
                assert (want - got).abs().max().item() < 1e-4, step
                token = int(want.argmax())
            else:
                sampler = Sampler(SamplingParams(), cpu, greedy_banned, grammar)
                got = runner.decode_sample(token, context - 1, table, context, sampler)
                if grammar is None:
                    assert got == sampler(want) and got not in greedy_banned, step
                else:  # the mask of this step was written before the pick graph replayed
                    masked = apply_bitmask(want, torch.from_numpy(mask))
                    assert got == int(masked.index_fill(0, sampler.banned, -np.inf).argmax())
                    assert grammar.allowed(got) and got not in greedy_banned, step
                    grammar.accept(got)
                token = got

    generate(rng.sample(range(32), 4), 13, 20)  # crosses blocks at 16, 32
    assert runner.decode_graph.captures == 1
    generate(rng.sample(range(32), 3), 5, 12)  # a new sequence: contents change only
    assert runner.decode_graph.captures == 1
    # Greedy inside the graph, banning whatever the unmasked argmax would pick first.
    generate(rng.sample(range(32), 3), 9, 20, greedy_banned={0, 1, 2, 3})
    assert runner.decode_graph.captures == 1
    # A grammar's mask, new every step, applied inside the graph: still the first capture.
    mask = np.zeros(runner.decode_token_mask.numel(), dtype=np.int32)
    generate(rng.sample(range(32), 3), 9, 20, greedy_banned={0, 1}, grammar=_RandomGrammar(
        tc.vocab_size, mask, seed=3))
    assert runner.decode_graph.captures == 1
    runner.attn = kernels_backend()  # new workspace pointers: the graph must be re-captured
    generate(rng.sample(range(32), 2), 7, 3)
    assert runner.decode_graph.captures == 2
