# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A CPU stand-in for ``engine.cuda_graph.GraphCapture``: the graph bookkeeping without CUDA.

``CpuGraphCapture().capture(fn)`` runs ``fn`` once and returns a graph whose ``replay()`` runs
``fn`` again and copies its results into the tensors the capture returned, as a CUDA graph
rewrites its static outputs. ``CpuGraphCapture(records=False)`` stands for an empty capture --
the work ran eagerly on another device's stream while the capture recorded nothing -- so its
outputs hold the values of that one eager run and its replays do nothing.
"""

import torch


def _flat(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


class CpuGraph:
    """What ``CpuGraphCapture.capture`` returns: ``replay()`` and a replay count."""

    def __init__(self, fn, outputs, records: bool):
        self.fn, self.outputs, self.records = fn, _flat(outputs), records
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        if self.records:
            for dst, src in zip(self.outputs, _flat(self.fn()), strict=True):
                dst.copy_(src)


class CpuGraphCapture:
    """``capture(fn) -> (graph, fn's outputs)`` on the CPU; counts its captures."""

    def __init__(self, records: bool = True):
        self.records = records
        self.captures = 0

    def capture(self, fn):
        out = fn()
        self.captures += 1
        return CpuGraph(fn, out, self.records), out
