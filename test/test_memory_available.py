# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the process may take (``memory_plan.available_memory``) on fake /proc and /sys trees.

On a CUDA device the figures are read once the CUDA context exists: on a Jetson the context
takes its share of the same RAM, and a plan read before it counts that share twice as free.
The cgroup limit is the one of the process's own cgroup and of every cgroup above it (a
systemd ``MemoryMax=`` sits on the service's cgroup, never on the root), v2 and v1.
"""

from _memory_fakes import FakeCuda, fake_root, write_cgroup_v1, write_cgroup_v2
import pytest
import torch

from orin_llm_node.engine.memory_plan import available_memory

CPU, CUDA = torch.device('cpu'), torch.device('cuda')
GB = 10**9
#: What the pretend CUDA context takes when it is created (of the order of torch's: 287 MB of
#: device memory with lazy loading, PyTorch pull request 86509).
CONTEXT = 300 * 10**6
SERVICE = '/system.slice/orin_llm.service'


def test_a_jetson_reads_the_ram_after_the_cuda_context_exists(tmp_path, monkeypatch):
    root = fake_root(tmp_path, 10.0)
    cuda = FakeCuda(monkeypatch, True, 6 * GB, 16 * 2**30, root, context=CONTEXT)
    value, integrated, source = available_memory(CUDA, root)
    assert cuda.created and integrated and source == 'MemAvailable'
    assert value == pytest.approx(10 * GB - CONTEXT, abs=1024)


def test_a_jetson_without_meminfo_falls_back_to_the_device_figure(tmp_path, monkeypatch):
    FakeCuda(monkeypatch, True, 6 * GB, 16 * 2**30, context=CONTEXT)
    value, integrated, source = available_memory(CUDA, tmp_path)
    assert (value, integrated, source) == (6 * GB - CONTEXT, True, 'cudaMemGetInfo')


def test_a_discrete_gpu_reads_its_free_memory_after_the_context(tmp_path, monkeypatch):
    FakeCuda(monkeypatch, False, 70 * GB, 80 * 2**30, context=CONTEXT)
    value, integrated, source = available_memory(CUDA, fake_root(tmp_path, 5.0))
    assert (value, integrated, source) == (70 * GB - CONTEXT, False, 'cudaMemGetInfo')


def test_the_own_cgroup_v2_limit_of_a_systemd_service(tmp_path):
    # MemoryMax= on the service: its cgroup, not the root, holds the limit.
    root = fake_root(tmp_path, 28.0, cgroup_max=6 * GB, cgroup_used=GB, own_cgroup=SERVICE)
    assert available_memory(CPU, root) == (5 * GB, False, f'cgroup limit of {SERVICE}')


def test_a_tighter_limit_above_the_own_cgroup_wins(tmp_path, monkeypatch):
    root = fake_root(tmp_path, 28.0, cgroup_max=6 * GB, cgroup_used=GB, own_cgroup=SERVICE)
    write_cgroup_v2(root, 'system.slice', 4 * GB, int(3.5 * GB))
    write_cgroup_v2(root, '', 'max', 20 * GB)  # the root: no limit
    assert available_memory(CPU, root) == (GB // 2, False, 'cgroup limit of /system.slice')
    FakeCuda(monkeypatch, True, 6 * GB, 32 * 2**30, root)
    assert available_memory(CUDA, root) == (GB // 2, True, 'cgroup limit of /system.slice')


def test_an_unlimited_own_cgroup_leaves_meminfo(tmp_path):
    root = fake_root(tmp_path, 28.0, cgroup_max='max', cgroup_used=GB, own_cgroup=SERVICE)
    value, _, source = available_memory(CPU, root)
    assert source == 'MemAvailable' and value == pytest.approx(28 * GB, abs=1024)


def test_the_own_cgroup_v1_limit(tmp_path):
    root = fake_root(tmp_path, 28.0, cgroup_max=3 * GB, cgroup_used=GB, own_cgroup=SERVICE,
                     v1=True)
    # v1 "no limit" is a page-rounded 2^63 at the root.
    write_cgroup_v1(root, '', 9223372036854771712, 20 * GB)
    assert available_memory(CPU, root) == (2 * GB, False, f'cgroup limit of {SERVICE}')


def test_a_v1_container_sees_its_cgroup_at_the_mount_point(tmp_path):
    # Without a cgroup namespace the path names the host's hierarchy, which is not mounted.
    root = fake_root(tmp_path, 28.0, own_cgroup='/docker/0123abcd', v1=True)
    write_cgroup_v1(root, '', 4 * GB, GB)
    assert available_memory(CPU, root) == (3 * GB, False, 'cgroup limit of /')


def test_without_proc_self_cgroup_the_mount_point_limit_counts(tmp_path):
    root = fake_root(tmp_path, 28.0, cgroup_max=6 * GB, cgroup_used=GB)
    assert available_memory(CPU, root) == (5 * GB, False, 'cgroup limit of /')
