# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The quantized linears' CPU path: codes in the CPU layout, multiplied without a dense weight.

Dequantising tiles of output rows into fp32 and calling ``F.linear`` per tile made decode
up to 3x slower than float on a quiet core (bench/quant_cpu.py measures it). A CPU layer now
moves its codes, once loaded, to the input-major CPU layout (quantization/cpu_layout.py), and
decode runs fbgemm's embedding-bag kernels over the codes (INT8, INT4) or decodes whole groups
and multiplies them by one batched GEMV (FP8). These tests pin what makes it fast -- one
kernel call and nothing weight-sized besides it (INT), four passes over a reused tile and no
scale pass (FP8), decode cheaper than float's GEMV -- and that its numbers are the quantized
layer's: the same weights, and results at least as close to the exact product as ``F.linear``
over ``dequantize()`` (not bit-identical: the bags sum shorter runs than the BLAS does).
"""

import statistics
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from orin_llm_node.quantization import Fp8Linear, Int4Linear, Int8Linear, cpu_layout, scratch

LAYERS = {  # name: (class, group size (None: per channel), asymmetric)
    'int8': (Int8Linear, None, False),
    'int8-g128': (Int8Linear, 128, False),
    'int4': (Int4Linear, 128, False),
    'int4_asym-g32': (Int4Linear, 32, True),
    'int4_asym': (Int4Linear, 128, True),
    'int4_asym-channel': (Int4Linear, None, True),
    'fp8': (Fp8Linear, 128, False),
}


def _layer(name, k, n, bias=False, seed=0, cpu_layout_=True):
    cls, group, asym = LAYERS[name]
    layer = cls(k, n, group_size=group or k, bias=bias, asymmetric=asym)
    gen = torch.Generator().manual_seed(seed)
    layer.quantize_from(torch.randn(n, k, generator=gen) / k ** 0.5)
    if bias:
        layer.bias.data.normal_(generator=gen)
    if cpu_layout_:
        layer.use_cpu_layout()  # what the loader does once a CPU layer has loaded
    return layer


def _exact_weight(layer) -> torch.Tensor:
    """A canonical layer's weight in float64 from its codes, zero points and scales."""
    n, k, gs = layer.out_features, layer.in_features, layer.group_size
    codes = torch.empty(n, k)
    layer._codes_into(codes, 0, lambda role, numel, dtype: torch.empty(numel, dtype=dtype))
    w = codes.double()
    if layer.zero is not None:
        w -= layer.zero.double().repeat_interleave(gs, 1)[:, :k]
    return w * layer.scale.double().repeat_interleave(gs, 1)[:, :k] * layer.code_unit


@pytest.mark.parametrize('name', list(LAYERS))
@pytest.mark.parametrize('k,n', [(320, 201), (48, 64), (1000, 96)])
def test_cpu_layout_keeps_the_weights(name, k, n):
    """Odd output counts, short last groups, ``in`` < 128: the same weights, no extra bytes."""
    layer = _layer(name, k, n, cpu_layout_=False)
    want = layer.dequantize()
    before = sum(b.numel() * b.element_size() for b in layer.buffers())
    layer.use_cpu_layout()
    assert layer.qweight is None and layer.cpu_codes is not None
    assert torch.equal(layer.dequantize(), want)
    after = sum(b.numel() * b.element_size() for b in layer.buffers())
    # A scale + offset per input column (8 bytes), asymmetric INT4's zero points once more.
    assert after <= before + 8 * k + n * layer.num_groups


@pytest.mark.parametrize('name', [n for n in LAYERS if n != 'int4_asym-channel'])
@pytest.mark.parametrize('k', [1024, 3072])
def test_decode_is_as_exact_as_dense_linear(name, k):
    """Against the exact product (float64), decode is at least as close as ``F.linear``.

    Mean |error| over several layers and 1-4 activation rows (the decode path), with a bias;
    the bags' short sums make it closer than the BLAS's the wider the layer.
    """
    ours, dense = [], []
    for seed in range(4):
        layer = _layer(name, k, 256, bias=True, seed=seed, cpu_layout_=False)
        exact = _exact_weight(layer)
        w = layer.dequantize()
        layer.use_cpu_layout()
        x = torch.randn(1 + seed % cpu_layout.DECODE_MAX_ROWS, k,
                        generator=torch.Generator().manual_seed(10 + seed))
        want = x.double() @ exact.t() + layer.bias.double()
        ours.append((layer(x).double() - want).abs().mean().item())
        dense.append((F.linear(x, w, layer.bias).double() - want).abs().mean().item())
    assert statistics.mean(ours) <= 1.25 * statistics.mean(dense), (ours, dense)


@pytest.mark.parametrize('name', list(LAYERS))
def test_narrow_layers_stay_within_float_rounding(name):
    """Under 1024 input columns the bag sums lose their edge: within 2.5x of ``F.linear``."""
    layer = _layer(name, 320, 200, bias=True, cpu_layout_=False)
    exact, w = _exact_weight(layer), layer.dequantize()
    layer.use_cpu_layout()
    x = torch.randn(3, 320, generator=torch.Generator().manual_seed(1))
    want = x.double() @ exact.t() + layer.bias.double()
    ours = (layer(x).double() - want).abs().mean().item()
    assert ours <= 2.5 * (F.linear(x, w, layer.bias).double() - want).abs().mean().item()


@pytest.mark.parametrize('name', ['int8', 'int4_asym-g32', 'fp8'])
def test_low_precision_activations_are_rounded_once(name):
    """bf16 activations: computed in fp32 over the exact weights, rounded once to bf16."""
    layer = _layer(name, 320, 200, bias=True, cpu_layout_=False)
    exact = _exact_weight(layer)
    layer.use_cpu_layout()
    x = torch.randn(2, 320, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = layer(x)
    assert got.dtype == torch.bfloat16
    want = (x.double() @ exact.t() + layer.bias.double()).bfloat16()
    assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()


@pytest.mark.parametrize('name', list(LAYERS))
def test_cpu_prefill_matches_dense_linear(name):
    """More rows than the decode path takes, 3-D input, bias: ``F.linear``'s numbers."""
    layer = _layer(name, 320, 200, bias=True, cpu_layout_=False)
    x = torch.randn(2, 7, 320, generator=torch.Generator().manual_seed(3))
    want = F.linear(x, layer.dequantize(), layer.bias)
    layer.use_cpu_layout()
    got = layer(x)
    assert got.shape == (2, 7, 200)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _Census(TorchDispatchMode):
    """Every aten / quantized op a call dispatches, with the elements it writes."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and not func.__name__.startswith('empty'):
            written = sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            self.ops.append((func.__name__, written))
        return out


@pytest.fixture(scope='module')
def census_ckpt(make_ckpt):
    # gate_up 2048 x 256, down 256 x 1024: tiles of the old path were weight-sized.
    return make_ckpt('quant-cpu-census', text_config={'hidden_size': 256,
                                                       'intermediate_size': 1024})


@pytest.mark.parametrize('quantization', ['int8', 'int4', 'int4_asym'])
@pytest.mark.parametrize('rows', [1, 4])
def test_int_decode_reads_the_codes_once(census_ckpt, quantization, rows):
    """A loaded CPU layer decodes with one fbgemm bag-kernel call over its codes.

    Every other op writes fewer elements than torch would split over threads: no float
    tile, and no parallel region that waits on a descheduled thread when the cores are
    shared.
    """
    from orin_llm_node.models import load_model

    model = load_model(census_ckpt, quantization=quantization)
    mlp = model.language_model.layers[0].mlp
    for proj in (mlp.gate_up_proj, mlp.down_proj):
        x = torch.randn(rows, proj.input_size)
        with _Census() as census:
            proj(x)
        bags = [op for op in census.ops if op[0].startswith('embedding_bag')]
        assert len(bags) == 1, census.ops
        big = [op for op in census.ops if op not in bags and op[1] > cpu_layout.SERIAL_ELEMENTS]
        assert not big, big


@pytest.mark.parametrize('rows', [1, 4])
def test_fp8_decode_makes_four_passes_over_a_tile(census_ckpt, rows):
    """FP8 decode: e4m3 -> int16, x 2^7, clear bit 14, -> fp32, then one bmm per tile.

    The scales are applied to the group sums, not to the tile: one pass less than scaling
    the weights.
    """
    from orin_llm_node.models import load_model

    model = load_model(census_ckpt, quantization='fp8')
    proj = model.language_model.layers[0].mlp.gate_up_proj
    weights = proj.input_size * proj.output_size
    x = torch.randn(rows, proj.input_size)
    with _Census() as census:
        proj(x)
    written = sum(n for _, n in census.ops)  # the group sums, scaled and added: a few %
    assert 4 * weights <= written <= 4.25 * weights, census.ops


def _cpu_seconds(fn) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


@pytest.mark.skipif('fbgemm' not in torch.backends.quantized.supported_engines,
                    reason="fbgemm's bag kernels are x86 only (elsewhere a reference loop)")
def test_int_decode_costs_less_cpu_time_than_float():
    """INT8 / INT4 decode takes at most 0.8x the CPU time of float's GEMV.

    One thread, a weight set beyond the last-level cache (as a model's); about 0.3x measured
    on a shared 2-core x86, where the tile path took 1.0-1.6x. CPU time of turns taken in
    rotation: other processes' load lands on every format alike and waiting does not count.
    """
    shapes = [(4096, 1024)] * 6  # 96 MB of fp32
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) / k ** 0.5 for n, k in shapes]
    x = torch.randn(1, 1024, generator=gen)
    layers = {}
    for name in ('int8', 'int4', 'int4_asym'):
        cls, group, asym = LAYERS[name]
        layers[name] = [cls(w.shape[1], w.shape[0], group_size=group or w.shape[1],
                            asymmetric=asym) for w in weights]
        for layer, w in zip(layers[name], weights, strict=True):
            layer.quantize_from(w)
            layer.use_cpu_layout()
    turns = {'float': lambda: [F.linear(x, w) for w in weights]}
    turns.update({name: (lambda ls=ls: [layer(x) for layer in ls]) for name, ls in layers.items()})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            seconds = {name: [] for name in turns}
            for _ in range(15):
                for name, fn in turns.items():
                    seconds[name].append(_cpu_seconds(fn))
    finally:
        torch.set_num_threads(threads)
    flt = statistics.median(seconds['float'])
    ratios = {name: statistics.median(s) / flt for name, s in seconds.items() if name in layers}
    assert all(r <= 0.8 for r in ratios.values()), ratios


def test_buffers_made_under_inference_mode_serve_plain_calls_too():
    layer = _layer('fp8', 320, 200)
    x = torch.randn(1, 320)
    with torch.inference_mode():
        want = layer(x)  # the engine runs under inference_mode
    assert torch.equal(layer(x), want)
    x7 = torch.randn(7, 320)  # the prefill path's buffers too
    with torch.inference_mode():
        want = layer(x7)
    assert torch.equal(layer(x7), want)


def test_fp8_decode_reuses_its_buffers():
    """Two layers and repeated calls: the same tile buffers, a tile's worth of bytes."""
    layers = [_layer('fp8', 1024, 512, seed=s) for s in range(2)]
    x = torch.randn(1, 1024)
    layers[0](x)
    held = scratch.held_bytes()
    weight = scratch.buffer('weight', 1, torch.float32, x.device)
    layers[1](x)
    layers[0](x)
    assert scratch.held_bytes() == held
    assert scratch.buffer('weight', 1, torch.float32, x.device).data_ptr() == weight.data_ptr()
    # fp32 tile + int16 codes (+ int16 shifted nibbles of INT4) per tile element at most,
    # whatever else other tests left behind.
    assert held <= 8 * max(scratch.TILE_ELEMENTS, 128 * 512)


def test_each_thread_has_its_own_buffers():
    mine = scratch.buffer('weight', 8, torch.float32, torch.device('cpu'))
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(
        scratch.buffer('weight', 8, torch.float32, torch.device('cpu')).data_ptr()))
    t.start()
    t.join()
    assert theirs[0] != mine.data_ptr()


@pytest.mark.parametrize('layout', ['canonical', 'cpu'])
def test_fp8_bit_decoding_is_exact_for_every_code_under_flush_to_zero(layout):
    """Every finite e4m3 code, subnormals too, decodes like torch's cast, also under FTZ.

    The CPU path decodes e4m3 by moving bits into fp16; denormals are flushed as in CUDA's
    ``-ftz=true``.
    """
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    layer = Fp8Linear(254, 3)
    layer.qweight.copy_(codes.view(1, -1).repeat(3, 1))
    layer.scale.copy_(torch.tensor([[1.0, 1.0], [0.5, 2.0], [3.0, 1e-3]]))
    want = codes.view(torch.float8_e4m3fn).float() * layer.scale.repeat_interleave(128, 1)[:, :254]
    assert (want[0] != 0).sum() == 252 and want[0].abs().min() == 0  # subnormals present
    if layout == 'cpu':
        layer.use_cpu_layout()
    torch.set_flush_denormal(True)
    try:
        assert torch.equal(layer.dequantize(), want)
        x = torch.eye(254)
        assert torch.equal(layer(x[:5]), x[:5] @ want.t())
        for i in range(0, 254, 37):  # one row: the decode path, column i of every row
            assert torch.equal(layer(x[i:i + 1])[0], want[:, i])
    finally:
        torch.set_flush_denormal(False)
