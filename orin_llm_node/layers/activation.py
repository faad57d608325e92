# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The gated MLP activation over a merged gate/up projection."""

import torch
from torch import nn
import torch.nn.functional as F

from orin_llm_node.kernels.dispatch import kernels_for

__all__ = ['SiluAndMul', 'silu_and_mul']


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x = [gate | up]`` (each op rounded to the dtype, like HF)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """``[N, 2I] -> [N, I]``: one kernel on CUDA, two (plus a copy) in plain torch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply ``silu(gate) * up`` to the halves of the last dim."""
        kernels = kernels_for(x)
        if kernels is not None:
            return kernels.silu_and_mul(x)
        return silu_and_mul(x)
