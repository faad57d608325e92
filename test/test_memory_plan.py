# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The memory plan (engine/memory_plan.py) on the CPU with the device monkeypatched.

Jetson Orins (integrated GPU: ``is_integrated``, ``MemAvailable`` from a fake /proc) of 8, 32
and 64 GB with the published 2B and 8B configs in bf16 and int4: the pool is sized for what is
configured (two ``max_model_len`` conversations), not half the RAM; an 8 GB board refuses
2B bf16 before a weight is read, naming the settings that would fit.
"""

import shutil
from types import SimpleNamespace

from conftest import REPO
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, llm_engine, memory_plan
from orin_llm_node.engine.memory_plan import KV_CONVERSATIONS, MemoryPlanError, plan_memory

CONFIGS = REPO / 'test' / 'data' / 'qwen3_vl_configs'
#: MemAvailable on a freshly booted JetPack 6 board (desktop off): what the process may take.
ORIN_AVAILABLE_GB = {8: 5.5, 32: 28.0, 64: 58.0}
#: Which (size, format) fit with max_model_len 8192, per board.
FITS = {8: {('2b', 'int4')}, 32: {('2b', 'none'), ('2b', 'int4'), ('8b', 'none'), ('8b', 'int4')},
        64: {('2b', 'none'), ('2b', 'int4'), ('8b', 'none'), ('8b', 'int4')}}


@pytest.fixture(scope='module')
def published(tmp_path_factory):
    """Checkpoint directories holding only the published config.json (no weights)."""
    root = tmp_path_factory.mktemp('published')
    for size in ('2b', '8b'):
        (root / size).mkdir()
        shutil.copy(CONFIGS / f'qwen3-vl-{size}-instruct.config.json', root / size / 'config.json')
    return root


def fake_root(tmp_path, available_gb, cgroup_max=None, cgroup_used=0):
    """A file-system root with /proc/meminfo (and a cgroup v2 limit when given)."""
    (tmp_path / 'proc').mkdir(parents=True, exist_ok=True)
    (tmp_path / 'proc/meminfo').write_text(
        f'MemTotal:       65000000 kB\nMemFree:         1000000 kB\n'
        f'MemAvailable: {int(available_gb * 1e9 / 1024)} kB\n')
    if cgroup_max is not None:
        cg = tmp_path / 'sys/fs/cgroup'
        cg.mkdir(parents=True, exist_ok=True)
        (cg / 'memory.max').write_text(f'{cgroup_max}\n')
        (cg / 'memory.current').write_text(f'{cgroup_used}\n')
    return tmp_path


@pytest.fixture
def gpu(monkeypatch):
    """Pretend a CUDA device: ``gpu(integrated, free_bytes, total_bytes)``."""
    def set_device(integrated, free, total):
        monkeypatch.setattr(torch.cuda, 'get_device_properties',
                            lambda dev=None: SimpleNamespace(is_integrated=integrated,
                                                             total_memory=total, name='fake'))
        monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda dev=None: (free, total))
    return set_device


@pytest.mark.parametrize('quant', ['none', 'int4'], ids=['bf16', 'int4'])
@pytest.mark.parametrize('size', ['2b', '8b'])
@pytest.mark.parametrize('board', [8, 32, 64])
def test_orin_boards(published, tmp_path, gpu, board, size, quant):
    gb = ORIN_AVAILABLE_GB[board]
    # cudaMemGetInfo on Tegra counts no reclaimable page cache: a lower figure, not the one used.
    gpu(True, int(gb * 0.6e9), board * 2**30)
    cfg = EngineConfig(model_path=published / size, quantization=quant,
                       image_max_pixels=307200)
    plan = plan_memory(cfg, torch.device('cuda'), torch.bfloat16, fake_root(tmp_path, gb))
    assert plan.integrated and plan.available_source == 'MemAvailable'
    assert plan.available == pytest.approx(gb * 1e9, rel=1e-3)
    assert plan.kv_bytes_per_token == {'2b': 28, '8b': 36}[size] * 2 * 8 * 128 * 2
    assert plan.kv_one_conversation == 8192 * plan.kv_bytes_per_token
    assert plan.kv_fraction == memory_plan.KV_FRACTION_SHARED
    assert plan.fits == ((size, quant) in FITS[board]), plan.refusal()
    assert set(plan.scratch) >= {'prefill_activations', 'vision_activations', 'cublas_workspace',
                                 'cuda_graph_pools', 'headroom'}
    assert ('quantized_prefill_layer' in plan.scratch) == (quant != 'none')
    if not plan.fits:
        line = plan.refusal()
        assert '\n' not in line and 'weights' in line and 'available' in line
        return
    # Sized for what is configured: two conversations, never more than the cap.
    assert plan.kv <= max(plan.kv_cap, plan.kv_one_conversation)
    assert plan.kv >= plan.kv_one_conversation
    assert plan.kv <= KV_CONVERSATIONS * plan.kv_one_conversation
    if board == 64:     # the old rule took half of the free RAM: ~25 GB
        assert plan.kv == KV_CONVERSATIONS * plan.kv_one_conversation < 3e9
    assert plan.weights + plan.kv + plan.scratch_total <= plan.available


def test_8gb_orin_refuses_2b_bf16_and_names_what_fits(published, tmp_path, gpu):
    gpu(True, 3 * 10**9, 8 * 2**30)
    cfg = EngineConfig(model_path=published / '2b', image_max_pixels=307200)
    plan = plan_memory(cfg, torch.device('cuda'), torch.bfloat16, fake_root(tmp_path, 5.5))
    assert not plan.fits
    line = plan.refusal()
    assert 'weights 4.26 GB (bfloat16)' in line and '8192-token conversation 0.94 GB' in line
    assert 'quantization=int8' in line and 'max_model_len=' in line
    assert 'kv_cache_memory_mb=' in line
    # Each suggestion really fits.
    for fix in plan.would_fit:
        key, value = fix.split(' ')[0].split('=')
        value = value if key == 'quantization' else int(value)
        ok = plan_memory(EngineConfig(model_path=published / '2b', image_max_pixels=307200,
                                      **{key: value}),
                         torch.device('cuda'), torch.bfloat16, tmp_path)
        assert ok.fits, (fix, ok.refusal())


def test_long_max_model_len_is_capped_by_the_fraction(published, tmp_path, gpu):
    gpu(True, 10**9, 64 * 2**30)
    cfg = EngineConfig(model_path=published / '2b', max_model_len=131072,
                       image_max_pixels=307200)
    plan = plan_memory(cfg, torch.device('cuda'), torch.bfloat16, fake_root(tmp_path, 58.0))
    assert plan.fits
    assert plan.kv_wanted == 2 * plan.kv_one_conversation > plan.kv_cap
    assert plan.kv <= plan.kv_cap
    assert plan.kv_cap == int(0.5 * (plan.available - plan.weights - plan.scratch_total))


def test_discrete_gpu_uses_free_device_memory(published, tmp_path, gpu):
    gpu(False, 70 * 10**9, 80 * 2**30)
    cfg = EngineConfig(model_path=published / '8b', max_model_len=65536)
    plan = plan_memory(cfg, torch.device('cuda'), torch.bfloat16, fake_root(tmp_path, 5.0))
    assert not plan.integrated and plan.available_source == 'cudaMemGetInfo'
    assert plan.available == 70 * 10**9 and plan.kv_fraction == 0.9
    assert plan.fits and plan.kv <= plan.kv_cap


def test_cgroup_limit_lowers_what_the_process_may_take(published, tmp_path, gpu):
    gpu(True, 20 * 10**9, 32 * 2**30)
    root = fake_root(tmp_path, 28.0, cgroup_max=6 * 10**9, cgroup_used=10**9)
    plan = plan_memory(EngineConfig(model_path=published / '2b'), torch.device('cuda'),
                       torch.bfloat16, root)
    assert plan.available == 5 * 10**9 and plan.available_source == 'cgroup limit'


def test_engine_refuses_before_reading_a_weight(tiny_ckpt, monkeypatch):
    """The engine config path: one line, and load_model is never reached."""
    def no_load(*a, **k):
        raise AssertionError('load_model ran although the plan does not fit')

    monkeypatch.setattr(llm_engine, 'load_model', no_load)
    weights = plan_memory(EngineConfig(model_path=tiny_ckpt, device='cpu')).weights
    monkeypatch.setattr(memory_plan, 'available_memory',
                        lambda device, root='/': (weights + 2**20, False, 'MemAvailable'))
    with pytest.raises(MemoryPlanError) as err:
        LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu'))
    line = str(err.value)
    assert '\n' not in line and 'does not fit' in line and 'max_model_len=' not in line
    assert 'use a smaller one' in line or 'kv_cache_memory_mb=' in line


def test_explicit_kv_beyond_the_memory_is_refused(tiny_ckpt, monkeypatch):
    monkeypatch.setattr(memory_plan, 'available_memory',
                        lambda device, root='/': (2 * 10**9, False, 'MemAvailable'))
    plan = plan_memory(EngineConfig(model_path=tiny_ckpt, device='cpu',
                                    kv_cache_memory_mb=4000))
    assert not plan.fits and '(kv_cache_memory_mb)' in plan.refusal()
    assert any(f.startswith('kv_cache_memory_mb=') for f in plan.would_fit)
    fits = plan_memory(EngineConfig(model_path=tiny_ckpt, device='cpu'))
    assert fits.fits and fits.num_blocks == -(-2 * 8192 // 16)
