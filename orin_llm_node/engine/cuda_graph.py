# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""CUDA Graph capture and replay of the model runner's decode step.

The runner splits a decode step in two (``ModelRunner.prepare_decode`` /
``_decode_graph_body``). All host work -- block allocation, the block-table row, token id,
1-D position, slot and context length -- is written into device buffers by ``prepare_decode``
*before* every replay; the graph holds only device work: embedding, RoPE cos/sin computed once
from the position buffer, every layer (fused norms, q/k-norm + RoPE + K/V write by slot,
paged decode attention reading the context length and block table from device memory), the
final norm, the logits and the greedy token (banned ids masked, argmax). A greedy step is one
replay and one 8-byte copy of that token to the host; other sampling reads a copy of the logits.

A graph bakes in pointers, so it is re-captured only when one of them changes (KV tensor,
static buffers, attention backend or its workspace): a conversation reset changes buffer
contents, never pointers. Capture happens on the first decode step, on the thread that runs
decode (the engine's worker thread), with ``capture_error_mode="thread_local"`` so that CUDA
calls from other threads cannot invalidate it, right after one eager run of the same step:
the step is idempotent (it rewrites the same K/V slot with the same values), and the eager
run initialises this thread's cuBLAS/CuPy state outside the capture.
"""

import logging

import torch

__all__ = ["CudaGraphDecode", "capture_graph", "pointer_key"]

log = logging.getLogger(__name__)


def pointer_key(runner, *buffers: torch.Tensor) -> tuple:
    """Everything a graph over ``runner``'s model bakes in, as a comparable key.

    The attention backend and its own pointers (``graph_key``), the KV tensor's address and
    those of ``buffers``.
    """
    return (id(runner.attn), runner.kv_cache.data_ptr(), *(t.data_ptr() for t in buffers),
            *runner.attn.graph_key())


def capture_graph(fn, pool):
    """Capture ``fn()`` into a new graph in memory pool ``pool``; ``(graph, fn's outputs)``.

    ``thread_local``: CUDA calls from other threads cannot invalidate the capture.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn()
    return graph, out


class CudaGraphDecode:
    """Captures ``runner._decode_graph_body()`` once and replays it for every decode step.

    ``runner`` must use an attention backend that reads its decode metadata from device
    memory (``graph_safe``) and expose the static buffers ``decode_input_ids``,
    ``decode_positions``, ``decode_slot_mapping``, ``decode_block_table``, ``decode_banned``
    and the KV tensor.
    """

    def __init__(self, runner):
        self.runner = runner
        self.graph = None
        self.logits = None
        self.token = None
        self.captures = 0  # how many times a graph was captured (tests check re-capture)
        self._key = None
        self._pool = None

    def _pointers(self) -> tuple:
        r = self.runner
        return pointer_key(r, r.decode_input_ids, r.decode_positions, r.decode_slot_mapping,
                           r.decode_block_table, r.decode_banned)

    def _replay(self) -> None:
        key = self._pointers()
        if self.graph is None or key != self._key:
            self._capture(key)  # ends with a replay of this step
        else:
            self.graph.replay()

    def run(self) -> torch.Tensor:
        """Replay the decode step (capturing first if needed); fp32 logits ``[V]``.

        Call after ``runner.prepare_decode``. Returns a copy: the graph's output buffer is
        overwritten by the next replay.
        """
        self._replay()
        return self.logits.clone()

    def run_greedy(self) -> int:
        """Replay the decode step; the greedy next token id (the step's one host copy)."""
        self._replay()
        return int(self.token)

    def _capture(self, key: tuple) -> None:
        if self.graph is not None:
            log.info("decode graph: a captured pointer changed, capturing again")
        self.graph = self.logits = self.token = None
        eager, _ = self.runner._decode_graph_body()  # warm-up on this thread, not captured
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # The body is looked up inside the capture, as prefill_graph does with its lambda.
        graph, (logits, token) = capture_graph(lambda: self.runner._decode_graph_body(),
                                               self._pool)
        graph.replay()
        if not torch.equal(logits, eager):
            log.warning(
                "decode graph: replay differs from the eager step by %.3g (max |diff|)",
                (logits - eager).abs().max().item(),
            )
        self.graph, self.logits, self.token, self._key = graph, logits, token, key
        self.captures += 1
