# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The reusable work buffers of the quantized linears' CPU path (one small set per thread).

The CPU path (``cpu_layout.py``) decodes codes into these buffers where it needs float
values at all: FP8 decode (a tile of whole 128-column groups) and prefill (a chunk of output
rows, dequantised, then one GEMM), so a step never allocates a dense weight and the tile is
still in cache when the matmul reads it. INT8 / INT4 decode needs none (fbgemm's bag kernels
read the codes). A tile holds at most :data:`TILE_ELEMENTS` weights, or one group of a
layer's outputs where that is more (FP8 on layers wider than 8192 outputs): the buffers of
one thread take 4 bytes (fp32 tile) + 2 (int16 codes work) + 2 (INT4's shifted nibbles)
per tile element. They grow to the largest tile requested and are kept for the thread's
life (the engine's worker thread; a new worker gets its own set), so a step allocates only
its outputs.
"""

import threading
import weakref

import torch

__all__ = ['TILE_ELEMENTS', 'buffer', 'held_bytes']

#: Weights per dequantised tile: 4 MiB of fp32, inside a last-level cache (L2-sized FP8
#: tiles of 2^16..2^18 were 1.4-2.2x slower per weight on a 2-core x86: the per-op
#: overhead and strided code reads outweigh the cache).
TILE_ELEMENTS = 1 << 20

_local = threading.local()
_live: 'weakref.WeakSet[torch.Tensor]' = weakref.WeakSet()  # every thread's buffers


def buffer(role: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D work tensor of at least ``numel`` elements, reused by later calls of this thread.

    ``role`` keeps buffers that are alive at the same time apart. Contents are undefined.
    """
    pool = getattr(_local, 'pool', None)
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
