# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Per-group arithmetic shared by the formats.

Group ``g`` of a row covers input columns ``[g * group_size, (g + 1) * group_size)``, the
last group possibly shorter.
"""

import torch
import torch.nn.functional as F

__all__ = ['abs_max', 'divided_by_groups', 'grouped', 'per_group_']


def grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[rows, in]`` -> ``[rows, G, group_size]``, the last group zero-padded.

    A view of ``weight`` when ``group_size`` divides ``in`` (the usual case: no copy).
    """
    rows, cols = weight.shape
    groups = -(-cols // group_size)
    if groups * group_size != cols:
        weight = F.pad(weight, (0, groups * group_size - cols))
    return weight.unflatten(1, (groups, group_size))


def abs_max(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``t.abs().amax(dim)`` from two reductions, without a full-size ``abs`` copy."""
    return torch.maximum(t.amax(dim), t.amin(dim).neg())


def per_group_(op, weight: torch.Tensor, per_group: torch.Tensor, group_size: int) -> None:
    """``op(weight, per_group repeated over each group's columns)`` in place, without a copy.

    ``op`` is an in-place binary tensor method (``torch.Tensor.mul_``, ``sub_``); ``weight
    [rows, cols]``, ``per_group [rows, G]`` (the last group may be shorter).
    """
    rows, cols = weight.shape
    full = cols // group_size
    if full:
        op(weight[:, :full * group_size].unflatten(1, (full, group_size)),
           per_group[:, :full, None])
    if full * group_size < cols:
        op(weight[:, full * group_size:], per_group[:, full:full + 1])


def divided_by_groups(weight: torch.Tensor, per_group: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """A new ``weight / expand(per_group)``: each column divided by its group's value."""
    out = weight.clone(memory_format=torch.contiguous_format)
    per_group_(torch.Tensor.div_, out, per_group, group_size)
    return out
