# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A Jetson or a discrete GPU as the memory plan sees it, on the CPU: fake /proc, /sys, CUDA.

``fake_root`` writes the files the plan reads under a temporary root; ``FakeCuda`` stands for
the two torch.cuda calls it makes. Its context takes its share of the RAM when it is created
-- by the first ``cudaMemGetInfo``, as a real one is -- by lowering ``MemAvailable`` in the
fake /proc/meminfo: what a Jetson's unified memory does.
"""

from pathlib import Path
import re
from types import SimpleNamespace

import torch

_KB = 1024


def fake_root(root: Path, available_gb: float, cgroup_max=None, cgroup_used=0,
              own_cgroup: str | None = None, v1: bool = False) -> Path:
    """/proc/meminfo with ``MemAvailable`` (and a cgroup limit when ``cgroup_max`` is given).

    The limit is written into the process's own cgroup ``own_cgroup`` (named in
    /proc/self/cgroup; None: no such file, the limit at the mount point), v2 unless ``v1``.
    """
    (root / 'proc/self').mkdir(parents=True, exist_ok=True)
    (root / 'proc/meminfo').write_text(
        f'MemTotal:       65000000 kB\nMemFree:         1000000 kB\n'
        f'MemAvailable: {int(available_gb * 1e9 / _KB)} kB\n')
    if cgroup_max is not None:
        path = (own_cgroup or '/').strip('/')
        if v1:
            write_cgroup_v1(root, path, cgroup_max, cgroup_used)
        else:
            write_cgroup_v2(root, path, cgroup_max, cgroup_used)
    if own_cgroup is not None:
        line = f'9:memory:{own_cgroup}\n' if v1 else f'0::{own_cgroup}\n'
        (root / 'proc/self/cgroup').write_text(line)
    return root


def write_cgroup_v2(root: Path, path: str, limit, used) -> None:
    """``memory.max`` and ``memory.current`` of cgroup ``path`` (v2, unified)."""
    cg = root / 'sys/fs/cgroup' / path
    cg.mkdir(parents=True, exist_ok=True)
    (cg / 'memory.max').write_text(f'{limit}\n')
    (cg / 'memory.current').write_text(f'{used}\n')


def write_cgroup_v1(root: Path, path: str, limit, used) -> None:
    """``memory.limit_in_bytes`` and ``memory.usage_in_bytes`` of cgroup ``path`` (v1)."""
    cg = root / 'sys/fs/cgroup/memory' / path
    cg.mkdir(parents=True, exist_ok=True)
    (cg / 'memory.limit_in_bytes').write_text(f'{limit}\n')
    (cg / 'memory.usage_in_bytes').write_text(f'{used}\n')


class FakeCuda:
    """``torch.cuda.get_device_properties`` and ``mem_get_info`` of one pretend device.

    ``context``: bytes the CUDA context takes when it is created (the first
    ``mem_get_info``), from the free device memory and, given ``root``, from the fake RAM.
    """

    def __init__(self, monkeypatch, integrated: bool, free: int, total: int,
                 root: Path | None = None, context: int = 0):
        self.integrated, self.free, self.total = integrated, free, total
        self.root, self.context = root, context
        self.created = False
        monkeypatch.setattr(torch.cuda, 'get_device_properties', self.properties)
        monkeypatch.setattr(torch.cuda, 'mem_get_info', self.mem_get_info)

    def properties(self, device=None):
        return SimpleNamespace(is_integrated=self.integrated, total_memory=self.total,
                               name='fake')

    def mem_get_info(self, device=None):
        if not self.created:
            self.created = True
            self.free -= self.context
            if self.root is not None:
                meminfo = self.root / 'proc/meminfo'
                meminfo.write_text(re.sub(
                    r'MemAvailable:\s+(\d+) kB',
                    lambda m: f'MemAvailable: {int(m[1]) - self.context // _KB} kB',
                    meminfo.read_text()))
        return self.free, self.total
