# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Jetson power state from sysfs: power mode, locked clocks, GPU / EMC frequency, temperature.

They explain a slow robot: the same checkpoint decodes markedly faster in MAXN with
``sudo jetson_clocks`` than in a 15 W mode with the governor scaling the clocks down. Read by
the node's ``<node>: platform`` diagnostics status and by ``orin_llm_check``. Every reader takes
the file-system root, so tests run it against a fake tree; whatever is absent (not a Jetson,
debugfs not readable without root) is left None and named in ``missing``.

Sources (JetPack 5 and 6):

* power mode: ``/etc/nvpmodel.conf`` (``< POWER_MODEL ID=0 NAME=MAXN >``) and the current mode
  from ``/var/lib/nvpmodel/status`` (``pmode:0000``);
* GPU frequency: the GPU's devfreq node (``/sys/class/devfreq/17000000.ga10b`` on JetPack 5,
  ``17000000.gpu`` on 6): ``cur_freq``, ``min_freq``, ``max_freq`` in Hz;
* EMC (memory) frequency: ``/sys/kernel/debug/bpmp/debug/clk/emc/rate`` (root only);
* clocks locked (what ``jetson_clocks`` does): GPU ``min_freq == max_freq`` and, where
  present, CPU0's ``scaling_min_freq == scaling_max_freq``;
* temperature: the hottest ``/sys/class/thermal/thermal_zone*/temp`` (millidegrees), with its
  ``type``.
"""

from dataclasses import asdict, dataclass, field
from pathlib import Path
import re

__all__ = ['PowerState', 'read_power_state']

_GPU_DEVFREQ = re.compile(r'(gpu|ga10b|gv11b|gp10b)', re.IGNORECASE)
_MODEL = re.compile(r'<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)')


@dataclass(frozen=True)
class PowerState:
    """What could be read; None where the source is absent (``missing`` says which)."""

    board: str | None = None
    power_mode: str | None = None
    power_mode_id: int | None = None
    clocks_locked: bool | None = None
    gpu_freq_mhz: float | None = None
    gpu_max_freq_mhz: float | None = None
    emc_freq_mhz: float | None = None
    hottest_zone: str | None = None
    hottest_temp_c: float | None = None
    missing: tuple = field(default=())

    @property
    def is_jetson(self) -> bool:
        """True where a Jetson-only source (nvpmodel or the GPU devfreq node) was found."""
        return self.power_mode is not None or self.gpu_freq_mhz is not None

    def as_dict(self) -> dict:
        """The figures (JSON-ready); ``missing`` as a list."""
        out = asdict(self)
        out['missing'] = list(self.missing)
        return out

    def summary(self) -> str:
        """One line, e.g. ``MAXN, clocks locked, GPU 1300 MHz, EMC 3199 MHz, tj 51.2 C``."""
        parts = [self.power_mode or 'power mode n/a']
        if self.clocks_locked is not None:
            parts.append('clocks locked' if self.clocks_locked
                         else 'clocks not locked (sudo jetson_clocks)')
        if self.gpu_freq_mhz is not None:
            parts.append(f'GPU {self.gpu_freq_mhz:.0f} MHz')
        if self.emc_freq_mhz is not None:
            parts.append(f'EMC {self.emc_freq_mhz:.0f} MHz')
        if self.hottest_temp_c is not None:
            parts.append(f'{self.hottest_zone} {self.hottest_temp_c:.1f} C')
        return ', '.join(parts)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors='replace').strip().strip('\x00')
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _power_mode(root: Path) -> tuple[str | None, int | None]:
    status = _text(root / 'var/lib/nvpmodel/status')
    match = re.search(r'pmode:\s*(\d+)', status or '')
    if match is None:
        return None, None
    mode = int(match.group(1))
    names = {int(i): name for i, name in _MODEL.findall(_text(root / 'etc/nvpmodel.conf') or '')}
    return names.get(mode, f'mode {mode}'), mode


def _gpu_devfreq(root: Path) -> Path | None:
    base = root / 'sys/class/devfreq'
    try:
        nodes = sorted(p for p in base.iterdir() if _GPU_DEVFREQ.search(p.name))
    except OSError:
        return None
    return nodes[0] if nodes else None


def _hottest(root: Path) -> tuple[str | None, float | None]:
    best = (None, None)
    for zone in sorted((root / 'sys/class/thermal').glob('thermal_zone*')):
        milli = _int(zone / 'temp')
        # A zone without a working sensor reads -256 C or garbage: keep plausible values only.
        if milli is None or not -40_000 <= milli <= 150_000:
            continue
        if best[1] is None or milli / 1000 > best[1]:
            best = (_text(zone / 'type') or zone.name, milli / 1000)
    return best


def read_power_state(root: str | Path = '/') -> PowerState:
    """Read the power state under ``root`` (``/`` on the robot; a fake tree in tests)."""
    root = Path(root)
    missing = []
    mode, mode_id = _power_mode(root)
    if mode is None:
        missing.append('nvpmodel (/var/lib/nvpmodel/status)')
    gpu = _gpu_devfreq(root)
    cur = lo = hi = None
    if gpu is not None:
        cur, lo, hi = (_int(gpu / f) for f in ('cur_freq', 'min_freq', 'max_freq'))
    if cur is None:
        missing.append('GPU devfreq (/sys/class/devfreq/*gpu*)')
    emc = _int(root / 'sys/kernel/debug/bpmp/debug/clk/emc/rate')
    if emc is None:
        missing.append('EMC rate (/sys/kernel/debug/bpmp/debug/clk/emc/rate, root only)')
    pairs = []
    if lo is not None and hi is not None:
        pairs.append(lo == hi)
    cpu = root / 'sys/devices/system/cpu/cpu0/cpufreq'
    cpu_lo, cpu_hi = _int(cpu / 'scaling_min_freq'), _int(cpu / 'scaling_max_freq')
    if pairs and cpu_lo is not None and cpu_hi is not None:
        pairs.append(cpu_lo == cpu_hi)
    zone, temp = _hottest(root)
    if temp is None:
        missing.append('thermal zones (/sys/class/thermal)')
    return PowerState(
        board=_text(root / 'proc/device-tree/model'),
        power_mode=mode, power_mode_id=mode_id,
        clocks_locked=all(pairs) if pairs else None,
        gpu_freq_mhz=cur / 1e6 if cur is not None else None,
        gpu_max_freq_mhz=hi / 1e6 if hi is not None else None,
        emc_freq_mhz=emc / 1e6 if emc is not None else None,
        hottest_zone=zone, hottest_temp_c=temp, missing=tuple(missing))
