# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The Jetson power state (jetson_power.py) against fake sysfs trees, and its diagnostics."""

from orin_llm_node.jetson_power import read_power_state
from orin_llm_node.ros.diagnostics import (
    OK,
    WARN,
    DiagnosticsMonitor,
    NodeFacts,
    level_of,
    platform_status,
)

NVPMODEL_CONF = """
< PARAM TYPE=FILE NAME=CPU_ONLINE >
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MODE_15W >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=2 >
"""


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def agx_orin(root, mode=0, locked=True, gpu_node='17000000.gpu', temps=(45500, 51250, -256000)):
    """A JetPack 6 AGX Orin tree: nvpmodel, GPU devfreq, EMC, CPU0 cpufreq, thermal zones."""
    write(root, 'proc/device-tree/model', 'NVIDIA Jetson AGX Orin Developer Kit\x00')
    write(root, 'etc/nvpmodel.conf', NVPMODEL_CONF)
    write(root, 'var/lib/nvpmodel/status', f'pmode:{mode:04d} fmode:quiet\n')
    gpu = f'sys/class/devfreq/{gpu_node}'
    write(root, f'{gpu}/cur_freq', '1300500000\n')
    write(root, f'{gpu}/max_freq', '1300500000\n')
    write(root, f'{gpu}/min_freq', '1300500000\n' if locked else '306000000\n')
    write(root, 'sys/class/devfreq/15340000.vic/cur_freq', '115200000\n')
    write(root, 'sys/kernel/debug/bpmp/debug/clk/emc/rate', '3199000000\n')
    cpu = 'sys/devices/system/cpu/cpu0/cpufreq'
    write(root, f'{cpu}/scaling_min_freq', '2201600\n')
    write(root, f'{cpu}/scaling_max_freq', '2201600\n')
    names = ('cpu-thermal', 'tj-thermal', 'dead')
    for i, (name, milli) in enumerate(zip(names, temps, strict=True)):
        write(root, f'sys/class/thermal/thermal_zone{i}/type', name + '\n')
        write(root, f'sys/class/thermal/thermal_zone{i}/temp', f'{milli}\n')
    return root


def test_maxn_with_jetson_clocks(tmp_path):
    state = read_power_state(agx_orin(tmp_path))
    assert state.is_jetson and state.board == 'NVIDIA Jetson AGX Orin Developer Kit'
    assert (state.power_mode, state.power_mode_id) == ('MAXN', 0)
    assert state.clocks_locked is True
    assert state.gpu_freq_mhz == 1300.5 and state.gpu_max_freq_mhz == 1300.5
    assert state.emc_freq_mhz == 3199.0
    assert (state.hottest_zone, state.hottest_temp_c) == ('tj-thermal', 51.25)
    assert state.missing == ()
    assert state.summary() == ('MAXN, clocks locked, GPU 1300 MHz, EMC 3199 MHz, '
                               'tj-thermal 51.2 C')


def test_15w_mode_with_scaling_clocks_on_jetpack5(tmp_path):
    state = read_power_state(agx_orin(tmp_path, mode=1, locked=False, gpu_node='17000000.ga10b'))
    assert state.power_mode == 'MODE_15W' and state.clocks_locked is False
    assert 'sudo jetson_clocks' in state.summary()


def test_absent_sources_are_skipped_cleanly(tmp_path):
    state = read_power_state(tmp_path)           # an empty tree: not a Jetson
    assert not state.is_jetson
    assert state.power_mode is None and state.clocks_locked is None
    assert state.gpu_freq_mhz is None and state.emc_freq_mhz is None
    assert state.hottest_temp_c is None and len(state.missing) == 4
    # Without root, debugfs is unreadable: everything else still reads.
    agx_orin(tmp_path)
    (tmp_path / 'sys/kernel/debug/bpmp/debug/clk/emc/rate').unlink()
    state = read_power_state(tmp_path)
    assert state.emc_freq_mhz is None and state.power_mode == 'MAXN'
    assert [m.split(' ')[0] for m in state.missing] == ['EMC']


def test_platform_status_in_diagnostics(tmp_path):
    root = agx_orin(tmp_path)
    monitor = DiagnosticsMonitor(period_s=1.0, warn_fraction=0.9,
                                 power_reader=lambda: read_power_state(root))
    statuses = monitor.update(0.0, None, NodeFacts(state='active'), force=True)
    platform = [s for s in statuses if s.name == 'orin_llm: platform']
    assert len(platform) == 1 and level_of(platform[0]) == OK
    values = {kv.key: kv.value for kv in platform[0].values}
    assert values['power_mode'] == 'MAXN' and values['clocks_locked'] == 'true'
    assert values['gpu_freq_mhz'] == '1300.5' and values['hottest_zone'] == 'tj-thermal'
    hot = read_power_state(agx_orin(tmp_path / 'hot', temps=(95000, 40000, 0)))
    assert level_of(platform_status(hot)) == WARN
    # Not a Jetson: no platform status at all.
    bare = DiagnosticsMonitor(period_s=1.0, warn_fraction=0.9,
                              power_reader=lambda: read_power_state(tmp_path / 'none'))
    names = [s.name for s in bare.update(0.0, None, NodeFacts(state='active'), force=True)]
    assert names == ['orin_llm: generation']
