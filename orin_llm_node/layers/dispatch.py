# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one dispatch point between the layers' torch bodies and the fused CUDA kernels.

Where nano-vllm compiles a layer's torch body with ``torch.compile``, our layers ask
:func:`kernels_for` whether fused kernels are installed for the tensor's device and dtype;
if not, they run their plain torch body (the CPU path and the parity oracle). The model runner
installs :class:`~orin_llm_node.cuda_ops.FusedOps` for its device once the kernels are built
(outside any graph capture); tests install emulated kernels on the CPU the same way and
uninstall them afterwards, so no state outlives its owner.
"""

from contextlib import contextmanager

import torch

__all__ = ["install", "installed", "kernels_for", "tensor_device", "uninstall"]

_installed: dict[tuple[torch.device, torch.dtype], object] = {}


def tensor_device(device: torch.device | str) -> torch.device:
    """``device`` as the tensors on it report it: what ``tensor.device`` is compared with.

    ``torch.device("cuda")`` never equals a tensor's device (``cuda:0``): without an index it
    names the thread's current CUDA device, which is resolved here. A CPU tensor reports
    ``cpu`` without an index, so ``cpu:0`` drops it.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu" and device.index is not None:
        return torch.device("cpu")
    return device


def _key(device: torch.device | str, dtype: torch.dtype) -> tuple[torch.device, torch.dtype]:
    return tensor_device(device), dtype


def install(device: torch.device | str, dtype: torch.dtype, kernels) -> None:
    """Route the layers' fused ops on ``device``/``dtype`` tensors to ``kernels``."""
    _installed[_key(device, dtype)] = kernels


def uninstall(device: torch.device | str, dtype: torch.dtype) -> None:
    """Back to the torch bodies for ``device``/``dtype`` (no-op when nothing is installed)."""
    _installed.pop(_key(device, dtype), None)


@contextmanager
def installed(device: torch.device | str, dtype: torch.dtype, kernels):
    """:func:`install` for the duration of a ``with`` block (tests)."""
    key = _key(device, dtype)
    previous = _installed.get(key)
    _installed[key] = kernels
    try:
        yield kernels
    finally:
        if previous is None:
            _installed.pop(key, None)
        else:
            _installed[key] = previous


def kernels_for(x: torch.Tensor):
    """The fused kernels installed for ``x``'s device and dtype, or None (use torch)."""
    if not _installed:
        return None
    return _installed.get((x.device, x.dtype))
