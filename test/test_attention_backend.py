# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``attention_backend`` (auto | cuda | torch): the one factory's choice, on the CPU.

The seam is the factory's ``launcher(dtype, head_dim, device)``, the CuPy build: the CPU
kernel emulator's builds real (emulated) kernels, and ``cuda_ops.kernel_launcher`` fails for
real on a machine without CUDA, as CuPy does on a GPU machine whose NVRTC, headers or driver
do not fit. Launchers that raise CuPy's own messages stand for the failures a CPU cannot cause.
"""

import logging

import kernel_emulator
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine
from orin_llm_node.kernels import backend_factory, cuda_ops, dispatch
from orin_llm_node.kernels.backend_factory import make_attention_backend

HEADS = 4
KV = (2, 2, 8, 16, 2, 32)  # layers, K/V, blocks, block_size, KV heads, head_dim
CPU = torch.device('cpu')
#: What CuPy 14 raises when it finds no CUDA headers (cupy/_core/core.pyx).
NO_HEADERS = ('Failed to find CUDA headers. Please install CUDA toolkit headers (e.g., pip '
              'install cupy-cuda12x[ctk]) or specify CUDA_PATH environment variable.')


def _kv():
    return torch.zeros(KV)


def _failing_build(*_args):
    raise RuntimeError(NO_HEADERS)


def _must_not_build(*_args):
    pytest.fail('the CuPy build was attempted')


@pytest.mark.parametrize('propagate', [True, False], ids=['propagating', 'launch-logger'])
def test_auto_falls_back_to_torch_with_the_reason_and_one_warning(logged, monkeypatch,
                                                                  propagate):
    # propagate=False: the logger as it is under colcon test (launch's logger class).
    monkeypatch.setattr(logging.getLogger(backend_factory.__name__), 'propagate', propagate)
    records = logged(backend_factory.__name__)
    attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, 'auto', _failing_build)
    assert attn.name == 'torch' and not attn.graph_safe and fused is None
    assert reason == f'RuntimeError: {NO_HEADERS}'
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and 'Failed to find CUDA headers' in warnings[0].getMessage()
    assert dispatch.kernels_for(torch.zeros(1)) is None  # no fused layer kernels installed


def test_auto_falls_back_when_a_first_launch_fails():
    """Kernels that build but fail in the warm-up's first launches fall back too.

    Nothing is installed for the layers then.
    """
    def build(*_args):
        def launch(name, grid, block, args):
            raise RuntimeError('cudaErrorUnsupportedPtxVersion: the provided PTX was compiled '
                               'with an unsupported toolchain.')
        return launch

    attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, 'auto', build)
    assert attn.name == 'torch' and 'UnsupportedPtxVersion' in reason and fused is None
    assert dispatch.kernels_for(torch.zeros(1)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason='CuPy may build kernels on this machine')
def test_auto_falls_back_when_the_real_cupy_build_fails():
    """No mock: without CUDA, cuda_ops.kernel_launcher fails (CuPy missing, or no device)."""
    attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, 'auto',
                                                 cuda_ops.kernel_launcher)
    assert attn.name == 'torch' and reason and fused is None


def test_cuda_fails_loudly():
    with pytest.raises(RuntimeError, match="attention_backend 'cuda'.*Failed to find CUDA"):
        make_attention_backend(_kv(), HEADS, 128, 'cuda', _failing_build)
    with pytest.raises(ValueError, match="attention_backend 'cuda' needs a CUDA device"):
        make_attention_backend(_kv(), HEADS, 128, 'cuda')


def test_torch_never_touches_cupy(monkeypatch):
    monkeypatch.setattr(cuda_ops, '_import_cupy', _must_not_build)
    attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, 'torch', _must_not_build)
    assert attn.name == 'torch' and reason is None and fused is None


@pytest.mark.skipif(not kernel_emulator.compiler_available(), reason='g++ builds the emulator')
def test_auto_and_cuda_run_the_kernels_when_they_build():
    def emulated(dtype, head_dim, device):
        return kernel_emulator.emulated_launch(cuda_ops.TORCH_DTYPES[dtype], head_dim)

    for choice in ('auto', 'cuda'):
        attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, choice, emulated)
        assert attn.name == 'cuda' and attn.graph_safe and reason is None
        assert isinstance(fused, cuda_ops.FusedOps) and fused.device == CPU
        # Returned, not installed: only the runner that owns them installs them, per step.
        assert dispatch.kernels_for(torch.zeros(1)) is None


def test_auto_on_the_cpu_is_torch_with_nothing_to_report():
    attn, fused, reason = make_attention_backend(_kv(), HEADS, 128, 'auto')
    assert attn.name == 'torch' and reason is None and fused is None


def test_engine_config_and_engine(tiny_ckpt):
    with pytest.raises(ValueError, match='attention_backend must be one of'):
        EngineConfig(model_path=tiny_ckpt, attention_backend='triton')
    engine = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu',
                                    attention_backend='torch'))
    assert engine.attention_backend == 'torch' and engine.backend_fallback_reason is None
    with pytest.raises(ValueError, match='needs a CUDA device'):
        LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', attention_backend='cuda'))
