# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``cuda_kernels/paged_prefill.cu`` checked on the CPU through the kernel emulator.

The kernel is compared with a float64 reference (softmax over the keys each query may see,
read through a shuffled block table), with the torch backend (gather + SDPA with the
bottom-right mask) through ``CudaPagedAttention``, and inside the tiny model's prefill when the
cached prefix ends mid-block and inside an image. Padding rows of a bucketed prefill must
neither write KV nor change the real rows. The GPU run of the same kernel is in
test_cuda_kernels.py.
"""

import random

import kernel_emulator
import numpy as np
import pytest
import torch

from orin_llm_node import kernel_sources as ks
from orin_llm_node.attention.cuda_backend import CudaPagedAttention
from orin_llm_node.attention.torch_backend import TorchPagedAttention

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason="g++ is needed to build the emulator"
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The kernel accumulates in fp32 and rounds the output to the dtype once.
_ATOL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


def _kernels(dtype, head_dim, hq, hkv, num_blocks=32, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, 2, num_blocks, block_size, hkv, head_dim, generator=gen)
    attn = CudaPagedAttention(kv.to(_DTYPES[dtype]), hq, 512,
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
    s = torch.einsum("nhd,thd->nht", q[:num_new].double(), k) * d ** -0.5
    visible = t[None, :] <= num_prefix + torch.arange(num_new)[:, None]  # [n, keys]
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("nht,thd->nhd", s.softmax(-1), v)


@pytest.mark.parametrize(
    "dtype,head_dim,hq,hkv,num_prefix,num_new,pad",
    [
        ("float32", 32, 4, 2, 0, 19, 0),  # cold prefill, no prefix
        ("float32", 32, 4, 4, 37, 2, 14),  # MHA, prefix ends mid-block, padded to 16
        ("bfloat16", 64, 8, 2, 21, 27, 5),  # GQA 4, several key tiles
        ("float16", 128, 20, 2, 50, 9, 23),  # GQA 10: one row tile spans tokens
        ("bfloat16", 128, 4, 4, 64, 33, 31),  # prefix a whole number of blocks
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
    q, k, v = (torch.randn(rows, h, head_dim, generator=gen).to(_DTYPES[dtype])
               for h in (hq, hkv, hkv))
    before = attn.kv_cache.clone()
    attn.prepare(slots, table, num_prefix, num_new)
    out = attn.attend(1, q, k, v)

    expect_kv = before.clone()
    flat = expect_kv[1].view(2, -1, hkv, head_dim)
    flat[0, slots[:num_new]] = k[:num_new]
    flat[1, slots[:num_new]] = v[:num_new]
    assert torch.equal(attn.kv_cache, expect_kv), "padding rows must not write KV"
    ref = _reference(attn.kv_cache[1], q, table, num_prefix, num_new, block_size)
    assert out.shape == (rows, hq, head_dim) and out.dtype == _DTYPES[dtype]
    err = (out[:num_new].double() - ref).abs().max().item()
    assert err <= _ATOL[dtype], f"max |err| {err}"
    assert not out[num_new:].any(), "padding rows must come out as zeros"


def test_prefill_equals_torch_backend_with_and_without_padding():
    """fp32: the kernel path and the torch backend agree, and padding changes no real row."""
    attn, gen = _kernels("float32", 32, 4, 2)
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
    """Same grid and shared memory for every length up to a bucket: only seq_info changes."""
    attn, gen = _kernels("float32", 32, 4, 2)
    grids = []

    def record(name, grid, block, args):
        if name == "paged_prefill":
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
        attn.attend(0, *(torch.randn(16, h, 32, generator=gen) for h in (4, 2, 2)))
    assert len(set(grids)) == 1
    assert grids[0][0] == (2, -(-16 * 2 // ks.PREFILL_ROWS))


@pytest.mark.parametrize("cached", [0, 13, 29, 45])
def test_model_prefill_through_the_kernel_with_prefix_inside_an_image(tiny_ckpt, cached):
    """The tiny model prefilling a suffix whose cached prefix ends inside an image span.

    Prompt: 10 text tokens, a 64-token image (pads at 10..73), 23 text tokens. The first
    ``cached`` tokens are prefilled first (13 and 29 end inside the image and mid-block, 45 too,
    0 is a cold prefill); then the rest, with the uncached image rows' vision embeddings and
    DeepStack features, runs through the paged prefill kernel. Logits and KV must track the
    torch backend run on the same shuffled block table.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models.loader import load_model

    model = load_model(tiny_ckpt, dtype=torch.float32).eval()
    cfg = model.config
    tc = cfg.text
    rng = random.Random(cached)
    text = [t for t in range(tc.vocab_size) if t not in (cfg.image_token_id,)]
    prompt = ([rng.choice(text) for _ in range(10)] + [cfg.image_token_id] * 64
              + [rng.choice(text) for _ in range(23)])
    image_span = (10, 74)
    grid = (1, 16, 16)  # 256 patches -> 64 merged tokens
    v = cfg.vision
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    pixels = torch.randn(256, patch, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        visual = model.encode_images(pixels, torch.tensor([grid]))
    pos = np.tile(np.arange(len(prompt)), (3, 1))
    table = rng.sample(range(24), 7)
    logits = []
    runners = []
    for use_kernel in (False, True):
        runner = ModelRunner(model, 24, 16, 256, torch.device("cpu"), torch.float32)
        if use_kernel:
            runner.attn = CudaPagedAttention(
                runner.kv_cache, tc.num_attention_heads, 256,
                launch=kernel_emulator.emulated_launch("float32", tc.head_dim),
            )
            runner.attn.warmup()
        if cached:
            lo, hi = image_span
            runner.prefill(prompt[:cached], pos[:, :cached], table, 0,
                           visual[: max(0, min(cached, hi) - lo)])
        rows = slice(max(0, cached - image_span[0]), None)
        logits.append(runner.prefill(prompt[cached:], pos[:, cached:], table, cached,
                                     visual[rows]))
        runners.append(runner)
    err = (logits[0] - logits[1]).abs().max().item()
    assert err < 1e-4, err
    assert int(logits[0].argmax()) == int(logits[1].argmax())
    kv_err = (runners[0].kv_cache - runners[1].kv_cache).abs().max().item()
    assert kv_err < 1e-4, kv_err
