# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""diagnostics: keys and levels (docs/architecture.md), and the publish-when state machine."""

import dataclasses

import pytest

pytest.importorskip('diagnostic_msgs.msg')

from orin_llm_node.engine.block_pool import BlockPool  # noqa: E402
from orin_llm_node.engine.kv_manager import KVCacheManager  # noqa: E402
from orin_llm_node.ros import diagnostics as diag  # noqa: E402
from orin_llm_node.ros.diagnostics import ERROR, OK, WARN, DiagnosticsMonitor, NodeFacts  # noqa: E402


def _stats(**changes):
    pool = BlockPool(num_blocks=100, block_size=16, bytes_per_block=16384)
    blocks = [pool.allocate() for _ in range(10)]
    assert None not in blocks
    return dataclasses.replace(KVCacheManager(pool, max_model_len=64).stats(), **changes)


def _values(status):
    return {kv.key: kv.value for kv in status.values}


def test_pool_status_has_every_key_of_the_design():
    status = diag.pool_status(_stats(), {}, warn_fraction=0.9)
    values = _values(status)
    assert set(diag.POOL_KEYS) <= set(values)
    assert values['total_blocks'] == '100' and values['used_blocks'] == '10'
    assert values['usage_pct'] == '10' and values['bytes_per_block'] == '16384'
    assert diag.level_of(status) == OK and status.name == 'orin_llm: kv_block_pool'
    assert all(isinstance(v, str) for v in values.values())


def test_generation_status_has_every_key_of_the_design():
    info = NodeFacts(state='active', device='cpu', dtype='float32', last_ttft_ms=12.5,
                          last_finish_reason='stop', requests=3)
    status = diag.generation_status(info, {})
    values = _values(status)
    assert set(diag.GENERATION_KEYS) <= set(values)
    assert values['last_ttft_ms'] == '12.5' and values['last_vision_ms'] == 'n/a'
    assert values['cuda_graph'] == 'false' and values['requests'] == '3'
    assert diag.level_of(status) == OK


def test_attention_backend_fallback_is_reported_with_its_reason():
    """attention_backend auto fell back on a GPU: the robot runs, slowly; WARN says why."""
    info = NodeFacts(state='active', device='cuda:0', attention_backend='cuda')
    values = _values(diag.generation_status(info, {}))
    assert values['attention_backend'] == 'cuda' and values['backend_fallback_reason'] == ''
    info.update(attention_backend='torch',
                backend_fallback_reason='RuntimeError: Failed to find CUDA headers.')
    status = diag.generation_status(info, {})
    values = _values(status)
    assert values['attention_backend'] == 'torch'
    assert values['backend_fallback_reason'] == 'RuntimeError: Failed to find CUDA headers.'
    assert diag.level_of(status) == WARN and 'Failed to find CUDA headers' in status.message


def test_levels():
    assert diag.level_of(diag.pool_status(_stats(used_blocks=95), {}, 0.9)) == WARN
    assert diag.level_of(diag.pool_status(_stats(), {'evictions': 3}, 0.9)) == WARN
    assert diag.level_of(diag.pool_status(_stats(), {'dropped_turns': 1}, 0.9)) == WARN
    err = diag.pool_status(_stats(), {'truncated_generations': 1}, 0.9)
    assert diag.level_of(err) == ERROR and 'truncated' in err.message
    err = diag.pool_status(_stats(), {'rejected_prompts': 2}, 0.9)
    assert diag.level_of(err) == ERROR and '2 prompt(s) rejected' in err.message
    failed = diag.generation_status(NodeFacts(state='failed', detail='boom'), {})
    assert diag.level_of(failed) == ERROR and 'boom' in failed.message
    warn = diag.generation_status(NodeFacts(state='active'), {'errors': 1})
    assert diag.level_of(warn) == WARN


def _levels(statuses):
    return [diag.level_of(s) for s in statuses]


def test_monitor_publishes_periodically_and_at_once_on_a_level_change():
    mon = DiagnosticsMonitor(period_s=1.0, warn_fraction=0.9)
    info = NodeFacts(state='active')
    stats = _stats()
    assert mon.update(0.0, stats, info) is not None          # first call: publish
    assert mon.update(0.5, stats, info) is None              # nothing changed, not due
    assert mon.seconds_until_due(0.5) == pytest.approx(0.5)
    assert mon.update(1.0, stats, info) is not None          # periodic
    # An exhaustion truncates a generation at t=1.3: ERROR goes out at once...
    stats = _stats(exhaustion_events=1, truncated_generations=1)
    out = mon.update(1.3, stats, info)
    assert out is not None and _levels(out)[0] == ERROR
    assert _values(out[0])['exhaustion_events'] == '1'
    assert mon.update(1.5, stats, info) is None              # same level, not due
    out = mon.update(2.0, stats, info)                       # ...and in the next periodic one
    assert out is not None and _levels(out)[0] == ERROR
    out = mon.update(2.4, stats, info)                       # one period later it clears
    assert out is not None and _levels(out)[0] == OK
    assert mon.update(2.6, stats, info) is None
    assert mon.update(3.0, stats, info) is not None


def test_monitor_counts_only_growth_seen_within_the_period():
    mon = DiagnosticsMonitor(period_s=2.0, warn_fraction=0.9)
    info = NodeFacts(state='active')
    mon.update(0.0, _stats(evictions=5), info)               # old evictions: baseline
    assert _levels(mon.statuses(0.1, _stats(evictions=5), info)) == [OK, OK]
    assert _levels(mon.statuses(0.2, _stats(evictions=7), info))[0] == WARN
    info.add(errors=1)
    assert _levels(mon.statuses(0.3, _stats(evictions=7), info)) == [WARN, WARN]
    assert _levels(mon.statuses(2.5, _stats(evictions=7), info)) == [OK, OK]


def test_monitor_without_an_engine_yet():
    mon = DiagnosticsMonitor(period_s=1.0, warn_fraction=0.9, node_name='robot_llm')
    out = mon.update(0.0, None, NodeFacts(state='loading'))
    assert [s.name for s in out] == ['robot_llm: generation']
    assert 'loading' in out[0].message


def test_generation_info_never_loses_an_update_between_threads():
    # The executor and the worker both count errors; switching threads every microsecond makes
    # a read-modify-write without the lock lose counts (checked by removing the lock).
    import sys
    import threading

    info = NodeFacts(state='active')
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=lambda: [info.add(errors=1) for _ in range(20000)])
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert info.snapshot().errors == 40000
    with pytest.raises(AttributeError):
        info.errors = 1             # no attribute to write around the lock
