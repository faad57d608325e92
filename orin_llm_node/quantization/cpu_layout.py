# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The quantized linears on the CPU: codes laid out one row per input column.

Decode multiplies one activation row by every weight once. Float's GEMV streams the fp32
weight at memory speed on every thread; dequantising tiles of output rows into fp32 and
calling ``F.linear`` per tile writes and reads 4 bytes per weight besides the code, in 5-8
torch calls per tile, each a parallel region of its own -- up to 3x float's decode time on a
quiet core. So a CPU layer, once loaded (``QuantLinear.use_cpu_layout``), keeps its codes
*input-major*: row ``c`` holds every output's code for input column ``c``. ``y = W x`` is
then ``sum_c x[c] * row_c``, a weighted sum of rows -- what fbgemm's embedding-bag kernels
compute from 8-bit and 4-bit rows, converting the codes in registers: one pass over the
codes, no float tile (``torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` and
``..._4bit_...``; the 8-bit one runs its bags on torch's threads, the 4-bit one on one):

* each row ends with its own scale and offset (fp32 for 8 bits, fp16 for 4), set to 1 and
  -128 (int8 stored as ``q + 128``) or -8 (int4 nibbles), so a bag sums ``x[c] * q`` over
  exact code values. Asymmetric INT4 adds one row of zero points per group to its group's
  first bag, weighted by ``-sum(x over the group)``. The scales (per output row and group)
  are applied to the group sums: ``y[n] = sum_g s[n, g] * P[g, n]``;
* a bag is at most :data:`BAG` columns of one group. Those short sums keep the result as
  close to the exact product as ``F.linear`` over ``dequantize()`` for 1024+ input columns
  (closer the wider the layer; within 2.5x of its error on narrower ones, both about one
  fp32 rounding), though not bit-identical to it (test_quant_cpu_path measures both against
  float64); the CUDA GEMV too applies the scales to group sums.

FP8 has no such kernel: its input-major codes are decoded a tile of whole 128-column groups
at a time into a reused fp32 buffer (bit moves, exact) and multiplied per group by one
batched GEMV (``bmm``), the scales again applied to the group sums. More than
:data:`DECODE_MAX_ROWS` activation rows (prefill) dequantise a chunk of output rows whole
along the input and run ``mm`` / ``addmm`` on it, as ``F.linear`` does. Results are computed
in fp32 whatever the activations' dtype and rounded to it once.
"""

import functools

import torch

from . import scratch
from .groups import grouped, per_group_

__all__ = ['BAG', 'DECODE_MAX_ROWS', 'SERIAL_ELEMENTS', 'dequantize', 'linear']

#: Most input columns summed by one embedding bag (see the module docstring).
BAG = 64
#: Up to this many activation rows take the decode path (one pass over the codes per row,
#: as ``cuda_ops.GEMV_MAX_ROWS``); more rows dequantise chunks and run a GEMM.
DECODE_MAX_ROWS = 4
#: torch runs an elementwise op or reduction on one thread below 32768 elements
#: (``at::internal::GRAIN_SIZE``); the decode's small ops stay at or under this.
SERIAL_ELEMENTS = 32767

_CPU = torch.device('cpu')


def _work(role: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return scratch.buffer(role, numel, dtype, _CPU)


@functools.cache
def _bags(cols: int, group_size: int, zero_rows: bool, rows: int):
    """How :func:`_bag_group_sums` bags ``rows`` activation rows of ``cols`` columns.

    Returns ``(indices, offsets, where, bag_group, per)``: the CPU-layout rows the bags sum,
    every group's columns in bags of at most :data:`BAG` (with ``zero_rows``, row ``cols +
    g`` -- group ``g``'s zero points -- leads the group's first bag); the bags' starts; where
    each index's weight sits in ``[x, -sum(x per group)]`` of the flattened activation rows
    (None: the weights are ``x`` itself); each bag's group; and the bags per group (None
    when the groups differ).
    """
    order, offsets, bag_group = [], [], []
    for g, g0 in enumerate(range(0, cols, group_size)):
        g1 = min(cols, g0 + group_size)
        for b0 in range(g0, g1, BAG):
            offsets.append(len(order))
            bag_group.append(g)
            if zero_rows and b0 == g0:
                order.append(cols + g)
            order.extend(range(b0, min(g1, b0 + BAG)))
    groups = bag_group[-1] + 1
    span = cols + groups * zero_rows
    per = len(bag_group) // groups
    with torch.inference_mode(False):  # shared by later calls in and out of inference mode
        return (torch.tensor(order * rows, dtype=torch.int32),
                torch.tensor([r * len(order) + o for r in range(rows) for o in offsets],
                             dtype=torch.int32),
                torch.tensor([r * span + i for r in range(rows) for i in order])
                if zero_rows else None,
                torch.tensor(bag_group),
                per if bag_group == [b // per for b in range(len(bag_group))] else None)


def _bag_group_sums(layer, x: torch.Tensor) -> torch.Tensor:
    """Bag sums ``[rows, groups, bags per group, out]`` from the embedding-bag kernel.

    Each bag's sum of ``x[c] * (value(c, :) - zero)`` over its columns.
    """
    rows, k = x.shape
    zero_rows = layer.zero is not None
    indices, offsets, where, bag_group, per = _bags(k, layer.group_size, zero_rows, rows)
    weights = x.view(-1)
    if zero_rows:
        x_groups = grouped(x, layer.group_size).sum(-1)  # [rows, groups]
        weights = torch.cat([x, x_groups.neg_()], 1).view(-1)[where]
    sums = layer._bag_sums(weights, indices, offsets)[:, :layer.out_features]
    if per is not None:
        return sums.view(rows, layer.num_groups, per, -1)
    return sums.new_zeros(rows, layer.num_groups, 1, sums.shape[1]).index_add_(
        1, bag_group, sums.view(rows, -1, 1, sums.shape[1]))


def _tile_group_sums(layer, x: torch.Tensor) -> torch.Tensor:
    """Group sums ``[rows, groups, 1, out]`` for formats without a bag kernel (FP8).

    Each group's sum of ``x[c] * value(c, :)``: whole groups are decoded into the reused
    fp32 buffer (at least one group's worth) and multiplied group by group, one ``bmm`` per
    tile.
    """
    k, n, gs = layer.in_features, layer.out_features, layer.group_size
    rows, full = x.shape[0], k // gs
    sums = torch.empty(layer.num_groups, rows, n)
    per_tile = max(1, scratch.TILE_ELEMENTS // (gs * n))
    buf = _work('weight', min(full, per_tile) * gs * n if full else k * n, torch.float32)
    xg = x[:, :full * gs].view(rows, full, gs).transpose(0, 1)  # [groups, rows, gs]
    for g0 in range(0, full, per_tile):
        g1 = min(full, g0 + per_tile)
        w = buf[:(g1 - g0) * gs * n].view(g1 - g0, gs, n)
        layer._cpu_values_into(w.view(-1, n), g0 * gs, 0, _work)
        torch.bmm(xg[g0:g1], w, out=sums[g0:g1])
    if full * gs < k:  # the shorter last group
        w = buf[:(k - full * gs) * n].view(-1, n)
        layer._cpu_values_into(w, full * gs, 0, _work)
        torch.mm(x[:, full * gs:], w, out=sums[full])
    return sums.transpose(0, 1).unsqueeze(2)


def _decode(layer, x: torch.Tensor) -> torch.Tensor:
    """``x W^T`` for a few fp32 rows ``x [rows, in]``, one pass over the codes per row.

    The bag sums ``[rows, groups, bags per group, out]`` are scaled and added up a slice of
    outputs at a time, each small enough (:data:`SERIAL_ELEMENTS`) for torch to run it on
    this thread: a parallel region per small op would wait on a descheduled thread whenever
    the cores are shared, each time (float's GEMV has one region per layer).
    """
    if layer._bag_sums is None:
        sums = _tile_group_sums(layer, x)
    else:
        sums = _bag_group_sums(layer, x)
    n = layer.out_features
    scale = layer.scale.t()[:, None]  # [groups, 1, out], contiguous (use_cpu_layout)
    step = max(16, SERIAL_ELEMENTS // sums[..., 0].numel())
    if step >= n:
        y = sums.mul_(scale).sum((1, 2))
    else:
        y = torch.empty(x.shape[0], n)
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            torch.sum(sums[..., c0:c1].mul_(scale[..., c0:c1]), (1, 2), out=y[:, c0:c1])
    return y.mul_(layer.code_unit) if layer.code_unit != 1.0 else y


def _row_chunks(layer) -> list[tuple[int, int]]:
    """Output rows in chunks of a multiple of 16 (at least 16) for :func:`_prefill`.

    A chunk's ``[in, rows]`` fp32 tile holds at most ``scratch.TILE_ELEMENTS`` values.
    """
    n = layer.out_features
    step = max(16, scratch.TILE_ELEMENTS // layer.in_features // 16 * 16)
    return [(r, min(n, r + step)) for r in range(0, n, step)]


def _weights_into(layer, w: torch.Tensor, row0: int) -> None:
    """``w [in, rows]``: the dequantised weights of output rows ``row0...``, transposed."""
    layer._cpu_values_into(w, 0, row0, _work)
    wt, rows = w.t(), slice(row0, row0 + w.shape[1])  # per_group_ works along wt's columns
    if layer.zero is not None:
        zero = layer.zero[rows].float().sub_(layer.cpu_zero_base)
        per_group_(torch.Tensor.sub_, wt, zero, layer.group_size)
    scale = layer.scale[rows]
    if layer.code_unit != 1.0:
        scale = scale * layer.code_unit
    per_group_(torch.Tensor.mul_, wt, scale, layer.group_size)


def dequantize(layer) -> torch.Tensor:
    """The dense fp32 weight ``[out, in]`` of a CPU-layout layer (tests, not the hot path)."""
    wt = torch.empty(layer.in_features, layer.out_features)
    for r0, r1 in _row_chunks(layer):
        _weights_into(layer, wt[:, r0:r1], r0)
    return wt.t().contiguous()


def _prefill(layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + bias`` for fp32 rows ``x [rows, in]``, a chunk of output rows at a time.

    Each chunk is dequantised whole along the input and multiplied by one GEMM
    (``F.linear``'s ``mm`` / ``addmm``: the same sums as ``F.linear`` over ``dequantize()``).
    """
    k, n = layer.in_features, layer.out_features
    out = torch.empty(x.shape[0], n)
    chunks = _row_chunks(layer)
    buf = _work('weight', k * (chunks[0][1] - chunks[0][0]), torch.float32)
    for r0, r1 in chunks:
        w = buf[:k * (r1 - r0)].view(k, r1 - r0)
        _weights_into(layer, w, r0)
        if bias is None:
            torch.mm(x, w, out=out[:, r0:r1])
        else:
            torch.addmm(bias[r0:r1], x, w, out=out[:, r0:r1])
    return out


def linear(layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` for a CPU-layout layer; fp32 inside, one rounding to ``x.dtype``."""
    n = layer.out_features
    x2 = x.reshape(-1, layer.in_features).float().contiguous()
    bias = None if bias is None else bias.float()
    if x2.shape[0] > DECODE_MAX_ROWS:
        y = _prefill(layer, x2, bias)
    else:
        y = _decode(layer, x2)
        if bias is not None:
            y = y.add_(bias)
    return y.to(x.dtype).view(*x.shape[:-1], n)
