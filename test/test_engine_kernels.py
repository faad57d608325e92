# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Each engine's fused kernels are its own: installed only around its steps, gone on close.

On the CPU the fused engine runs the CUDA kernels through the kernel emulator (its
``kernel_launcher``), every launch counted; on a GPU (skipped without one) the CuPy kernels,
counted the same way. A plain engine in the same process runs its torch bodies: not one launch.
"""

from cpu_graphs import CpuGraphCapture
import kernel_emulator
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.cuda_graph import CudaGraphDecode
from orin_llm_node.kernels import dispatch
from orin_llm_node.kernels.cuda_ops import LaunchCounter, cupy_available

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
#: The fused layer ops a decoder step dispatches to (beside the attention kernels).
LAYER_OPS = {'rms_norm', 'add_rms_norm', 'silu_and_mul'}


def _devices():
    out = [pytest.param('cpu', marks=pytest.mark.skipif(
        not kernel_emulator.compiler_available(), reason='g++ builds the kernel emulator'))]
    out.append(pytest.param('cuda', marks=[pytest.mark.gpu, pytest.mark.skipif(
        not cupy_available(), reason='needs a CUDA GPU and CuPy')]))
    return out


def _counting_launcher(device):
    """A ``kernel_launcher`` whose kernels count their launches (one counter, returned too)."""
    counter = {}

    def build(dtype, head_dim, dev):
        if device == 'cpu':
            launch = kernel_emulator.emulated_launch('float32', head_dim)
        else:
            from orin_llm_node.kernels.cuda_ops import kernel_launcher
            launch = kernel_launcher(dtype, head_dim, dev)
        counter['launch'] = LaunchCounter(launch)
        return counter['launch']

    return build, counter


@pytest.mark.parametrize('device', _devices())
def test_two_engines_in_one_process_run_only_their_own_kernels(tiny_ckpt, device):
    cfg = dict(model_path=tiny_ckpt, device=device, dtype='float32', num_kv_blocks=64,
               max_model_len=512, enable_cuda_graph=False, block_order_seed=5)
    build, counter = _counting_launcher(device)
    plain = LLMEngine(EngineConfig(**cfg, attention_backend='torch'))
    with LLMEngine(EngineConfig(**cfg, attention_backend='cuda'), kernel_launcher=build) as fused:
        launch = counter['launch']
        assert fused.attention_backend == 'cuda' and plain.attention_backend == 'torch'
        # Built and warmed up, but installed for nobody outside the fused engine's steps.
        assert dispatch.kernels_for(torch.zeros(1, device=device)) is None
        launch.counts.clear()
        plain.chat(plain.new_conversation(), 'Is the path clear?', sampling=GREEDY)
        assert launch.total == 0, f"the plain engine ran the fused one's kernels: {launch.counts}"
        fused_conv = fused.new_conversation()
        fused.chat(fused_conv, 'Is the path clear?', sampling=GREEDY)
        assert LAYER_OPS <= set(launch.counts), launch.counts
        assert dispatch.kernels_for(torch.zeros(1, device=device)) is None
        # Interleaved turns: each engine keeps to its own kernels.
        launch.counts.clear()
        plain.chat(plain.new_conversation(), 'And now?', sampling=GREEDY)
        assert launch.total == 0
        fused.chat(fused_conv, 'And now?', sampling=GREEDY)
        assert LAYER_OPS <= set(launch.counts)
    # Closed: nothing of it is installed, it refuses to run, and a second close is a no-op.
    assert dispatch.kernels_for(torch.zeros(1, device=device)) is None
    assert fused.runner is None and fused.model is None
    for call in (lambda: fused.chat(fused_conv, 'Hi'), fused.new_conversation, fused.stats,
                 lambda: fused.warmup([]),
                 lambda: fused.check_response_format({'type': 'json_object'})):
        with pytest.raises(RuntimeError, match=r'called after close\(\)'):
            call()
    fused.close()
    launch.counts.clear()
    plain.chat(plain.new_conversation(), 'Is the path clear?', sampling=GREEDY)
    assert launch.total == 0


@pytest.mark.skipif(not kernel_emulator.compiler_available(), reason='g++ builds the emulator')
def test_graph_captures_hold_the_engines_own_kernels(tiny_ckpt):
    """A decode graph captured by the fused engine (CPU stand-in) replays its kernels."""
    build, counter = _counting_launcher('cpu')
    fused = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32',
                                   num_kv_blocks=64, max_model_len=512,
                                   attention_backend='cuda'), kernel_launcher=build)
    fused.runner.decode_graph = CudaGraphDecode(fused.runner)
    fused.runner.decode_graph.capturer = CpuGraphCapture()
    conv = fused.new_conversation()
    fused.chat(conv, 'Hi', sampling=GREEDY)
    assert fused.runner.decode_graph.captures == 1
    counter['launch'].counts.clear()
    fused.chat(conv, 'Go on.', sampling=GREEDY)  # replays only
    assert fused.runner.decode_graph.captures == 1
    assert LAYER_OPS <= set(counter['launch'].counts)
    fused.close()
    assert dispatch.kernels_for(torch.zeros(1)) is None
