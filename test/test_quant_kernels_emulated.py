# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``cuda_kernels/quant_linear.cu`` on the CPU (kernel emulator) against the torch path.

``FusedOps(..., launch=emulated_launch(...))`` is installed through ``kernels.dispatch``, so
``layer(x)`` runs the product wrapper (``cuda_ops.FusedOps.quant_linear``: grids, argument
lists, the GEMV / dequantise + matmul split) with the kernels compiled as host C++. The GEMV
is compared with a float64 product of the torch path's fp32 dequantised weight; the dequantise
kernel must reproduce the torch path's dense weight bit for bit. GPU-only properties (speed,
alignment faults) are not covered here.
"""

import kernel_emulator
import pytest
import torch

from orin_llm_node.kernels import dispatch
from orin_llm_node.kernels.cuda_ops import GEMV_MAX_ROWS, FusedOps
from orin_llm_node.quantization import Fp8Linear, Int4Linear, Int8Linear

pytestmark = pytest.mark.skipif(
    not kernel_emulator.compiler_available(), reason='g++ is needed to build the emulator'
)

_DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
# Relative to max |y|: fp32 accumulation, one rounding of the output to the dtype.
_RTOL = {'float32': 1e-5, 'bfloat16': 8e-3, 'float16': 1e-3}


def _emulated(dtype, launch=None):
    """The emulated kernels installed for CPU tensors of ``dtype`` (a ``with`` block)."""
    torch_dtype = _DTYPES[dtype]
    launch = launch or kernel_emulator.emulated_launch(dtype, 128)
    return dispatch.installed('cpu', torch_dtype,
                              FusedOps(torch_dtype, 128, torch.device('cpu'), launch=launch))


def _layer(cls, k, n, group, asym=False, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    layer = cls(k, n, group_size=group, bias=bias, asymmetric=asym)
    layer.quantize_from(torch.randn(n, k, generator=gen) / k ** 0.5)
    if bias:
        layer.bias.data.copy_(torch.randn(n, generator=gen))
    return layer, gen


CASES = [
    (Int8Linear, 64, 96, 64, False),     # per channel
    (Int8Linear, 256, 40, 128, False),   # groups of 128
    (Int4Linear, 256, 72, 128, False),
    (Int4Linear, 160, 64, 128, True),    # a 32-column last group, asymmetric
    (Int4Linear, 64, 128, 32, True),
    (Fp8Linear, 384, 200, 128, False),   # partial 128-row block
    (Fp8Linear, 48, 64, 128, False),     # in < 128: one block column of 48
]
IDS = [f"{c.format}-k{k}-n{n}-g{g}{'-asym' if a else ''}" for c, k, n, g, a in CASES]


@pytest.mark.parametrize('dtype', list(_DTYPES))
@pytest.mark.parametrize('cls,k,n,group,asym', CASES, ids=IDS)
def test_gemv_matches_torch_path(cls, k, n, group, asym, dtype):
    layer, gen = _layer(cls, k, n, group, asym)
    assert layer.kernel_supported()
    for rows in (1, GEMV_MAX_ROWS - 1):
        x = torch.randn(rows, k, generator=gen).to(_DTYPES[dtype])
        with _emulated(dtype):
            got = layer(x)
        assert got.dtype == x.dtype and got.shape == (rows, n)
        want = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
        err = (got.double() - want).abs().max().item()
        assert err <= _RTOL[dtype] * want.abs().max().item(), f'{rows} rows: |diff| {err:.3g}'


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('cls,k,n,group,asym', CASES, ids=IDS)
def test_prefill_dequantise_is_bit_exact(cls, k, n, group, asym, dtype):
    """More rows than the GEMV serves: dense scratch weight (kernel) + F.linear."""
    layer, gen = _layer(cls, k, n, group, asym)
    x = torch.randn(2, GEMV_MAX_ROWS + 3, k, generator=gen).to(_DTYPES[dtype])
    with _emulated(dtype):
        got = layer(x)
    assert torch.equal(got, layer(x))  # layer(x) outside: the torch path


def test_fp8_decodes_every_code():
    """All 254 finite e4m3 codes (subnormals, both zeros, +-448) decode like torch's cast."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    layer = Fp8Linear(256, 2, bias=False)
    layer.qweight.copy_(torch.cat([codes, codes[:2]]).view(1, 256).repeat(2, 1))
    layer.scale.fill_(1.0)
    x = torch.eye(256)[: GEMV_MAX_ROWS + 4]  # dequantise path; row i picks column i
    with _emulated('float32'):
        got = layer(x)
        want = codes[: GEMV_MAX_ROWS + 4].view(torch.float8_e4m3fn).float()
        assert torch.equal(got[:, 0], want)
        # ... and through the GEMV, one column at a time.
        for i in range(0, 254, 37):
            onehot = torch.zeros(1, 256)
            onehot[0, i] = 1.0
            assert layer(onehot)[0, 0].item() == codes[i:i + 1].view(torch.float8_e4m3fn).item()


def test_unsupported_shape_takes_torch_path():
    layer, gen = _layer(Int4Linear, 200, 16, 128)  # 200 is not a multiple of 32
    assert not layer.kernel_supported()
    x = torch.randn(1, 200, generator=gen)
    want = layer(x)
    def fail(*args):
        pytest.fail('kernel launched for an unsupported shape')

    with _emulated('float32', fail):
        assert torch.equal(layer(x), want)


def test_emulator_checks_argument_types():
    """The wrapper passes C-typed scalars; a wrong type would fail here, not silently."""
    launch = kernel_emulator.emulated_launch('float32', 128)
    layer, _ = _layer(Int8Linear, 64, 8, 64)
    out = torch.empty(1, 8)
    x = torch.zeros(1, 64)
    with pytest.raises(TypeError, match='int32'):
        launch('quant_gemv_int8', (2, 1), (128,),
               (out.data_ptr(), x.data_ptr(), layer.qweight.data_ptr(), layer.scale.data_ptr(),
                0, 0, 8, 64, 1, 64, 64, 8))


@pytest.mark.parametrize('quantization', ['int8', 'int4_asym', 'fp8'])
def test_fused_step_with_quantized_projections(tiny_ckpt, quantization, monkeypatch):
    """The tiny model's merged quantized layers inside the fused step, every kernel emulated.

    A CPU model runner with the CUDA attention backend and ``FusedOps`` (norms, q/k-norm + RoPE
    + KV write, paged decode, SiLU x up, quantized GEMV / dequantise) runs a prefill (dequantise
    kernel + F.linear) and teacher-forced decode steps across block boundaries (GEMV feeding
    the fused kernels); logits track the torch path step by step, and each decode step runs
    the four quantized projections of every layer through the GEMV.
    """
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.models import load_model
    from orin_llm_node.quantization import QuantLinear

    # The emulated kernels read the layers' canonical codes, which a CPU load would move to
    # the CPU layout (quantization/cpu_layout.py) as each layer completes: keep them.
    monkeypatch.setattr(QuantLinear, 'use_cpu_layout', lambda self: None)
    model = load_model(tiny_ckpt, dtype=torch.float32, quantization=quantization).eval()
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.kernel_supported() for m in layers)
    tc = model.config.text
    cpu = torch.device('cpu')
    num_blocks, block_size, max_len = 16, 16, 128
    ref = ModelRunner(model, num_blocks, block_size, max_len, cpu, torch.float32)
    launch = kernel_emulator.CountingLaunch(
        kernel_emulator.emulated_launch('float32', tc.head_dim))
    runner, ops = kernel_emulator.fused_runner(model, num_blocks, block_size, max_len, launch)
    # 20 prompt tokens and 14 decode steps (contexts 21..34) cross the block boundary at 32.
    steps = kernel_emulator.fused_and_torch_steps(ref, runner, ops, launch, list(range(3, 23)),
                                                  [5, 2, 9, 0], 14)
    want, got = next(steps)
    assert launch.counts[f'quant_dequant_{layers[0].format}'] == len(layers)
    assert (want - got).abs().max().item() <= 1e-4 * want.abs().max().item()
    for step, (want, got) in enumerate(steps):
        err = (want - got).abs().max().item()
        assert err <= 1e-4 * want.abs().max().item(), f'step {step}: logits differ by {err}'
        assert launch.counts[f'quant_gemv_{layers[0].format}'] == 4 * tc.num_hidden_layers
        assert launch.counts['paged_decode_split'] == tc.num_hidden_layers
