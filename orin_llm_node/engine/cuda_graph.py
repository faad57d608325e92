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

Every capture goes through :class:`GraphCapture`, on a stream of the model's own device with
that device current, and is replayed once right away by :func:`replay_writes`: a graph whose
replay leaves its output unwritten (an empty graph) raises there, instead of decode repeating
one token and never writing new K/V.
"""

import logging

import torch

__all__ = ['CudaGraphDecode', 'GraphCapture', 'pointer_key', 'replay_writes']

log = logging.getLogger(__name__)


def pointer_key(runner, *buffers: torch.Tensor) -> tuple:
    """Everything a graph over ``runner``'s model bakes in, as a comparable key.

    The attention backend and its own pointers (``graph_key``), the KV tensor's address and
    those of ``buffers``.
    """
    return (id(runner.attn), runner.kv_cache.data_ptr(), *(t.data_ptr() for t in buffers),
            *runner.attn.graph_key())


class GraphCapture:
    """Captures CUDA graphs of one device into one private memory pool.

    Each capture runs on this device's own capture stream with the device current.
    ``torch.cuda.graph`` otherwise captures on one stream per process, created on whichever
    device was current at the first capture -- device 0 for a thread that never chose one --
    and ops on ``cuda:1`` tensors issued while a device-0 stream captures run eagerly on
    device 1 and record nothing: an empty graph (torch only warns), whose replays do nothing.
    ``thread_local``: CUDA calls from other threads cannot invalidate a capture.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = self._pool = None

    def capture(self, fn):
        """Capture ``fn()`` into a new graph; ``(graph, fn's outputs)``."""
        with torch.cuda.device(self.device):
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                  capture_error_mode='thread_local'):
                out = fn()
        return graph, out


def _unwritten(t: torch.Tensor) -> torch.Tensor:
    return t.isnan() if t.is_floating_point() else t == -1


def replay_writes(graph, outputs, what: str) -> None:
    """Replay ``graph`` once over poisoned ``outputs``; raise unless it wrote every one.

    The outputs are filled with a value no step produces (NaN; -1 for token ids) first: a
    capture that recorded nothing leaves the values its eager run during the capture wrote,
    so only a poisoned replay tells an empty graph from a working one.
    """
    for t in outputs:
        t.fill_(float('nan') if t.is_floating_point() else -1)
    graph.replay()
    if any(bool(_unwritten(t).all()) for t in outputs):
        raise RuntimeError(
            f'{what}: the captured CUDA graph wrote nothing when replayed (an empty capture: '
            'the work ran on another device or stream, or produced only NaN); set '
            'enable_cuda_graph false and report it')


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
        self.capturer = GraphCapture(runner.device)  # tests on the CPU put a stand-in here
        self._key = None

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
            log.info('decode graph: a captured pointer changed, capturing again')
        self.forward = self.pick = self.logits = self.masked = self.token = None
        eager = r._decode_forward()  # warm-up on this thread, not captured
        r._decode_pick(eager)
        # The bodies are looked up inside the capture, as prefill_graph does with its lambda.
        capture = self.capturer.capture
        forward, logits = capture(lambda: self.runner._decode_forward())
        pick, (masked, token) = capture(lambda: self.runner._decode_pick(logits))
        replay_writes(forward, (logits,), f'decode graph on {r.device}')
        replay_writes(pick, (masked, token), f'decode token-pick graph on {r.device}')
        if not torch.equal(logits, eager):
            log.warning(
                'decode graph: replay differs from the eager step by %.3g (max |diff|)',
                (logits - eager).abs().max().item(),
            )
        self.forward, self.pick, self._key = forward, pick, key
        self.logits, self.masked, self.token = logits, masked, token
        self.captures += 1
