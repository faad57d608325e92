# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Engine statistics -> diagnostic_msgs/DiagnosticStatus, and when to publish them.

Two statuses (docs/architecture.md): ``<node>: kv_block_pool`` (block counts and exhaustion-ladder
counters) and ``<node>: generation`` (latency, queue, last request).  Levels are judged on what
happened *in the last period*: a counter that grew less than ``period_s`` ago (as first seen by
:meth:`DiagnosticsMonitor.update`) raises the level, so one exhaustion shows as ERROR in at least
one periodic message and then clears.  :class:`DiagnosticsMonitor` publishes every ``period_s``
and at once when a level changes -- never per block or per token.

On a Jetson a third status, ``<node>: platform``: power mode, locked clocks, GPU / EMC
frequency and the hottest thermal zone (``orin_llm_node.jetson_power``).

Everything here is pure (the caller passes the clock), so it is unit-tested without rclpy.
"""

from dataclasses import dataclass, field, replace
import threading

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from orin_llm_node.ros.backend_diagnostics import backend_level, backend_values
from orin_llm_node.valid_text import valid_text

OK = 0
WARN = 1
ERROR = 2
LEVEL_NAMES = {OK: 'OK', WARN: 'WARN', ERROR: 'ERROR'}

POOL_KEYS = ('total_blocks', 'free_blocks', 'cached_blocks', 'used_blocks', 'usage_pct',
             'block_size', 'bytes_per_block', 'prefix_hit_rate', 'evictions',
             'exhaustion_events', 'truncated_generations', 'rejected_prompts')
# Reported too when the engine provides them (they explain what the ladder did).
POOL_EXTRA_KEYS = ('prefix_hits', 'prefix_misses', 'dropped_turns', 'vision_cache_hits',
                   'vision_cache_misses')
GENERATION_KEYS = ('device', 'dtype', 'weight_format', 'weight_bytes', 'cuda_graph',
                   'attention_backend', 'backend_fallback_reason', 'last_ttft_ms',
                   'last_vision_ms', 'last_decode_tok_s', 'queue_depth', 'requests', 'errors',
                   'last_image_stamp', 'last_finish_reason', 'video_buffer_frames',
                   'video_buffer_bytes', 'video_buffer_limit_bytes')

# Counters whose growth is judged per period, and the level that growth raises.
_WINDOWED = {
    'truncated_generations': ERROR,
    'rejected_prompts': ERROR,
    'exhaustion_events': WARN,     # handled lower on the ladder (turns dropped) if nothing else
    'dropped_turns': WARN,
    'evictions': WARN,
    'errors': WARN,
    'dropped_prompts': WARN,
    'callback_faults': WARN,
}


@dataclass(frozen=True)
class FactsSnapshot:
    """What the node knows about generation at one moment (see :class:`NodeFacts`)."""

    state: str = 'loading'          # unconfigured | loading | inactive | active | failed |
    #                                 finalized (the lifecycle's names; loading: configuring)
    device: str = ''
    dtype: str = ''
    weight_format: str = ''         # dtype name, or quantized layers' source:format
    weight_bytes: int = 0
    cuda_graph: bool = False
    attention_backend: str = ''     # cuda | torch
    backend_fallback_reason: str = ''  # why attention_backend auto runs torch on CUDA
    last_ttft_ms: float | None = None
    last_vision_ms: float | None = None
    last_decode_tok_s: float | None = None
    queue_depth: int = 0
    requests: int = 0
    errors: int = 0
    dropped_prompts: int = 0
    rejected_images: int = 0        # images refused (headers on arrival, pixels on decode)
    unsaid_errors: int = 0          # refusals counted but not repeated on `error` (rate limit)
    callback_faults: int = 0        # exceptions a callback raised (callback_guard.py: logged)
    last_image_stamp: float | None = None
    last_finish_reason: str = ''
    detail: str = ''                # e.g. the load error
    camera: str = ''                # why the node is blind (a camera matched, no frames)
    video_buffer_frames: int = 0    # frames the cameras' video rings hold now
    video_buffer_bytes: int = 0     # their pixel bytes
    video_buffer_limit_bytes: int = 0   # the most they can hold at the current frame sizes


class NodeFacts:
    """The node's generation facts, written by the executor and the session thread alike.

    Every write goes through :meth:`update` / :meth:`add` and every read through
    :meth:`snapshot`, all under one lock, so no update is ever lost (``errors`` counted from
    two threads at once included); there are no attributes to assign to by mistake.
    """

    __slots__ = ('_lock', '_state')

    def __init__(self, **values):
        self._lock = threading.Lock()
        self._state = FactsSnapshot(**values)

    def update(self, **values):
        """Set fields (names as in :class:`FactsSnapshot`)."""
        with self._lock:
            self._state = replace(self._state, **values)

    def add(self, **counts):
        """Add to counters, e.g. ``add(errors=1)``."""
        with self._lock:
            self._state = replace(self._state, **{
                name: getattr(self._state, name) + n for name, n in counts.items()})

    def snapshot(self):
        """The current facts, as one consistent frozen :class:`FactsSnapshot`."""
        with self._lock:
            return self._state


def _fmt(value):
    if value is None:
        return 'n/a'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f'{value:.3f}'.rstrip('0').rstrip('.') if value == value else 'nan'
    return str(value)


def _status(level, name, message, hardware_id, values):
    # Valid Unicode, whatever a server named its model or said in an error: a status that
    # cannot be serialized would stop every /diagnostics publication.
    status = DiagnosticStatus()
    status.level = bytes([level])
    status.name = valid_text(name)
    status.message = valid_text(message)
    status.hardware_id = valid_text(hardware_id)
    status.values = [KeyValue(key=k, value=valid_text(_fmt(v))) for k, v in values]
    return status


def level_of(status):
    """The level of a DiagnosticStatus as an int (rclpy stores the ``byte`` as ``bytes``)."""
    level = status.level
    return level[0] if isinstance(level, (bytes, bytearray)) else int(level)


def pool_status(stats, recent, warn_fraction, name='orin_llm: kv_block_pool', hardware_id=''):
    """Build the ``kv_block_pool`` status.

    ``stats``: the engine's PoolStats (attributes named like :data:`POOL_KEYS`); ``recent``:
    counter name -> growth within the last period (see :class:`DiagnosticsMonitor`).
    """
    values = [(k, getattr(stats, k, None)) for k in POOL_KEYS]
    values += [(k, getattr(stats, k)) for k in POOL_EXTRA_KEYS if hasattr(stats, k)]
    total = getattr(stats, 'total_blocks', 0) or 0
    used = getattr(stats, 'used_blocks', 0) or 0
    usage = used / total if total else 0.0
    truncated = recent.get('truncated_generations', 0)
    rejected = recent.get('rejected_prompts', 0)
    if truncated or rejected:
        parts = []
        if truncated:
            parts.append(f'{truncated} generation(s) truncated')
        if rejected:
            parts.append(f'{rejected} prompt(s) rejected')
        return _status(ERROR, name, 'KV pool exhausted: ' + ', '.join(parts), hardware_id,
                       values)
    warnings = []
    if usage >= warn_fraction:
        warnings.append(f'usage {100 * usage:.0f}% >= {100 * warn_fraction:.0f}%')
    if recent.get('exhaustion_events', 0) or recent.get('dropped_turns', 0):
        warnings.append(f"pool full: {recent.get('dropped_turns', 0)} old turn(s) dropped")
    if recent.get('evictions', 0):
        warnings.append(f"{recent['evictions']} cached block(s) evicted")
    if warnings:
        return _status(WARN, name, '; '.join(warnings), hardware_id, values)
    rate = getattr(stats, 'prefix_hit_rate', 0.0) or 0.0
    return _status(OK, name, f'usage {100 * usage:.0f}%, prefix hit rate {100 * rate:.0f}%',
                   hardware_id, values)


def generation_status(facts, recent, name='orin_llm: generation', hardware_id=''):
    """Build the ``generation`` status from a :class:`NodeFacts` (or a snapshot of one)."""
    if isinstance(facts, NodeFacts):
        facts = facts.snapshot()
    values = [(k, getattr(facts, k)) for k in GENERATION_KEYS]
    values.append(('dropped_prompts', facts.dropped_prompts))
    values.append(('rejected_images', facts.rejected_images))
    values.append(('unsaid_errors', facts.unsaid_errors))
    values.append(('callback_faults', facts.callback_faults))
    values.append(('camera', 'blind' if facts.camera else 'ok'))
    values.append(('state', facts.state))
    if facts.state == 'failed':
        return _status(ERROR, name, f'engine failed: {facts.detail}', hardware_id, values)
    if facts.state == 'loading':
        return _status(OK, name, facts.detail or 'loading model', hardware_id, values)
    if facts.state in ('unconfigured', 'inactive', 'finalized'):   # managed: not answering
        level = WARN if facts.detail else OK
        return _status(level, name, f'{facts.state}' + (f': {facts.detail}' if facts.detail
                                                        else ''), hardware_id, values)
    problems = [facts.camera] if facts.camera else []
    if facts.backend_fallback_reason:
        problems.append(f'CUDA kernels unavailable, attention on torch: '
                        f'{facts.backend_fallback_reason}')
    if recent.get('errors', 0):
        problems.append(f"{recent['errors']} request error(s)")
    if recent.get('dropped_prompts', 0):
        problems.append(f"{recent['dropped_prompts']} prompt(s) dropped (queue full)")
    if recent.get('callback_faults', 0):
        problems.append(f"{recent['callback_faults']} callback fault(s) (traceback in the log)")
    if problems:
        return _status(WARN, name, '; '.join(problems), hardware_id, values)
    if facts.last_finish_reason:
        return _status(OK, name, f'last answer: {facts.last_finish_reason}', hardware_id, values)
    return _status(OK, name, 'ready', hardware_id, values)


PLATFORM_KEYS = ('board', 'power_mode', 'clocks_locked', 'gpu_freq_mhz', 'gpu_max_freq_mhz',
                 'emc_freq_mhz', 'hottest_zone', 'hottest_temp_c')
#: Hottest zone at or above this: WARN (Orin throttles its clocks from about 97 C).
HOT_C = 90.0


def platform_status(power, name='orin_llm: platform', hardware_id=''):
    """Build the ``platform`` status from a :class:`~orin_llm_node.jetson_power.PowerState`."""
    values = [(k, getattr(power, k)) for k in PLATFORM_KEYS]
    if power.hottest_temp_c is not None and power.hottest_temp_c >= HOT_C:
        return _status(WARN, name, f'hot: {power.summary()}', hardware_id, values)
    return _status(OK, name, power.summary(), hardware_id, values)


@dataclass
class DiagnosticsMonitor:
    """Decides when to publish: every ``period_s``, and at once when a status level changes.

    Call :meth:`update` as often as convenient (the node calls it after every request and when
    idle); it returns the statuses to publish, or None.
    """

    period_s: float
    warn_fraction: float
    node_name: str = 'orin_llm'
    hardware_id: str = ''
    #: ``() -> PowerState`` (``jetson_power.read_power_state``); the ``platform`` status is
    #: published only where it finds a Jetson.
    power_reader: object = None
    _counts: dict = field(default_factory=dict)
    _grown_at: dict = field(default_factory=dict)     # counter -> [(time, growth), ...]
    _levels: tuple = ()
    _next_periodic: float | None = None

    def _recent(self, now, counters):
        for key, value in counters.items():
            if value is None:
                continue
            before = self._counts.get(key)
            self._counts[key] = value
            if before is not None and value > before:
                self._grown_at.setdefault(key, []).append((now, value - before))
        recent = {}
        for key, events in self._grown_at.items():
            events[:] = [(t, n) for t, n in events if now - t < self.period_s]
            recent[key] = sum(n for _, n in events)
        return recent

    def statuses(self, now, pool_stats, facts, backend_stats=None):
        """The statuses for time ``now`` (seconds, any monotonic clock); updates the windows.

        ``backend_stats``: a remote backend's ``BackendStats`` (its ``backend`` status).
        """
        facts = facts.snapshot() if isinstance(facts, NodeFacts) else facts
        counters = {}
        if pool_stats is not None:
            counters = {k: getattr(pool_stats, k, None) for k in _WINDOWED}
        counters['errors'] = facts.errors
        counters['dropped_prompts'] = facts.dropped_prompts
        counters['callback_faults'] = facts.callback_faults
        if backend_stats is not None:
            counters['backend_errors'] = backend_stats.errors
        recent = self._recent(now, counters)
        out = []
        if pool_stats is not None:
            out.append(pool_status(pool_stats, recent, self.warn_fraction,
                                   f'{self.node_name}: kv_block_pool', self.hardware_id))
        out.append(generation_status(facts, recent, f'{self.node_name}: generation',
                                     self.hardware_id))
        if backend_stats is not None:
            level, message = backend_level(backend_stats, recent.get('backend_errors', 0))
            out.append(_status(level, f'{self.node_name}: backend', message, self.hardware_id,
                               backend_values(backend_stats)))
        power = self.power_reader() if self.power_reader is not None else None
        if power is not None and power.is_jetson:
            out.append(platform_status(power, f'{self.node_name}: platform', self.hardware_id))
        return out

    def update(self, now, pool_stats, facts, force=False, backend_stats=None):
        """Return the statuses to publish now (periodic, level change or ``force``), else None."""
        statuses = self.statuses(now, pool_stats, facts, backend_stats)
        levels = tuple((s.name, level_of(s)) for s in statuses)
        due = self._next_periodic is None or now >= self._next_periodic
        if not (due or force or levels != self._levels):
            return None
        self._levels = levels
        if due:
            # Stay on the grid (no drift) unless we fell far behind.
            base = self._next_periodic if self._next_periodic is not None else now
            self._next_periodic = base + self.period_s
            if self._next_periodic <= now:
                self._next_periodic = now + self.period_s
        return statuses

    def seconds_until_due(self, now):
        """How long the caller may sleep before the next periodic publication."""
        if self._next_periodic is None:
            return 0.0
        return max(0.0, self._next_periodic - now)
