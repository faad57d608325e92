# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The fp16/bf16 (tensor-core) ``paged_prefill`` checked on the CPU through the kernel emulator.

* The emulator's ``mma.sync.aligned.m16n8k16`` against a float64 matrix product, with the
  lanes' fragments built here from the PTX ISA's table (written independently of the
  emulator's inverse mapping).
* The kernel against a float64 reference and against the torch backend (gather + SDPA,
  bottom-right mask) across block and key-tile boundaries, GQA groups that split tokens
  across row tiles, cached prefixes, odd lengths, padding rows, fp16 and bf16.
* Mutation: the kernel with one fragment loaded in another layout must fail -- the emulator
  follows the PTX layouts, so it catches what a GPU would compute wrongly.
* The grid: query-row tiles on ``gridDim.x``, within CUDA's limits for prefills whose tiles
  overflow ``gridDim.y`` (65,535).
"""

import shutil

from _kernel_testing import DTYPES
import kernel_emulator
import numpy as np
import pytest
import torch

from orin_llm_node.attention.cuda_backend import CudaPagedAttention
from orin_llm_node.attention.torch_backend import TorchPagedAttention
from orin_llm_node.kernels import kernel_sources as ks

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason='g++ is needed to build the emulator'
)

TC_DTYPES = ('float16', 'bfloat16')
#: Max |error| against float64: the output's own rounding plus P rounded to the element type
#: before P.V (as flash attention does), far above the fp32 summation differences.
TC_ATOL = {'float16': 2e-3, 'bfloat16': 1.6e-2}


def _bits(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)


def _fragments(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """Per-lane registers of A [16, 16], B [16, 8] and C [16, 8], as the PTX ISA lays them out.

    groupID = lane >> 2, threadID_in_group = lane % 4; A: a_i (i < 8) sits at row groupID for
    i in {0, 1, 4, 5} else groupID + 8, column 2 * threadID_in_group + (i & 1) (+ 8 for i >= 4);
    B: b_i (i < 4) at row 2 * threadID_in_group + (i & 1) (+ 8 for i >= 2), column groupID;
    C: c_i at row groupID (+ 8 for i >= 2), column 2 * threadID_in_group + (i & 1). Two 16-bit
    elements per register, a_{2j} / b_{2j} in the low half of register j.
    """
    ab, bb = _bits(a), _bits(b)
    fa = np.zeros((32, 4), np.uint32)
    fb = np.zeros((32, 2), np.uint32)
    fc = np.zeros((32, 4), np.float32)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            row = group if i in (0, 1, 4, 5) else group + 8
            col = 2 * tig + (i & 1) + (8 if i >= 4 else 0)
            fa[lane, i // 2] |= ab[row, col] << (16 * (i % 2))
        for i in range(4):
            row = 2 * tig + (i & 1) + (8 if i >= 2 else 0)
            fb[lane, i // 2] |= bb[row, group] << (16 * (i % 2))
            fc[lane, i] = c[group + (8 if i >= 2 else 0), 2 * tig + (i & 1)]
    return fa, fb, fc


@pytest.mark.parametrize('dtype', TC_DTYPES)
def test_emulated_mma_follows_the_ptx_fragment_layout(dtype):
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(*shape, generator=gen).to(DTYPES[dtype]) for shape in ((16, 16), (16, 8)))
    c = torch.randn(16, 8, generator=gen)
    fa, fb, fc = _fragments(a, b, c)
    d = kernel_emulator.mma_probe(dtype, fa, fb, fc)
    got = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            got[lane // 4 + (8 if i >= 2 else 0), 2 * (lane % 4) + (i & 1)] = d[lane, i]
    want = (a.double() @ b.double() + c.double()).numpy()
    assert np.abs(got - want).max() < 1e-5
    # The layout matters: the same registers handed to the wrong lanes give another product.
    assert np.abs(kernel_emulator.mma_probe(dtype, fa[::-1].copy(), fb, fc) - d).max() > 0.1


def _backend(dtype, head_dim, hq, hkv, num_blocks=40, seed=0, directory=None):
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, 2, num_blocks, 16, hkv, head_dim, generator=gen).to(DTYPES[dtype])
    attn = CudaPagedAttention(
        kv, hq, 1024, launch=kernel_emulator.emulated_launch(dtype, head_dim, directory))
    attn.warmup()
    return attn, gen


def _reference(kv_layer, q, table, num_prefix, num_new):
    """float64 bottom-right causal GQA attention of the real queries through the block table."""
    hq, d = q.shape[1:]
    hkv = kv_layer.shape[-2]
    t = torch.arange(num_prefix + num_new)
    slots = table[t // 16] * 16 + t % 16
    k = kv_layer[0].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, dim=1)
    v = kv_layer[1].reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum('nhd,thd->nht', q[:num_new].double(), k) * d ** -0.5
    visible = t[None, :] <= num_prefix + torch.arange(num_new)[:, None]
    s = s.masked_fill(~visible[:, None, :], float('-inf'))
    return torch.einsum('nht,thd->nhd', s.softmax(-1), v)


def _prefill(attn, gen, num_prefix, num_new, pad, layer=1):
    """One prefill of random q/k/v through ``attn``: output, queries and block table."""
    table = torch.randperm(attn.kv_cache.shape[2], generator=gen)
    t = torch.arange(num_prefix, num_prefix + num_new)
    slots = torch.cat([table[t // 16] * 16 + t % 16, torch.full((pad,), -1)])
    q, k, v = (torch.randn(num_new + pad, h, attn.head_dim, generator=gen).to(attn.dtype)
               for h in (attn.num_q_heads, attn.num_kv_heads, attn.num_kv_heads))
    attn.prepare(slots, table, num_prefix, num_new)
    return attn.attend(layer, q, k, v), q, table


CASES = [
    # head_dim, hq, hkv, cached prefix, new tokens, padding rows
    (128, 32, 8, 0, 100, 0),  # the 8B's heads (GQA 4), cold prefill over two key tiles
    (128, 16, 8, 200, 37, 0),  # the 2B's GQA 2 after a prefix: bottom-right, mid-block start
    (64, 8, 8, 64, 1, 15),  # MHA, one real token padded to a 16-row bucket
    (64, 20, 4, 13, 29, 3),  # GQA 5: row tiles split tokens; odd lengths and prefix
    (32, 6, 2, 127, 64, 0),  # GQA 3, a prefix ending one key before a tile boundary
    (32, 4, 1, 0, 17, 47),  # GQA 4, whole padding CTAs after the real rows
]


@pytest.mark.parametrize('dtype', TC_DTYPES)
@pytest.mark.parametrize('head_dim,hq,hkv,num_prefix,num_new,pad', CASES)
def test_tensor_core_prefill_matches_reference(dtype, head_dim, hq, hkv, num_prefix, num_new,
                                                pad):
    attn, gen = _backend(dtype, head_dim, hq, hkv)
    out, q, table = _prefill(attn, gen, num_prefix, num_new, pad)
    ref = _reference(attn.kv_cache[1], q, table, num_prefix, num_new)
    err = (out[:num_new].double() - ref).abs().max().item()
    assert err <= TC_ATOL[dtype], f'max |err| {err}'
    assert not out[num_new:].any(), 'padding rows must come out as zeros'


def _expected_mma_ops(head_dim, hkv, group, num_prefix, num_new, padded_rows):
    """Tensor-core ops of one prefill.

    Per KV head and warp of 16 rows with a real row, one pass over each 64-key tile up to its
    own last key (head_dim / 2 mma for Q.K^T and as many for P.V); warps of padding rows score
    nothing.
    """
    ops = 0
    for warp_row0 in range(0, padded_rows * group, 16):
        last_token = min((warp_row0 + 15) // group, padded_rows - 1, num_new - 1)
        if warp_row0 // group < num_new:
            ops += ((num_prefix + last_token) // ks.PREFILL_TC_KV_TILE + 1) * head_dim
    return hkv * ops


@pytest.mark.parametrize('dtype', TC_DTYPES)
def test_fp16_bf16_prefill_runs_on_tensor_cores(dtype):
    """Every score and every P.V product goes through mma.

    And a warp walks only the key tiles its own rows may see (the emulator counts the
    warp-wide mma operations).
    """
    attn, gen = _backend(dtype, 64, 8, 2)
    num_prefix, num_new, pad = 150, 90, 6
    before = kernel_emulator.mma_ops(dtype, 64)
    _prefill(attn, gen, num_prefix, num_new, pad)
    ops = kernel_emulator.mma_ops(dtype, 64) - before
    assert ops == _expected_mma_ops(64, 2, 4, num_prefix, num_new, num_new + pad)


@pytest.mark.parametrize('dtype', TC_DTYPES)
def test_tensor_core_prefill_equals_torch_backend(dtype):
    """The kernel path and the torch backend (gather + SDPA) agree over a chain of prefills."""
    attn, gen = _backend(dtype, 64, 8, 2, num_blocks=24)
    torch_attn = TorchPagedAttention(attn.kv_cache.clone())
    table = torch.randperm(24, generator=gen)
    context = 0
    for n in (70, 1 + 16, 45):  # a cold prefill, then follow-ups over the cached prefix
        t = torch.arange(context, context + n)
        slots = table[t // 16] * 16 + t % 16
        q, k, v = (torch.randn(n, h, 64, generator=gen).to(attn.dtype) for h in (8, 2, 2))
        outs = []
        for backend in (attn, torch_attn):
            backend.prepare(slots, table, context, n)
            outs.append(backend.attend(0, q, k, v).double())
        # Each side rounds once to the element type; the kernel also rounds P.
        assert (outs[0] - outs[1]).abs().max().item() <= 2 * TC_ATOL[dtype], n
        context += n
    assert torch.equal(attn.kv_cache, torch_attn.kv_cache)


# Each mutation loads one operand in a layout the PTX ISA does not have (swapped registers).
MUTATIONS = {
    'Q rows/columns': ('const int h = i % 2, col = 16 * kk + 2 * t + 8 * (i / 2);',
                       'const int h = i / 2, col = 16 * kk + 2 * t + 8 * (i % 2);'),
    'K halves': ('const unsigned int b[2] = {ld_pair(kp), ld_pair(kp + 8)};',
                 'const unsigned int b[2] = {ld_pair(kp + 8), ld_pair(kp)};'),
    'P registers': ('pack2(s[2 * kk][2], s[2 * kk][3]),\n' + ' ' * 35
                    + 'pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),',
                    'pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),\n' + ' ' * 35
                    + 'pack2(s[2 * kk][2], s[2 * kk][3]),'),
    'O rows': ('pack2(o[n][2 * h] / sum, o[n][2 * h + 1] / sum)',
               'pack2(o[n][h] / sum, o[n][h + 2] / sum)'),
}


@pytest.mark.parametrize('mutation', MUTATIONS)
def test_a_wrong_fragment_layout_fails(tmp_path, mutation):
    old, new = MUTATIONS[mutation]
    shutil.copytree(ks.kernels_dir(), tmp_path, dirs_exist_ok=True)
    source = tmp_path / 'paged_prefill.cu'
    text = source.read_text()
    assert text.count(old) == 1, f'mutation {mutation!r} no longer matches the kernel'
    source.write_text(text.replace(old, new))
    attn, gen = _backend('bfloat16', 32, 8, 2, directory=tmp_path)
    out, q, table = _prefill(attn, gen, 21, 40, 0)
    err = (out.double() - _reference(attn.kv_cache[1], q, table, 21, 40)).abs().max().item()
    assert err > 10 * TC_ATOL['bfloat16'], f'{mutation}: max |err| {err} went unnoticed'


@pytest.mark.parametrize('dtype,rows_per_cta', [('float32', ks.PREFILL_ROWS),
                                                ('bfloat16', ks.PREFILL_TC_ROWS)])
def test_row_tiles_are_on_grid_x(dtype, rows_per_cta):
    """Row tiles on x, KV heads on y, every launch within CUDA's grid limits.

    A 262,200-token prefill at GQA 4 in fp32 has 65,550 row tiles: more than gridDim.y holds.
    The launches are checked and recorded, not run (the buffers are never touched).
    """
    hq, hkv, d, n = 4, 1, 32, 262_200
    kv = torch.zeros(1, 2, 1, 16, hkv, d, dtype=DTYPES[dtype])
    grids = []

    def record(name, grid, block, args):
        kernel_emulator.check_grid(name, tuple(grid) + (1,) * (3 - len(grid)))
        grids.append((name, tuple(grid)))

    attn = CudaPagedAttention(kv, hq, n, launch=record)
    attn.warmup()
    grids.clear()
    attn.prepare(torch.full((n,), -1), torch.zeros(-(-n // 16), dtype=torch.long), 0, n)
    q = torch.zeros(1, hq, d, dtype=kv.dtype).expand(n, hq, d)  # no memory behind the rows
    kv_rows = torch.zeros(1, hkv, d, dtype=kv.dtype).expand(n, hkv, d)
    attn.attend(0, q, kv_rows, kv_rows)
    (grid,) = [g for name, g in grids if name == 'paged_prefill']
    assert grid == (-(-n * hq // rows_per_cta), hkv)
    if dtype == 'float32':
        assert grid[0] > kernel_emulator.GRID_LIMITS[1], 'the case must overflow gridDim.y'


def test_emulator_refuses_grids_over_cuda_limits():
    launch = kernel_emulator.emulated_launch('float32', 32)
    with pytest.raises(ValueError, match='gridDim.y'):
        launch('kv_write', (1, 65536), (128,), ())
