# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``cuda_kernels/paged_prefill.cu`` checked on the CPU through the kernel emulator.

fp32 runs the CUDA-core body, fp16/bf16 the tensor-core one (more of it in
test_tensor_core_prefill_emulated.py).

The kernel is compared with a float64 reference (softmax over the keys each query may see,
read through a shuffled block table), with the torch backend (gather + SDPA with the
bottom-right mask) through ``CudaPagedAttention``, and inside the tiny model's prefill when the
cached prefix ends mid-block and inside an image. Padding rows of a bucketed prefill must
neither write KV nor change the real rows. The GPU run of the same kernel is in
test_cuda_kernels.py.
"""

import random

from _kernel_testing import ATOL, DTYPES
import kernel_emulator
import pytest
import torch

from orin_llm_node.attention.cuda_backend import CudaPagedAttention
from orin_llm_node.attention.torch_backend import TorchPagedAttention
from orin_llm_node.kernels import kernel_sources as ks

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason='g++ is needed to build the emulator'
)



def _kernels(dtype, head_dim, hq, hkv, num_blocks=32, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, 2, num_blocks, block_size, hkv, head_dim, generator=gen)
    attn = CudaPagedAttention(kv.to(DTYPES[dtype]), hq, 512,
                              launch=kernel_emulator.emulated_launch(dtype, head_dim))
    attn.warmup()
    return attn, gen


def _reference(kv_layer, q, table, num_prefix, num_new, block_size):
    """float64 bottom-right causal GQA attention of the real queries through the block table."""
    hq, d = q.shape[1:]
    hkv = kv_layer.shape[-2]
    t = torch.arange(num_prefix + num_new)
    slots = table[t // block_size] * block_size + t % block_size
    k = kv_layer[0].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, dim=1)
    v = kv_layer[1].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum('nhd,thd->nht', q[:num_new].double(), k) * d ** -0.5
    visible = t[None, :] <= num_prefix + torch.arange(num_new)[:, None]  # [n, keys]
    s = s.masked_fill(~visible[:, None, :], float('-inf'))
    return torch.einsum('nht,thd->nhd', s.softmax(-1), v)


@pytest.mark.parametrize(
    'dtype,head_dim,hq,hkv,num_prefix,num_new,pad',
    [
        ('float32', 32, 4, 2, 0, 19, 0),  # cold prefill, no prefix
        ('float32', 32, 4, 4, 37, 2, 14),  # MHA, prefix ends mid-block, padded to 16
        ('bfloat16', 64, 8, 2, 21, 27, 5),  # GQA 4, several key tiles
        ('float16', 128, 20, 2, 50, 9, 23),  # GQA 10: one row tile spans tokens
        ('bfloat16', 128, 4, 4, 64, 33, 31),  # prefix a whole number of blocks
    ],
)
def test_prefill_matches_reference(dtype, head_dim, hq, hkv, num_prefix, num_new, pad):
    block_size = 16
    attn, gen = _kernels(dtype, head_dim, hq, hkv)
    table = torch.randperm(32, generator=gen)
    context = num_prefix + num_new
    t = torch.arange(num_prefix, context)
    slots = torch.cat([table[t // block_size] * block_size + t % block_size,
                       torch.full((pad,), -1)])
    rows = num_new + pad
    q, k, v = (torch.randn(rows, h, head_dim, generator=gen).to(DTYPES[dtype])
               for h in (hq, hkv, hkv))
    before = attn.kv_cache.clone()
    attn.prepare(slots, table, num_prefix, num_new)
    out = attn.attend(1, q, k, v)

    expect_kv = before.clone()
    flat = expect_kv[1].view(2, -1, hkv, head_dim)
    flat[0, slots[:num_new]] = k[:num_new]
    flat[1, slots[:num_new]] = v[:num_new]
    assert torch.equal(attn.kv_cache, expect_kv), 'padding rows must not write KV'
    ref = _reference(attn.kv_cache[1], q, table, num_prefix, num_new, block_size)
    assert out.shape == (rows, hq, head_dim) and out.dtype == DTYPES[dtype]
    err = (out[:num_new].double() - ref).abs().max().item()
    assert err <= ATOL[dtype], f'max |err| {err}'
    assert not out[num_new:].any(), 'padding rows must come out as zeros'


def test_prefill_equals_torch_backend_with_and_without_padding():
    """fp32: the kernel path and the torch backend agree, and padding changes no real row."""
    attn, gen = _kernels('float32', 32, 4, 2)
    torch_attn = TorchPagedAttention(attn.kv_cache.clone())
    table = torch.randperm(32, generator=gen)[:5]
    num_prefix, n = 21, 19
    t = torch.arange(num_prefix, num_prefix + n)
    slots = table[t // 16] * 16 + t % 16
    q, k, v = (torch.randn(n, h, 32, generator=gen) for h in (4, 2, 2))
    outs = []
    for backend in (attn, torch_attn):
        for pad in (0, 13):
            padded = [torch.cat([x, torch.randn(pad, *x.shape[1:], generator=gen)])
                      for x in (q, k, v)]
            backend.prepare(torch.cat([slots, torch.full((pad,), -1)]), table, num_prefix, n)
            out = backend.attend(0, *padded)
            assert not out[n:].any()
            outs.append(out[:n])
    kernel, kernel_padded, ref, ref_padded = outs
    assert torch.equal(kernel, kernel_padded)
    assert torch.equal(ref, ref_padded)
    assert (kernel - ref).abs().max().item() < 2e-5
    assert torch.equal(attn.kv_cache, torch_attn.kv_cache)


def test_prefill_launch_shape_does_not_depend_on_the_lengths():
    """Same grid and shared memory for every length up to a bucket: only seq_info changes.

    Row tiles on gridDim.x, KV heads on gridDim.y.
    """
    attn, gen = _kernels('float32', 32, 6, 2)
    grids = []

    def record(name, grid, block, args):
        if name == 'paged_prefill':
            grids.append((tuple(grid), tuple(block), args[6]))
        launch(name, grid, block, args)

    launch = attn._launch
    attn._launch = record
    table = torch.randperm(32, generator=gen)
    for num_prefix, n in ((5, 3), (40, 16), (0, 9)):
        slots = torch.full((16,), -1)
        t = torch.arange(num_prefix, num_prefix + n)
        slots[:n] = table[t // 16] * 16 + t % 16
        attn.prepare(slots, table, num_prefix, n)
        attn.attend(0, *(torch.randn(16, h, 32, generator=gen) for h in (6, 2, 2)))
    assert len(set(grids)) == 1
    assert grids[0][0] == (-(-16 * 3 // ks.prefill_rows('float32')), 2)


@pytest.mark.parametrize('cached', [0, 13, 29, 45])
def test_tiny_model_through_every_fused_kernel(tiny_ckpt, cached):
    """The tiny model's prefills and decode with every custom kernel (emulated) vs torch.

    Prompt: 10 text tokens, a 64-token image (grid 1x16x16, pads at 10..73, 3-D M-RoPE
    positions whose t/h/w differ), 23 text tokens. The first ``cached`` tokens are prefilled
    first (13 and 29 end inside the image and mid-block, 45 mid-block; 0 is a cold prefill),
    then the rest with the uncached image rows' vision embeddings and DeepStack features; then
    an 11-token text follow-up padded to the 16-token bucket (5 padding rows at slot -1), then
    greedy decode steps across a block boundary. The fused runner runs RMSNorm, add+RMSNorm and
    SiLU x up as kernels for every row, q/k-norm + M-RoPE + KV write as one kernel and
    attention as paged prefill (any call of more than one row) or paged decode; the reference
    runner is the plain torch path. Logits, greedy tokens and the whole KV cache must agree.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.engine.prefill_graph import PrefillGraphs
    from orin_llm_node.kernels import dispatch
    from orin_llm_node.models.loader import load_model
    from orin_llm_node.processing.rope_index import rope_delta, rope_positions

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    cfg = model.config
    tc, layers = cfg.text, cfg.text.num_hidden_layers
    cpu = torch.device('cpu')
    rng = random.Random(cached)
    text = [t for t in range(tc.vocab_size) if t != cfg.image_token_id]
    grid = (1, 16, 16)  # 256 patches -> 64 merged tokens
    image_span = (10, 74)
    prompt = ([rng.choice(text) for _ in range(10)] + [cfg.image_token_id] * 64
              + [rng.choice(text) for _ in range(23)])
    follow_up = [rng.choice(text) for _ in range(11)]
    pos, _ = rope_positions(prompt + follow_up, [grid], cfg.image_token_id,
                            cfg.vision.spatial_merge_size)
    assert (pos[0, 10:74] != pos[1, 10:74]).any() and (pos[1, 10:74] != pos[2, 10:74]).any()
    delta = rope_delta(pos)
    v = cfg.vision
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    pixels = torch.randn(256, patch, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        visual = model.encode_images(pixels, torch.tensor([grid]))
    table = rng.sample(range(24), 9)
    launch = kernel_emulator.CountingLaunch(kernel_emulator.emulated_launch('float32',
                                                                            tc.head_dim))
    ref = ModelRunner(model, 24, 16, 256, cpu, torch.float32)
    fused, ops = kernel_emulator.fused_runner(model, 24, 16, 256, launch)
    fused.prefill_graphs = PrefillGraphs(fused, (16, 32))

    def both(call):
        want = call(ref)
        launch.counts.clear()
        with dispatch.installed(cpu, torch.float32, ops):
            got = call(fused)
        err = (want - got).abs().max().item()
        assert err < 1e-4, err
        assert int(got.argmax()) == int(want.argmax())
        return int(want.argmax()), dict(launch.counts)

    prefill_counts = {'qk_norm_rope_kv_write': layers, 'paged_prefill': layers,
                      'silu_and_mul': layers}
    lo, hi = image_span
    if cached:
        _, counts = both(lambda r: r.prefill(prompt[:cached], pos[:, :cached], table, 0,
                                             visual[: max(0, min(cached, hi) - lo)]))
        assert {k: counts.get(k) for k in prefill_counts} == prefill_counts, counts
    rows = slice(max(0, cached - lo), None)
    _, counts = both(lambda r: r.prefill(prompt[cached:], pos[:, cached:len(prompt)], table,
                                         cached, visual[rows]))
    assert {k: counts.get(k) for k in prefill_counts} == prefill_counts, counts
    assert not {'kv_write', 'paged_decode_split'} & counts.keys(), counts

    start = len(prompt)
    token, counts = both(lambda r: r.prefill(follow_up, pos[:, start:], table, start))
    assert counts == {'rms_norm': 1, 'add_rms_norm': 2 * layers, **prefill_counts}, counts
    assert launch.last_args['paged_prefill'][6] == 16, 'the follow-up runs padded to its bucket'
    context = start + len(follow_up)
    for _ in range(12):  # 108 -> 120 tokens: crosses the block boundary at 112
        context += 1
        token, _ = both(lambda r, c=context, t=token: r.decode(t, c - 1 + delta, table, c))
    kv_err = (ref.kv_cache - fused.kv_cache).abs().max().item()
    assert kv_err < 1e-4, f'KV caches differ by {kv_err} (a padding row written?)'
