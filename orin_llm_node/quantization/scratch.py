# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The reusable work buffers of the quantized linears' CPU path (one small set per thread).

The CPU path (``QuantLinear.torch_forward`` on a CPU tensor) dequantises a layer a tile of
rows at a time into these buffers and multiplies each tile at once, so a decode step never
allocates a dense weight and the dense tile is still in cache when the matmul reads it. A tile
holds at most :data:`TILE_ELEMENTS` weights: the buffers of one thread take ``TILE_ELEMENTS``
x (4 bytes fp32 tile + 2 bytes codes work, + 2 for the shifted nibbles of INT4, + 2 for a
bf16/fp16 copy when the activations are not fp32), at most 10 MiB whatever the model size.
They grow to the largest tile requested and are kept for the thread's life (the engine's
worker thread; a new worker gets its own set), so a step allocates only its outputs.
"""

import threading
import weakref

import torch

__all__ = ["TILE_ELEMENTS", "buffer", "held_bytes"]

#: Weights per dequantised tile: 4 MiB of fp32, inside a last-level cache (L2 tiles of
#: 2^17..2^18 were within noise on a 2-core x86 and pay ~4x the per-op overhead, which
#: dominates when the cores are oversubscribed; bench/quant_cpu.py).
TILE_ELEMENTS = 1 << 20

_local = threading.local()
_live: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()  # every thread's buffers


def buffer(role: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D work tensor of at least ``numel`` elements, reused by later calls of this thread.

    ``role`` keeps buffers that are alive at the same time apart. Contents are undefined.
    """
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    key = (role, dtype, torch.device(device))
    buf = pool.get(key)
    if buf is None or buf.numel() < numel:
        # A normal tensor, also when first asked for under inference_mode (the engine):
        # an inference tensor could not be written in place by a later plain call.
        with torch.inference_mode(False):
            buf = pool[key] = torch.empty(numel, dtype=dtype, device=device)
        _live.add(buf)
    return buf[:numel]


def held_bytes() -> int:
    """Bytes of the work buffers alive now, over all threads (benchmarks, diagnostics)."""
    return sum(b.numel() * b.element_size() for b in list(_live))
