# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Bucketed prefill: short text-only suffixes padded to a fixed length, replayed as CUDA graphs.

A follow-up question is a few dozen new tokens on a cached conversation. Run eagerly, its
prefill is bound by launching ~58 ops per layer one by one from Python; a captured graph
replays them at once. A graph fixes every shape, so a suffix of ``n`` tokens runs padded to the
smallest bucket ``b >= n``: the padding rows get slot -1 (the KV write skips them) and the
attention backend gives them zero output from the lengths in its device buffers (real rows never
see them: they come after every real token), and the logits are taken at row ``n - 1``
(``last_index``, a device buffer). Everything that changes per prompt -- token ids, 3-D
positions, slots, the block table, the lengths -- is written into static buffers before the
replay.

Only :class:`~orin_llm_node.engine.model_runner.ModelRunner` uses this module. Graphs are
captured only where the runner replays decode graphs (``cuda_graph_active``: CUDA, a
``graph_safe`` attention backend, ``enable_cuda_graph``); elsewhere (the CPU, tests, an eager
runner given the same buckets to compare with) the same padded buffers run eagerly, which is how
the padding logic is checked without a GPU.
Suffixes with image tokens (a cold turn, dominated by the vision tower) and longer ones run
eagerly without padding.
"""

import logging

import numpy as np
import torch

from .cuda_graph import GraphCapture, pointer_key, replay_writes

__all__ = ['DEFAULT_BUCKETS', 'PrefillGraphs', 'pad_like_graphs']

log = logging.getLogger(__name__)

#: Padded suffix lengths (tokens); a follow-up question is usually well under 64.
DEFAULT_BUCKETS = (16, 32, 64, 128)


class PrefillGraphs:
    """Static buffers and, on CUDA, one captured graph per bucket of ``runner``'s prefill."""

    def __init__(self, runner, buckets=DEFAULT_BUCKETS):
        if not buckets or any(b < 2 for b in buckets):
            raise ValueError(f'prefill buckets must be lengths >= 2, got {buckets}')
        self.runner = runner
        self.buckets = tuple(sorted(set(buckets)))
        dev, size = runner.device, self.buckets[-1]
        i64 = {'dtype': torch.long, 'device': dev}
        self.input_ids = torch.zeros(size, **i64)
        self.positions = torch.zeros(3, size, **i64)
        self.slot_mapping = torch.full((size,), -1, **i64)
        self.block_table = torch.zeros(runner.max_blocks_per_seq, **i64)
        self.last_index = torch.zeros(1, **i64)
        self.use_graphs = runner.cuda_graph_active
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, logits, pointer key)
        self.captures = 0
        self.capturer = GraphCapture(dev)  # tests on the CPU put a stand-in here

    def bucket(self, num_tokens: int) -> int | None:
        """Smallest bucket holding ``num_tokens`` new tokens, None when none does."""
        return next((b for b in self.buckets if b >= num_tokens), None)

    def run(self, token_ids: list[int], positions: np.ndarray, block_table: list[int],
            num_cached: int) -> torch.Tensor:
        """Prefill ``token_ids`` (at most the largest bucket) padded; fp32 logits ``[V]``."""
        n = len(token_ids)
        size = self.bucket(n)
        if size is None:
            raise ValueError(f'{n} tokens exceed the largest prefill bucket {self.buckets[-1]}')
        self._fill(token_ids, positions, block_table, num_cached, size)
        if not self.use_graphs:
            return self._forward(size)
        entry = self.graphs.get(size)
        if entry is None or entry[2] != pointer_key(self.runner):
            return self._capture(size)
        entry[0].replay()
        return entry[1].clone()  # the next replay overwrites the graph's output

    def capture_all(self) -> None:
        """Capture every bucket now (at load, on the thread that will run prefills)."""
        if not self.use_graphs:
            return
        for size in self.buckets:
            # One real token at slot -1: nothing is written, the graph is what matters.
            self._fill([0], np.zeros((3, 1), dtype=np.int64), [0], 0, size)
            self.slot_mapping[0] = -1
            self._capture(size)

    # ---- internals ---------------------------------------------------------------------------

    def _fill(self, token_ids, positions, block_table, num_cached, size) -> None:
        r = self.runner
        n = len(token_ids)
        if len(block_table) > self.block_table.shape[0]:
            raise ValueError(f'block table of {len(block_table)} blocks exceeds '
                             f'{self.block_table.shape[0]}')
        slots = np.full(size, -1, dtype=np.int64)
        slots[:n] = r.slot_mapping(block_table, num_cached, num_cached + n)
        ids = np.zeros(size, dtype=np.int64)
        ids[:n] = token_ids
        pos = np.zeros((3, size), dtype=np.int64)
        pos[:, :n] = positions
        # One host->device copy per buffer; padding rows: token 0, position 0, slot -1.
        self.input_ids[:size].copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions[:, :size].copy_(torch.from_numpy(pos), non_blocking=True)
        self.slot_mapping[:size].copy_(torch.from_numpy(slots), non_blocking=True)
        self.block_table[: len(block_table)].copy_(
            torch.tensor(block_table, dtype=torch.long), non_blocking=True
        )
        self.last_index.fill_(n - 1)
        r.attn.prepare(self.slot_mapping[:size], self.block_table, num_cached, n)

    def _forward(self, size: int) -> torch.Tensor:
        # Reads only the static buffers, the weights and the KV tensor: capturable.
        model = self.runner.model
        hidden = model(self.input_ids[:size], self.positions[:, :size], self.runner.attn)
        return model.compute_logits(hidden.index_select(0, self.last_index))[0]

    def _capture(self, size: int) -> torch.Tensor:
        # Same protocol as the decode graph (engine/cuda_graph.py): an eager run on this thread
        # first (cuBLAS/CuPy state, and the result of this call), then the capture; the step
        # is idempotent (it rewrites the same KV slots with the same values).
        eager = self._forward(size)
        graph, logits = self.capturer.capture(lambda: self._forward(size))
        replay_writes(graph, (logits,), f'prefill graph of {size} tokens on {self.runner.device}')
        self.graphs[size] = (graph, logits, pointer_key(self.runner))
        self.captures += 1
        log.debug('prefill graph captured for %d tokens', size)
        return eager


def pad_like_graphs(runner, buckets=DEFAULT_BUCKETS) -> None:
    """Make an eager ``runner`` pad short text prefills to ``buckets``, as a graph runner does.

    The eager side of a graph == eager comparison (``orin_llm_check``, the GPU tests): cuBLAS
    promises identical rows only for identical shapes, so an unpadded eager prefill may differ
    from a padded graph one in the last bits and flip a later token; at equal row counts both
    run the same kernels and must agree token for token.
    """
    if runner.cuda_graph_active:
        raise ValueError('pad_like_graphs is for an eager runner; this one replays graphs')
    runner.prefill_graphs = PrefillGraphs(runner, buckets)
