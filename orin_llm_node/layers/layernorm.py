# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm, optionally fused with the residual add that precedes it (nano-vllm's interface)."""

import torch
from torch import nn

from orin_llm_node.kernels.dispatch import kernels_for

__all__ = ['RMSNorm', 'add_rms_norm', 'rms_norm']


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference's rounding points: normalise in fp32, cast to ``x``'s dtype, scale."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)``; the add is rounded to the activation dtype."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; with ``residual`` it first adds ``x`` to it.

    ``forward(x)`` returns the normed ``x``; ``forward(x, residual)`` returns
    ``(normed, new_residual)`` with ``new_residual = residual + x`` -- one fused kernel on CUDA
    that writes both, where plain torch runs an add and about eight elementwise kernels.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalise ``x`` (or ``residual + x``); see the class docstring for the outputs."""
        kernels = kernels_for(x)
        if residual is None:
            if kernels is not None and x.dim() == 2:
                return kernels.rms_norm(x, self.weight, self.eps)
            return rms_norm(x, self.weight, self.eps)
        if kernels is not None:
            return kernels.add_rms_norm(x, residual, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)
