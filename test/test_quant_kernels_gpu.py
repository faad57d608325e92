# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The quantized-linear kernels on a GPU (marker ``gpu``; skips without CUDA or CuPy).

Full-size shapes (2B / 8B projections), every format and activation dtype, against a float64
product of the torch path's dequantised weight; the prefill path against the torch path bit
for bit; a GEMV captured in a CUDA graph replaying on new input; and quantized decode of the
tiny model through the engine with graphs equal to eager decode, token for token (both at the
same prefill row counts: _kernel_testing.eager_like). The layers reach the kernels through the
dispatch with every launch counted: a layer that ran its torch path instead fails.
"""

import contextlib

from _kernel_testing import DTYPES, eager_like, skip_without_cuda_kernels
import pytest
import torch

pytestmark = pytest.mark.gpu
skip_without_cuda_kernels()

from orin_llm_node.kernels import dispatch  # noqa: E402
from orin_llm_node.kernels.cuda_ops import (  # noqa: E402
    GEMV_MAX_ROWS,
    FusedOps,
    LaunchCounter,
    kernel_launcher,
)
from orin_llm_node.quantization import Fp8Linear, Int4Linear, Int8Linear  # noqa: E402

DEV = torch.device('cuda')
_RTOL = {'float32': 1e-5, 'bfloat16': 8e-3, 'float16': 1e-3}
LAYERS = {'int8': (Int8Linear, False), 'int4': (Int4Linear, False),
          'int4_asym': (Int4Linear, True), 'fp8': (Fp8Linear, False)}
SHAPES = [(2048, 6144), (6144, 2048), (4096, 1024), (12288, 4096)]  # (in, out)


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture(autouse=True)
def launches():
    """The layers dispatch to the CuPy kernels as a CUDA model runner installs them.

    Installed for ``cuda`` (the current device, as tensors report it), each dtype's kernels
    through a launch counter: ``{dtype name: LaunchCounter}``.
    """
    counters = {}
    with contextlib.ExitStack() as stack:
        for name, dtype in DTYPES.items():
            counters[name] = LaunchCounter(kernel_launcher(dtype, 128, DEV))
            ops = FusedOps(dtype, 128, DEV, launch=counters[name])
            stack.enter_context(dispatch.installed(DEV, dtype, ops))
        yield counters


def _layer(fmt, k, n):
    cls, asym = LAYERS[fmt]
    layer = cls(k, n, group_size=128, asymmetric=asym, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(k + n)
    layer.quantize_from(torch.randn(n, k, device=DEV, generator=gen) / k ** 0.5)
    return layer, gen


@pytest.mark.parametrize('dtype', list(DTYPES))
@pytest.mark.parametrize('k,n', SHAPES)
@pytest.mark.parametrize('fmt', list(LAYERS))
def test_gemv_and_prefill(fmt, k, n, dtype, launches):
    layer, gen = _layer(fmt, k, n)
    for rows in (1, GEMV_MAX_ROWS, 37):
        x = torch.randn(rows, k, device=DEV, generator=gen).to(DTYPES[dtype])
        kernel = f"quant_{'gemv' if rows <= GEMV_MAX_ROWS else 'dequant'}_{layer.format}"
        before = launches[dtype].counts.get(kernel, 0)
        got = layer(x)
        assert launches[dtype].counts.get(kernel, 0) == before + 1, launches[dtype].counts
        if rows <= GEMV_MAX_ROWS:
            want = x.double() @ layer.dequantize(torch.float64).t()
            err = (got.double() - want).abs().max().item()
            assert err <= _RTOL[dtype] * want.abs().max().item()
        else:
            assert torch.equal(got, torch.nn.functional.linear(x, layer.dequantize(x.dtype)))


@pytest.mark.parametrize('fmt', list(LAYERS))
def test_gemv_replays_in_a_cuda_graph(fmt, launches):
    layer, gen = _layer(fmt, 2048, 2048)
    x = torch.randn(1, 2048, device=DEV, generator=gen, dtype=torch.bfloat16)
    layer(x)  # compile and load outside the capture
    assert launches['bfloat16'].total == 1
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    for _ in range(3):
        x.copy_(torch.randn(1, 2048, device=DEV, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(x))


@pytest.mark.parametrize('quantization', ['int8', 'int4', 'fp8'])
def test_engine_graph_equals_eager(tiny_ckpt, quantization):
    from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams

    tokens = {}
    for graph in (True, False):
        eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cuda', dtype='bfloat16',
                                     quantization=quantization, enable_cuda_graph=graph,
                                     block_order_seed=5))
        if not graph:  # the same prefill row counts as the graph engine
            eager_like(eng)
        res = eng.chat(eng.new_conversation(), 'Describe the scene in detail.',
                       sampling=SamplingParams(max_tokens=60, ignore_eos=True))
        tokens[graph] = res.token_ids
        assert eng.uses_cuda_graph == graph
    assert tokens[True] == tokens[False]
