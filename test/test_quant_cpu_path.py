# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The quantized linears' CPU path: tile by tile in reused buffers, same numbers (issue 21).

Before, every CPU call dequantised the whole layer into fresh fp32 tensors (three full-size
allocations per call) and decode ran 4-9x slower than float. The speed is measured by
bench/quant_cpu.py; these tests pin what makes it: no dense weight is built per call, the
work buffers are reused and bounded, and the results are still ``F.linear`` over
``dequantize()``.
"""

import threading

import pytest
import torch
import torch.nn.functional as F

from orin_llm_node.quantization import Fp8Linear, Int4Linear, Int8Linear, QuantLinear, scratch

LAYERS = {
    "int8": (Int8Linear, None, False),
    "int8-g128": (Int8Linear, 128, False),
    "int4": (Int4Linear, 128, False),
    "int4_asym-g32": (Int4Linear, 32, True),
    "fp8": (Fp8Linear, 128, False),
}
K, N = 320, 200  # a 64-column last group; tiles of 16 rows below: 13 tiles, the last short


def _layer(name, bias=False, seed=0):
    cls, group, asym = LAYERS[name]
    layer = cls(K, N, group_size=group or K, bias=bias, asymmetric=asym)
    gen = torch.Generator().manual_seed(seed)
    layer.quantize_from(torch.randn(N, K, generator=gen) / K ** 0.5)
    if bias:
        layer.bias.data.normal_(generator=gen)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(LAYERS))
def test_cpu_decode_reuses_buffers_and_never_builds_the_dense_weight(name, dtype, monkeypatch):
    monkeypatch.setattr(scratch, "TILE_ELEMENTS", 16 * K)
    layers = [_layer(name, bias=True, seed=s) for s in range(2)]
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(9)).to(dtype)
    want = [F.linear(x, m.dequantize(dtype), m.bias.to(dtype)) for m in layers]

    def dense(*args, **kwargs):
        raise AssertionError("the CPU path built the whole dense weight")

    monkeypatch.setattr(QuantLinear, "dequantize", dense)
    got = layers[0](x)
    held = scratch.held_bytes()
    weight = scratch.buffer("weight", 1, torch.float32, x.device)
    # Decode (one row): bit-identical to F.linear over the dequantised weight.
    assert torch.equal(got, want[0])
    assert torch.equal(layers[1](x), want[1])
    assert torch.equal(layers[0](x), want[0])
    # The second layer and the repeated call reused the first call's buffers.
    assert scratch.held_bytes() == held
    assert scratch.buffer("weight", 1, torch.float32, x.device).data_ptr() == weight.data_ptr()
    # A tile's worth of bytes, not a layer's: 4 (fp32) + 2 (codes) + 2 (int4 shifted) + 2
    # (bf16 copy) bytes per tile element at most, whatever else other tests left behind.
    assert held <= 10 * max(scratch.TILE_ELEMENTS, 1 << 20)


@pytest.mark.parametrize("name", list(LAYERS))
def test_cpu_prefill_matches_dense_linear(name):
    """Several rows, 3-D input, bias: F.linear's numbers within fp32 rounding."""
    layer = _layer(name, bias=True)
    x = torch.randn(2, 7, K, generator=torch.Generator().manual_seed(3))
    want = F.linear(x, layer.dequantize(), layer.bias)
    got = layer(x)
    assert got.shape == (2, 7, N)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_buffers_made_under_inference_mode_serve_plain_calls_too():
    layer = _layer("int8")
    x = torch.randn(1, K)
    with torch.inference_mode():
        layer(x)  # the engine runs under inference_mode
    assert torch.equal(layer(x), F.linear(x, layer.dequantize()))


def test_each_thread_has_its_own_buffers():
    mine = scratch.buffer("weight", 8, torch.float32, torch.device("cpu"))
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(
        scratch.buffer("weight", 8, torch.float32, torch.device("cpu")).data_ptr()))
    t.start()
    t.join()
    assert theirs[0] != mine.data_ptr()


def test_fp8_bit_decoding_is_exact_for_every_code_under_flush_to_zero():
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
    torch.set_flush_denormal(True)
    try:
        assert torch.equal(layer.dequantize(), want)
        x = torch.eye(254)[:5]
        assert torch.equal(layer(x), x @ want.t())
    finally:
        torch.set_flush_denormal(False)
