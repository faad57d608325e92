# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one dispatch point between the layers' torch bodies and the fused CUDA kernels.

Where nano-vllm compiles a layer's torch body with ``torch.compile``, our layers ask
:func:`kernels_for` whether fused kernels are installed for the tensor's device and dtype;
if not, they run their plain torch body (the CPU path and the parity oracle).

Kernels are installed for a ``with`` block only (:func:`installed`), and only for the thread
(more exactly, the ``contextvars`` context) that entered it: a model runner installs its own
:class:`~orin_llm_node.kernels.cuda_ops.FusedOps` around each of its steps (graph captures
included), tests install emulated kernels on the CPU the same way. So two engines in one
process never run each other's kernels, and nothing is left installed once a block ends.
"""

from contextvars import ContextVar

import torch

__all__ = ['Installed', 'installed', 'kernels_for', 'tensor_device']

# (device, dtype) -> kernels, for the code running inside ``installed`` blocks. A context
# variable, not a module dict: each thread starts with nothing installed, and a block's
# exit restores exactly what was there before it.
_installed: ContextVar[dict | None] = ContextVar('fused_kernels', default=None)


def tensor_device(device: torch.device | str) -> torch.device:
    """``device`` as the tensors on it report it: what ``tensor.device`` is compared with.

    ``torch.device("cuda")`` never equals a tensor's device (``cuda:0``): without an index it
    names the thread's current CUDA device, which is resolved here. A CPU tensor reports
    ``cpu`` without an index, so ``cpu:0`` drops it.
    """
    device = torch.device(device)
    if device.type == 'cuda' and device.index is None:
        return torch.device('cuda', torch.cuda.current_device())
    if device.type == 'cpu' and device.index is not None:
        return torch.device('cpu')
    return device


class Installed:
    """A ``with`` block routing the layers' fused ops on one device and dtype to ``kernels``.

    Made once and entered for every step by its owner (a model runner): the key is resolved
    here, so entering costs a context-variable set (about half a microsecond), not a device
    lookup. Blocks may nest; one instance is entered by one thread at a time.
    """

    __slots__ = ('kernels', '_table', '_tokens')

    def __init__(self, device: torch.device | str, dtype: torch.dtype, kernels):
        self.kernels = kernels
        self._table = {(tensor_device(device), dtype): kernels}
        self._tokens = []

    def __enter__(self):
        current = _installed.get()
        self._tokens.append(_installed.set({**current, **self._table} if current
                                           else self._table))
        return self.kernels

    def __exit__(self, *exc) -> None:
        _installed.reset(self._tokens.pop())


def installed(device: torch.device | str, dtype: torch.dtype, kernels) -> Installed:
    """Route the layers' fused ops on ``device``/``dtype`` tensors to ``kernels`` in the block.

    Only for the code the block runs (this thread's context); the previous routing is back
    when it ends, however it ends.
    """
    return Installed(device, dtype, kernels)


def kernels_for(x: torch.Tensor):
    """The fused kernels installed for ``x``'s device and dtype, or None (use torch)."""
    table = _installed.get()
    if not table:
        return None
    return table.get((x.device, x.dtype))
