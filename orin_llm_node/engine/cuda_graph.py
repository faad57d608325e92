# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""CUDA Graph capture and replay of the model runner's decode step.

The runner splits a decode step in two (``ModelRunner.prepare_decode`` / the device work,
``_decode_forward`` then ``_decode_pick``). All host work -- block allocation, the
block-table row, token id, 1-D position, slot and context length -- is written into device
buffers by ``prepare_decode``
*before* every replay; the graph holds only device work: embedding, RoPE cos/sin computed once
from the position buffer, every layer (fused norms, q/k-norm + RoPE + K/V write by slot,
paged decode attention reading the context length and block table from device memory), the
final norm, the logits -- and, in a second graph, the token pick (the static token bitmask
applied: banned ids, a grammar's disallowed tokens; argmax). A greedy step is two replays and
one 8-byte copy of that token to the host; other sampling reads a copy of the masked logits.

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
    """Captures the decode step once, as two graphs, and replays them for every step.

    ``forward`` holds ``runner._decode_forward()`` (embedding to logits); ``pick`` holds
    ``runner._decode_pick(logits)`` (the static token bitmask applied, the argmax). Two graphs,
    so that the host can compute a grammar's mask for the step while the GPU runs ``forward``
    and write it into ``decode_token_mask`` before ``pick`` is replayed; one mask buffer, so a
    new schema never needs a new capture. ``runner`` must use an attention backend that reads
    its decode metadata from device memory (``graph_safe``) and expose the static buffers
    ``decode_input_ids``, ``decode_positions``, ``decode_slot_mapping``,
    ``decode_block_table``, ``decode_token_mask``, ``decode_mask_shifts`` and the KV tensor.
    """

    def __init__(self, runner):
        self.runner = runner
        self.forward = self.pick = None
        self.logits = self.masked = self.token = None
        self.captures = 0  # how many times the graphs were captured (tests check re-capture)
        self._key = None
        self._pool = None

    def _pointers(self) -> tuple:
        r = self.runner
        return pointer_key(r, r.decode_input_ids, r.decode_positions, r.decode_slot_mapping,
                           r.decode_block_table, r.decode_token_mask, r.decode_mask_shifts)

    def run_forward(self) -> None:
        """Replay the forward graph (capturing first if needed); nothing waits for it.

        Call after ``runner.prepare_decode``.
        """
        key = self._pointers()
        if self.forward is None or key != self._key:
            self._capture(key)  # ends with a replay of forward
        else:
            self.forward.replay()

    def run(self) -> torch.Tensor:
        """Replay the forward graph; a copy of its fp32 logits ``[V]`` (no mask applied).

        A copy: the graph's output buffer is overwritten by the next replay.
        """
        self.run_forward()
        return self.logits.clone()

    def run_pick(self) -> torch.Tensor:
        """After ``run_forward``: replay the pick graph; a copy of the masked logits ``[V]``."""
        self.pick.replay()
        return self.masked.clone()

    def run_greedy(self) -> int:
        """After ``run_forward``: replay the pick graph; the greedy token (one host copy)."""
        self.pick.replay()
        return int(self.token)

    def _capture(self, key: tuple) -> None:
        r = self.runner
        if self.forward is not None:
            log.info("decode graph: a captured pointer changed, capturing again")
        self.forward = self.pick = self.logits = self.masked = self.token = None
        eager = r._decode_forward()  # warm-up on this thread, not captured
        r._decode_pick(eager)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # The bodies are looked up inside the capture, as prefill_graph does with its lambda.
        forward, logits = capture_graph(lambda: self.runner._decode_forward(), self._pool)
        pick, (masked, token) = capture_graph(lambda: self.runner._decode_pick(logits),
                                              self._pool)
        forward.replay()
        if not torch.equal(logits, eager):
            log.warning(
                "decode graph: replay differs from the eager step by %.3g (max |diff|)",
                (logits - eager).abs().max().item(),
            )
        self.forward, self.pick, self._key = forward, pick, key
        self.logits, self.masked, self.token = logits, masked, token
        self.captures += 1
