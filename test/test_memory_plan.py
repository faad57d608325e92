# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The memory plan (engine/memory_plan.py) on the CPU with the device monkeypatched.

Jetson Orins (integrated GPU: ``is_integrated``, ``MemAvailable`` from a fake /proc) of 8, 16,
32 and 64 GB with the published 2B, 4B and 8B configs in bf16, int8 and int4: the pool is
sized for what is configured (two ``max_model_len`` conversations, capped by the shared
fraction), never holds less than one whole conversation when the plan says it fits, and a
configuration that cannot is refused before a weight is read, naming the settings that fit.
"""

import math
import shutil

from _memory_fakes import FakeCuda, fake_root
from conftest import REPO
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, llm_engine, memory_plan
from orin_llm_node.engine.memory_plan import KV_CONVERSATIONS, MemoryPlanError, plan_memory

CONFIGS = REPO / 'test' / 'data' / 'qwen3_vl_configs'
CUDA = torch.device('cuda')
#: MemAvailable on a freshly booted JetPack 6 board (desktop off), before the CUDA context.
ORIN_AVAILABLE_GB = {8: 5.5, 16: 12.5, 32: 28.0, 64: 58.0}
#: What the pretend CUDA context takes from the RAM when the plan creates it (torch's context
#: is 287 MB of device memory with lazy loading: PyTorch pull request 86509).
CONTEXT = 300 * 10**6
#: Which (size, format) fit with max_model_len 8192, per board. The 8 GB board runs 2B int4
#: and int8 with a shorter max_model_len (the refusal names it); 4B bf16 on 16 GB would get a
#: pool smaller than one conversation.
FITS = {8: set(),
        16: {('2b', 'none'), ('2b', 'int8'), ('2b', 'int4'), ('4b', 'int8'), ('4b', 'int4'),
             ('8b', 'int4')},
        32: {(s, q) for s in ('2b', '4b', '8b') for q in ('none', 'int8', 'int4')},
        64: {(s, q) for s in ('2b', '4b', '8b') for q in ('none', 'int8', 'int4')}}


@pytest.fixture(scope='module')
def published(tmp_path_factory):
    """Checkpoint directories holding only the published config.json (no weights)."""
    root = tmp_path_factory.mktemp('published')
    for size in ('2b', '4b', '8b'):
        (root / size).mkdir()
        shutil.copy(CONFIGS / f'qwen3-vl-{size}-instruct.config.json', root / size / 'config.json')
    return root


def jetson(monkeypatch, tmp_path, available_gb, **cgroup):
    """A Jetson whose RAM shows ``available_gb`` before the plan creates the CUDA context."""
    root = fake_root(tmp_path, available_gb, **cgroup)
    FakeCuda(monkeypatch, True, int(available_gb * 0.6e9), 64 * 2**30, root, context=CONTEXT)
    return root


def assert_pool_holds_one_conversation(plan):
    """What "fits" promises: the pool holds a whole max_model_len conversation, and it fits."""
    assert plan.fits, plan.refusal()
    assert plan.num_blocks * plan.block_size >= plan.max_model_len
    assert plan.kv >= plan.kv_one_conversation
    assert plan.weights + plan.kv + plan.scratch_total <= plan.available


def assert_each_suggestion_fits(plan, path, monkeypatch, tmp_path, available_gb, **kw):
    """Each ``would_fit`` setting, alone, gives a plan that fits on the same board."""
    assert plan.would_fit, plan.refusal()
    for i, fix in enumerate(plan.would_fit):
        settings = dict(s.split('=') for s in fix.split(' (')[0].split(' with '))
        settings = {k: v if k == 'quantization' else int(v) for k, v in settings.items()}
        root = jetson(monkeypatch, tmp_path / str(i), available_gb)
        ok = plan_memory(EngineConfig(model_path=path, image_max_pixels=307200,
                                      **{**kw, **settings}), CUDA, torch.bfloat16, root)
        assert ok.fits, (fix, ok.refusal())
        if 'kv_cache_memory_mb' not in settings:
            assert_pool_holds_one_conversation(ok)


@pytest.mark.parametrize('quant', ['none', 'int8', 'int4'])
@pytest.mark.parametrize('size', ['2b', '4b', '8b'])
@pytest.mark.parametrize('board', [8, 16, 32, 64])
def test_orin_boards(published, tmp_path, monkeypatch, board, size, quant):
    gb = ORIN_AVAILABLE_GB[board]
    # cudaMemGetInfo on Tegra counts no reclaimable page cache: a lower figure, not the one used.
    cfg = EngineConfig(model_path=published / size, quantization=quant,
                       image_max_pixels=307200)
    plan = plan_memory(cfg, CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path, gb))
    assert plan.integrated and plan.available_source == 'MemAvailable'
    assert plan.available == pytest.approx(gb * 1e9 - CONTEXT, rel=1e-6)
    assert plan.kv_bytes_per_token == {'2b': 28, '4b': 36, '8b': 36}[size] * 2 * 8 * 128 * 2
    assert plan.kv_one_conversation == 8192 * plan.kv_bytes_per_token
    assert plan.kv_fraction == memory_plan.KV_FRACTION_SHARED
    assert plan.fits == ((size, quant) in FITS[board]), plan.refusal()
    assert set(plan.scratch) >= {'prefill_activations', 'vision_activations', 'cublas_workspace',
                                 'cuda_graph_pools', 'cuda_lazy_modules', 'nvrtc_compile',
                                 'headroom'}
    assert ('quantized_prefill_layer' in plan.scratch) == (quant != 'none')
    if not plan.fits:
        line = plan.refusal()
        assert '\n' not in line and 'weights' in line and 'available' in line
        return
    assert_pool_holds_one_conversation(plan)
    # Sized for what is configured: two conversations, never more than the cap.
    assert plan.kv <= max(plan.kv_cap, plan.kv_one_conversation)
    assert plan.kv <= KV_CONVERSATIONS * plan.kv_one_conversation
    if board == 64:     # the old rule took half of the free RAM: ~25 GB
        assert plan.kv == KV_CONVERSATIONS * plan.kv_one_conversation < 3e9


@pytest.mark.parametrize('size, quant, max_model_len', [
    ('2b', 'none', 8192), ('2b', 'int4', 8192), ('4b', 'none', 8192), ('8b', 'none', 8192),
    ('8b', 'int4', 32768)])
def test_fits_means_the_pool_holds_one_whole_conversation(published, tmp_path, monkeypatch,
                                                          size, quant, max_model_len):
    """Across the line, on boards with more or less memory in use beside the node.

    Between "one conversation fits beside the weights and scratch" and "the pool's share holds
    one" the plan used to say it fits and then gave the pool its share: fewer tokens than one
    conversation (answers cut, turns dropped). There it is refused now, with figures and
    settings that do fit; above the line the pool holds a whole conversation.
    """
    cfg = EngineConfig(model_path=published / size, quantization=quant,
                       max_model_len=max_model_len, image_max_pixels=307200)
    probe = plan_memory(cfg, CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path / 'probe', 64))
    one = probe.kv_one_conversation
    old_line = probe.weights + one + probe.scratch_total
    line = probe.needed  # it does not depend on what is available
    band = (old_line + line) // 2
    for i, target in enumerate((old_line + 2**20, band, line - 2**20, line + 2**20,
                                line + one, 2 * line)):
        gb = (target + CONTEXT) / 1e9
        plan = plan_memory(cfg, CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path / str(i), gb))
        if plan.fits:
            assert plan.available >= line
            assert_pool_holds_one_conversation(plan)
            assert plan.kv <= max(plan.kv_cap, one)
            continue
        assert plan.available < line == plan.needed == (
            plan.weights + math.ceil(one / plan.kv_fraction) + plan.scratch_total)
        refusal = plan.refusal()
        assert f'one {max_model_len}-token conversation' in refusal and 'available' in refusal
        if target == band:
            assert_each_suggestion_fits(plan, published / size, monkeypatch, tmp_path / 'fix',
                                        gb, quantization=quant, max_model_len=max_model_len)


@pytest.mark.parametrize('available_gb', [21.0, 21.4, 21.8])
def test_8b_bf16_beside_a_desktop_is_refused_not_short(published, tmp_path, monkeypatch,
                                                       available_gb):
    """A 32 GB Orin with a desktop running: its share would hold 4.8-7.5k of 8192 tokens."""
    gb = available_gb + CONTEXT / 1e9
    plan = plan_memory(EngineConfig(model_path=published / '8b', image_max_pixels=307200),
                       CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path, gb))
    assert plan.weights + plan.kv_one_conversation + plan.scratch_total <= plan.available
    assert plan.kv_cap < plan.kv_one_conversation and not plan.fits
    line = plan.refusal()
    assert 'weights 17.53 GB (bfloat16)' in line and '8192-token conversation: 1.21 GB' in line
    assert 'the pool takes 50% of what is left' in line
    assert_each_suggestion_fits(plan, published / '8b', monkeypatch, tmp_path / 'fix', gb)
    assert any(f.startswith('kv_cache_memory_mb=') for f in plan.would_fit)


def test_8gb_orin_refuses_2b_bf16_and_names_what_fits(published, tmp_path, monkeypatch):
    plan = plan_memory(EngineConfig(model_path=published / '2b', image_max_pixels=307200),
                       CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path, 5.5))
    assert not plan.fits
    line = plan.refusal()
    assert 'weights 4.26 GB (bfloat16)' in line and '8192-token conversation: 0.94 GB' in line
    assert 'quantization=int4 with max_model_len=' in line
    assert_each_suggestion_fits(plan, published / '2b', monkeypatch, tmp_path / 'fix', 5.5)


def test_8gb_orin_runs_2b_int4_at_the_suggested_length(published, tmp_path, monkeypatch):
    cfg = EngineConfig(model_path=published / '2b', quantization='int4',
                       image_max_pixels=307200)
    plan = plan_memory(cfg, CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path, 5.5))
    assert not plan.fits and {f.split('=')[0] for f in plan.would_fit} == {
        'max_model_len', 'kv_cache_memory_mb'}
    assert_each_suggestion_fits(plan, published / '2b', monkeypatch, tmp_path / 'fix', 5.5,
                                quantization='int4')


def test_long_max_model_len_is_capped_by_the_fraction(published, tmp_path, monkeypatch):
    cfg = EngineConfig(model_path=published / '2b', max_model_len=131072,
                       image_max_pixels=307200)
    plan = plan_memory(cfg, CUDA, torch.bfloat16, jetson(monkeypatch, tmp_path, 58.0))
    assert_pool_holds_one_conversation(plan)
    assert plan.kv_wanted == 2 * plan.kv_one_conversation > plan.kv_cap
    assert plan.kv <= plan.kv_cap
    assert plan.kv_cap == int(0.5 * (plan.available - plan.weights - plan.scratch_total))


def test_discrete_gpu_uses_free_device_memory(published, tmp_path, monkeypatch):
    FakeCuda(monkeypatch, False, 70 * 10**9, 80 * 2**30, context=CONTEXT)
    cfg = EngineConfig(model_path=published / '8b', max_model_len=65536)
    plan = plan_memory(cfg, CUDA, torch.bfloat16, fake_root(tmp_path, 5.0))
    assert not plan.integrated and plan.available_source == 'cudaMemGetInfo'
    assert plan.available == 70 * 10**9 - CONTEXT and plan.kv_fraction == 0.9
    assert 'cuda_lazy_modules' in plan.scratch and 'nvrtc_compile' not in plan.scratch
    assert_pool_holds_one_conversation(plan)
    assert plan.kv <= plan.kv_cap


def test_a_service_cgroup_limit_lowers_what_the_process_may_take(published, tmp_path,
                                                                 monkeypatch):
    root = jetson(monkeypatch, tmp_path, 28.0, cgroup_max=6 * 10**9, cgroup_used=10**9,
                  own_cgroup='/system.slice/orin_llm.service')
    plan = plan_memory(EngineConfig(model_path=published / '2b'), CUDA, torch.bfloat16, root)
    assert plan.available == 5 * 10**9
    assert plan.available_source == 'cgroup limit of /system.slice/orin_llm.service'
    assert 'cgroup limit of /system.slice/orin_llm.service' in plan.refusal()


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
