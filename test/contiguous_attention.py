# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Contiguous (non-paged) KV storage for the tests: per-layer K/V grown with ``torch.cat``.

The simplest correct backend: what the model parity tests run incremental decoding through,
and a second opinion for the paged backends. Test-only, so it lives under ``test/``.
"""

import torch

from orin_llm_node.attention.base import AttentionBackend, causal_attention

__all__ = ['ContiguousAttention']


class ContiguousAttention(AttentionBackend):
    """One growing K/V tensor pair per layer for a single sequence."""

    def __init__(self, num_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        """Number of tokens cached (layer 0)."""
        return 0 if self.k[0] is None else self.k[0].shape[0]

    def reset(self) -> None:
        """Forget every cached token."""
        self.k = [None] * len(self.k)
        self.v = [None] * len(self.v)

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Append ``k``/``v`` to the layer's cache and attend causally over all of it."""
        prev_k, prev_v = self.k[layer_idx], self.v[layer_idx]
        num_prefix = 0 if prev_k is None else prev_k.shape[0]
        if prev_k is not None:
            k, v = torch.cat([prev_k, k]), torch.cat([prev_v, v])
        self.k[layer_idx], self.v[layer_idx] = k, v
        return causal_attention(q, k, v, num_prefix)
