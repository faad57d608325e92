# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""cuda_ops launches on torch's stream through CuPy's current API, in the kernels' device.

``cupy.cuda.ExternalStream`` is deprecated in CuPy 14 (``Stream.from_external`` and the CUDA
stream protocol replace it); CuPy 13, JetPack 6's cupy-cuda12x with NumPy 1.x, has only
``ExternalStream``. DeprecationWarnings are errors here. cupy-cuda12x imports without a GPU
(requirements/cpu-test.txt installs it in the CPU venv), so the stream wrapping runs on the
CPU; the launches need a GPU (two for the ``cuda:1`` cases: a launch in device 1's context, and
one captured on device 1's stream).
"""

import warnings

import numpy as np
import pytest
import torch

from orin_llm_node.kernels import cuda_ops

cupy = pytest.importorskip('cupy', reason='needs CuPy (cupy-cuda12x / cupy-cuda13x)')


def test_torch_stream_is_wrapped_without_deprecated_api():
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)
        stream = cuda_ops.external_stream(cupy, 0x5EED, 0)
    assert stream.ptr == 0x5EED


def _launch_silu(device: torch.device):
    """silu_and_mul through the CuPy launcher on ``device``, DeprecationWarnings as errors."""
    x = torch.randn(2, 256, device=device)
    out = torch.empty(2, 128, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)
        launch = cuda_ops.kernel_launcher(torch.float32, 32, device)
        launch('silu_and_mul', (2, 1), (128,),
               (out.data_ptr(), x.data_ptr(), np.int32(128), np.int64(256), np.int64(128)))
    torch.cuda.synchronize(device)
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :128]) * x[:, 128:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_launch_on_torch_stream_inside_a_graph_capture_warns_nothing():
    dev = torch.device('cuda', 0)
    _launch_silu(dev)  # build and load outside the capture
    x = torch.randn(2, 256, device=dev)
    out = torch.empty(2, 128, device=dev)
    launch = cuda_ops.kernel_launcher(torch.float32, 32, dev)
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)
        with torch.cuda.graph(graph, capture_error_mode='thread_local'):
            launch('silu_and_mul', (2, 1), (128,),
                   (out.data_ptr(), x.data_ptr(), np.int32(128), np.int64(256),
                    np.int64(128)))
    graph.replay()
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :128]) * x[:, 128:])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs two CUDA GPUs')
def test_cuda_1_launches_in_its_own_context_while_device_0_is_current():
    torch.cuda.set_device(0)
    _launch_silu(torch.device('cuda', 1))
    assert torch.cuda.current_device() == 0  # the launcher restored the thread's device


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs two CUDA GPUs')
def test_a_launch_on_cuda_1_is_captured_on_device_1_while_device_0_is_current():
    """The engine's capture (GraphCapture) records a cuda:1 kernel, whatever device is current."""
    from orin_llm_node.engine.cuda_graph import GraphCapture, replay_writes

    torch.cuda.set_device(0)
    dev = torch.device('cuda', 1)
    _launch_silu(dev)  # build and load outside the capture
    x = torch.randn(2, 256, device=dev)
    out = torch.empty(2, 128, device=dev)
    launch = cuda_ops.kernel_launcher(torch.float32, 32, dev)
    graph, _ = GraphCapture(dev).capture(lambda: launch(
        'silu_and_mul', (2, 1), (128,),
        (out.data_ptr(), x.data_ptr(), np.int32(128), np.int64(256), np.int64(128))))
    x.copy_(torch.randn(2, 256, device=dev))
    replay_writes(graph, (out,), 'silu_and_mul on cuda:1')  # raises if the graph is empty
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :128]) * x[:, 128:])
    assert torch.cuda.current_device() == 0
