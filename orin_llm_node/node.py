# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 node ``orin_llm``: camera images + text prompts in, streamed answers out.

Threading: subscription and service callbacks run on the executor and only validate headers,
remember the newest image and enqueue prompts; **one worker thread owns the engine** (torch and
all CUDA work, including model loading, warm-up and graph capture).  The only engine call made
from another thread is ``LLMEngine.cancel()``, which is thread-safe by contract.  /diagnostics is
published by the worker (it reads the engine's stats), except while the model is still loading.
"""

from collections import deque
from dataclasses import dataclass
import hashlib
import json
import logging
import math
import os
from pathlib import Path
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import ParameterDescriptor, ParameterType, SetParametersResult
import rclpy
from rclpy.exceptions import InvalidParameterTypeException, ParameterException
from rclpy.executors import ExternalShutdownException
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from orin_llm_node import dds_profile, ros_image
from orin_llm_node.diagnostics import DiagnosticsMonitor, GenerationInfo

try:                                    # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:                     # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

NODE_NAME = 'orin_llm'
MAX_PROMPT_CHARS = 100_000
# A camera publisher matched and no frame for this long: the node says it is blind.
BLIND_AFTER_S = 5.0
# Header stamps further ahead of our clock than this are refused (clock skew, bad drivers).
FUTURE_TOLERANCE_S = 1.0
PROMPT_DEPTH = 1000
DEMO_MODEL_DIR = Path(__file__).resolve().parent / 'demo_model'


class ParameterError(ValueError):
    """A parameter value the node cannot run with; ``str(err)`` is one line naming it."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v):
    return isinstance(v, float) and math.isfinite(v)


def _model_path_ok(v):
    if v == '' or (Path(v).expanduser() / 'config.json').is_file():
        return None
    return 'must be empty (demo checkpoint) or a checkpoint directory containing config.json'


def _choice(*options, pattern=None):
    def check(v):
        if v in options or (pattern is not None and re.fullmatch(pattern, v)):
            return None
        return f"must be one of {', '.join(options)}" + (' or cuda:N' if pattern else '')
    return check


def _int_at_least(low, high=None):
    def check(v):
        if v < low or (high is not None and v > high):
            return f'must be an integer >= {low}' + (f' and <= {high}' if high else '')
        return None
    return check


def _float_in(low, high=math.inf, low_open=False, allow_inf=False):
    def check(v):
        if math.isnan(v) or (math.isinf(v) and not allow_inf):
            return 'must be a finite number'
        if (v <= low if low_open else v < low) or v > high:
            lo = '(' if low_open else '['
            hi = 'inf)' if high == math.inf else f'{high}]'
            return f'must be in {lo}{low}, {hi}'
        return None
    return check


@dataclass(frozen=True)
class Param:
    """One node parameter: default (which fixes its type), meaning, check, run-time settable."""

    name: str
    default: object
    description: str
    check: object = None
    runtime: bool = False
    constraints: str = ''


# The single list of parameters (config/orin_llm.yaml and the launch file must agree with it;
# test/test_params_agree.py checks that).
PARAMETERS = (
    Param('model_path', '', 'Qwen3-VL checkpoint directory (Hugging Face format); '
          'empty = the embedded demo checkpoint', _model_path_ok),
    Param('device', 'auto', 'torch device', _choice('auto', 'cpu', 'cuda', pattern=r'cuda:\d+'),
          constraints='auto | cpu | cuda | cuda:N'),
    Param('dtype', 'auto', 'weights and KV dtype',
          _choice('auto', 'float32', 'bfloat16', 'float16'),
          constraints='auto | float32 | bfloat16 | float16'),
    Param('max_new_tokens', 256, 'most tokens generated per answer', _int_at_least(1),
          runtime=True, constraints='>= 1'),
    Param('temperature', 0.0, 'sampling temperature (0 = greedy)', _float_in(0.0),
          runtime=True, constraints='>= 0.0'),
    Param('top_p', 1.0, 'nucleus sampling threshold (1 = off)', _float_in(0.0, 1.0, True),
          runtime=True, constraints='(0, 1]'),
    Param('top_k', 0, 'keep the k most likely tokens (0 = off)', _int_at_least(0),
          runtime=True, constraints='>= 0'),
    Param('seed', -1, 'sampling seed (-1 = random)', _int_at_least(-1), runtime=True,
          constraints='>= -1'),
    Param('system_prompt', 'You are the vision-language assistant of a robot. Answer briefly.',
          'system prompt of every conversation (a change starts a new conversation)',
          lambda v: None if len(v) <= MAX_PROMPT_CHARS else 'is too long', runtime=True),
    Param('kv_block_size', 16, 'tokens per KV block', _int_at_least(1, 1024),
          constraints='1..1024'),
    Param('kv_cache_memory_mb', 0.0, 'KV pool size in MB (0 = automatic)', _float_in(0.0),
          constraints='>= 0.0'),
    Param('max_model_len', 8192, 'longest conversation in tokens', _int_at_least(16),
          constraints='>= 16'),
    Param('enable_cuda_graph', True, 'capture decode steps as CUDA Graphs (CUDA only)'),
    Param('enable_prefix_cache', True, 'reuse KV blocks of shared prefixes'),
    Param('image_max_pixels', 307200, 'resize images to at most this many pixels; never '
          "above the checkpoint's own maximum (0 = checkpoint default)", _int_at_least(0),
          constraints='>= 0'),
    Param('image_min_pixels', 0, 'resize images to at least this many pixels '
          '(0 = checkpoint default)', _int_at_least(0), constraints='>= 0'),
    Param('image_qos', 'auto', 'image subscriptions: auto = a best-effort one (matches every '
          'publisher) and a reliable one (reliable publishers get every frame through); '
          'best_effort or reliable = that one only', _choice('auto', 'best_effort', 'reliable'),
          constraints='auto | best_effort | reliable'),
    Param('image_max_age_s', 2.0, 'a prompt uses the newest image only if it is at most this old',
          _float_in(0.0, low_open=True, allow_inf=True), constraints='> 0.0'),
    Param('queue_size', 4, 'prompts waiting to be answered (overflow drops the oldest)',
          _int_at_least(1, 1000), constraints='1..1000'),
    Param('diagnostics_period_s', 1.0, 'period of /diagnostics',
          _float_in(0.0, 3600.0, low_open=True), constraints='(0, 3600]'),
    Param('pool_warn_fraction', 0.9, 'kv_block_pool is WARN from this fraction of blocks in use',
          _float_in(0.0, 1.0, low_open=True), constraints='(0, 1]'),
    Param('conversation_mode', 'chat', 'chat: multi-turn history; single: every prompt alone',
          _choice('chat', 'single'), constraints='chat | single'),
    Param('max_generation_s', 0.0, 'deadline per answer in seconds (0 = none)', _float_in(0.0),
          constraints='>= 0.0'),
)
PARAMS_BY_NAME = {p.name: p for p in PARAMETERS}
RUNTIME_PARAMETERS = tuple(p.name for p in PARAMETERS if p.runtime)

_TYPES = {bool: (ParameterType.PARAMETER_BOOL, 'a boolean'),
          int: (ParameterType.PARAMETER_INTEGER, 'an integer'),
          float: (ParameterType.PARAMETER_DOUBLE, 'a double (e.g. 1.0)'),
          str: (ParameterType.PARAMETER_STRING, 'a string')}


def check_parameter(name, value):
    """Return the one-line reason why ``value`` is invalid for parameter ``name``, or None."""
    spec = PARAMS_BY_NAME[name]
    kind = type(spec.default)
    if type(value) is not kind:
        return f"parameter '{name}' must be {_TYPES[kind][1]}, got {value!r}"
    reason = spec.check(value) if spec.check else None
    return None if reason is None else f"parameter '{name}' = {value!r}: {reason}"


def check_parameters(values):
    """Check a name -> value mapping, cross-parameter rules included; raise ParameterError."""
    for name in PARAMS_BY_NAME:
        reason = check_parameter(name, values[name])
        if reason:
            raise ParameterError(reason)
    lo, hi = values['image_min_pixels'], values['image_max_pixels']
    if lo and hi and lo > hi:
        raise ParameterError(
            f"parameter 'image_min_pixels' = {lo} must not exceed image_max_pixels = {hi}")


def _cache_dir():
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'orin_llm_node'


def random_checkpoint_path():
    """Directory of the tiny random fallback checkpoint (keyed by the generator's source)."""
    from orin_llm_node.testing import tiny_checkpoint
    digest = hashlib.sha256(Path(tiny_checkpoint.__file__).read_bytes()).hexdigest()[:12]
    return _cache_dir() / f'tiny-random-{digest}'


def resolve_model_path(model_path, log):
    """Turn the ``model_path`` parameter into a directory; returns (path, is_random)."""
    if model_path:
        return Path(model_path).expanduser(), False
    if (DEMO_MODEL_DIR / 'config.json').is_file():
        return DEMO_MODEL_DIR, False
    target = random_checkpoint_path()
    if not (target / 'config.json').is_file():
        from orin_llm_node.testing import make_tiny_checkpoint
        log(f'generating a tiny RANDOM checkpoint in {target} (first use only)')
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix='.tmp-', dir=target.parent))
        try:
            make_tiny_checkpoint(tmp, seed=0)
            os.replace(tmp, target)     # atomic: a half-written checkpoint is never used
        except OSError:
            if not (target / 'config.json').is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target, True


@dataclass
class PendingImage:
    """The newest image as received (decoded on the worker only if a prompt takes it)."""

    msg: object
    compressed: bool
    stamp_ns: int               # header stamp, else receive time (ROS clock)
    stamped: bool

    def describe(self):
        """The image as named in ``response/info``: its header stamp and frame_id."""
        return {'stamp': {'sec': self.msg.header.stamp.sec,
                          'nanosec': self.msg.header.stamp.nanosec},
                'frame_id': self.msg.header.frame_id, 'stamped': self.stamped}


@dataclass
class Request:
    """One queued prompt and the image paired with it when it arrived."""

    request_id: int
    text: str
    image: PendingImage | None
    received_ns: int
    no_image: str = ''          # why no image is paired (said in response/info)


class _RosLogHandler(logging.Handler):
    """Forwards the engine's Python ``logging`` records (warnings and up) to the ROS logger."""

    def __init__(self, ros_logger):
        super().__init__(logging.WARNING)
        self.ros_logger = ros_logger

    def emit(self, record):
        try:
            text = f'{record.name}: {record.getMessage()}'
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            else:
                self.ros_logger.warning(text)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _qos(depth, reliable=True, latched=False):
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=depth,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)


def _preview(text, n=60):
    text = ' '.join(text.split())
    return text if len(text) <= n else text[:n - 3] + '...'


class OrinLLMNode(LifecycleNode):
    """Qwen3-VL node: see the README for its topics, services and parameters.

    A managed (lifecycle) node: ``configure`` loads the weights, warms up and captures graphs
    (on the worker thread), ``activate`` opens the image subscriptions and the services,
    ``deactivate`` cancels the answer in flight and drops the queue, ``cleanup`` frees the
    engine.  The prompt subscription lives from ``configure`` to ``cleanup`` so that a prompt
    sent while inactive is refused with a reason.  Unless ``managed``, :meth:`autostart` runs
    configure and activate at once (the plain node).
    """

    def __init__(self, managed=False, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.managed = managed
        self.params = self._declare_parameters()
        self.exit_code = 0
        self.info = GenerationInfo(state='unconfigured')
        self._engine = None
        self._conv = None
        self._conv_system_prompt = None
        self._queue = deque()
        self._cond = threading.Condition()
        self._diag_lock = threading.Lock()
        self._stop = threading.Event()
        self._reset_requested = False
        self._busy = False
        self._cancel_pending = False
        self._newest_image = None
        self._image_errors = {}         # reason -> last time published (rate limit)
        self._load_started = time.monotonic()
        self._last_load_log = self._load_started
        self.monitor = DiagnosticsMonitor(
            period_s=self.params['diagnostics_period_s'],
            warn_fraction=self.params['pool_warn_fraction'], node_name=self.get_name())

        self.pub_response = self.create_publisher(String, 'response', _qos(10))
        self.pub_stream = self.create_publisher(String, 'response/stream', _qos(100))
        self.pub_error = self.create_publisher(String, 'error', _qos(10))
        self.pub_ready = self.create_publisher(Bool, 'ready', _qos(1, latched=True))
        self.pub_diag = self.create_publisher(DiagnosticArray, '/diagnostics', _qos(10))
        self.pub_info = self.create_publisher(String, 'response/info', _qos(10))
        self._image_subs = []           # from activate to deactivate
        self._open_services = []        # from activate to deactivate
        self._prompt_sub = None         # from configure to cleanup
        self._command = None            # 'load' / 'unload' for the worker, and its outcome
        self._command_done = threading.Event()
        self._command_ok = False
        self._load_error = ''
        self.finished = threading.Event()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.create_timer(self.params['diagnostics_period_s'], self._on_idle_timer)
        self._next_request_id = 1
        self._last_frame_at = None      # monotonic time of the last image that arrived
        self._publishers_since = None   # since when a camera publisher has been matched
        self.dds_profile = None         # the Fast DDS profile main() applied, if any
        self.create_timer(1.0, self._check_camera)
        self.pub_ready.publish(Bool(data=False))
        self._worker = threading.Thread(target=self._run_worker, name='orin_llm_worker',
                                        daemon=True)
        self._log_handler = _RosLogHandler(self.get_logger())
        self._py_logger = logging.getLogger('orin_llm_node')

    def _subscribe_images(self):
        """The image subscriptions, per ``image_qos``.

        Measured (bench/image_delivery.py): a best-effort subscription matches every publisher
        but under Fast DDS gets large frames only if they come over UDP (the node's own DDS
        profile, see dds_profile.py); a reliable one matches only reliable publishers and gets
        every frame from them whatever the transport. ``auto`` has both: the newest frame from
        either wins, and the reliable twin stays quiet about best-effort publishers it cannot
        match.
        """
        mode = self.params['image_qos']
        kinds = (('image', Image, self._on_image),
                 ('image/compressed', CompressedImage, self._on_compressed))
        subs = []
        for reliable in {'auto': (False, True), 'best_effort': (False,),
                         'reliable': (True,)}[mode]:
            extra = {}
            if mode == 'auto' and reliable:
                extra['event_callbacks'] = SubscriptionEventCallbacks(
                    incompatible_qos=lambda _event: None)
            for topic, msg_type, callback in kinds:
                subs.append(self.create_subscription(
                    msg_type, topic, callback, _qos(1, reliable=reliable), **extra))
        return subs

    def image_topics(self):
        """The resolved (namespaced, remapped) image topic names."""
        return sorted({sub.topic_name for sub in self._image_subs})

    # ---- parameters ----------------------------------------------------------------------

    def _declare_parameters(self):
        values = {}
        for spec in PARAMETERS:
            kind = type(spec.default)
            descriptor = ParameterDescriptor(
                name=spec.name, type=_TYPES[kind][0], description=spec.description,
                additional_constraints=spec.constraints, read_only=not spec.runtime)
            try:
                value = self.declare_parameter(spec.name, spec.default, descriptor).value
            except InvalidParameterTypeException:
                given = getattr(self, '_parameter_overrides', {}).get(spec.name)
                given = f', got {given.value!r}' if given is not None else ''
                raise ParameterError(
                    f"parameter '{spec.name}' must be {_TYPES[kind][1]}{given}") from None
            except (ParameterException, TypeError, ValueError) as exc:
                raise ParameterError(f"parameter '{spec.name}': {exc}") from None
            values[spec.name] = value
        check_parameters(values)
        declared = set(self._parameters)
        for name in sorted(getattr(self, '_parameter_overrides', {})):
            if name not in declared:
                self.get_logger().warning(f"unknown parameter '{name}' ignored (typo?)")
        return values

    def _on_set_parameters(self, params):
        for param in params:
            if param.name not in PARAMS_BY_NAME:
                continue
            if param.name not in RUNTIME_PARAMETERS:
                return SetParametersResult(
                    successful=False, reason=f"parameter '{param.name}' is read-only at run "
                    'time: restart the node (or relaunch) to change it')
            reason = check_parameter(param.name, param.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        for param in params:
            if param.name in RUNTIME_PARAMETERS:
                self.get_logger().info(
                    f'{param.name} set to {param.value!r} (takes effect at the next prompt)')
        return SetParametersResult(successful=True)

    def _runtime(self, name):
        return self.get_parameter(name).value

    # ---- callbacks (executor thread: cheap, never touch the engine) -----------------------

    def _publish_error(self, text):
        self.get_logger().warning(text)
        self._safe_publish(self.pub_error, String(data=text))

    def _reject_image(self, topic, reason):
        self.info.add(errors=1)
        # A broken camera sends the same problem 30 times a second: say it once a second.
        now = time.monotonic()
        if now - self._image_errors.get(reason, -math.inf) >= 1.0:
            self._image_errors[reason] = now
            self._publish_error(f'image on {topic} rejected: {reason}')

    def _stamp_ns(self, header):
        stamp = header.stamp.sec * 1_000_000_000 + header.stamp.nanosec
        if stamp > 0:
            return stamp, True
        return self.get_clock().now().nanoseconds, False

    def _on_image(self, msg):
        self._accept_image(msg, compressed=False)

    def _on_compressed(self, msg):
        self._accept_image(msg, compressed=True)

    def _accept_image(self, msg, compressed: bool):
        """Keep `msg` as the newest image if its header and encoding can be decoded later."""
        self._frame_arrived()
        check = ros_image.check_compressed if compressed else ros_image.check_image
        stamp, stamped = self._stamp_ns(msg.header)
        try:
            check(msg)      # headers only: every check the engine's processor would make
            ahead = (stamp - self.get_clock().now().nanoseconds) / 1e9
            if ahead > FUTURE_TOLERANCE_S:
                raise ros_image.ImageConversionError(
                    f'stamp is {ahead:.1f} s in the future (clocks out of sync?)')
        except ros_image.ImageConversionError as exc:
            # Refused once, here: the prompts after it are answered text-only.
            with self._cond:
                self._newest_image = None
            self._reject_image('image/compressed' if compressed else 'image', str(exc))
            return
        with self._cond:
            self._newest_image = PendingImage(msg, compressed, stamp, stamped)

    def _frame_arrived(self):
        self._last_frame_at = time.monotonic()
        if self.info.snapshot().camera:
            self.info.update(camera='')
            self.get_logger().info('camera frames are arriving again')

    def _check_camera(self):
        """Say once (on ``error`` and in /diagnostics) when a camera is matched but blind."""
        topics = self.image_topics()
        publishers = sum(self.count_publishers(topic) for topic in topics)
        now = time.monotonic()
        if publishers == 0:
            self._publishers_since = None
            return
        if self._publishers_since is None:
            self._publishers_since = now
        since = max(self._publishers_since, self._last_frame_at or -math.inf)
        if self.info.snapshot().camera or now - since < BLIND_AFTER_S:
            return
        if self.dds_profile:
            fix = ('this node already takes its frames over UDP (its own Fast DDS profile): '
                   'check that the camera really publishes (ros2 topic hz), that '
                   'net.core.rmem_max is at least 4194304 (sysctl), or give the camera '
                   'config/fastdds_large_images.xml')
        else:
            fix = ('start the node without FASTDDS_DEFAULT_PROFILES_FILE/'
                   'FASTRTPS_DEFAULT_PROFILES_FILE so that it applies its own profile, give '
                   'the camera config/fastdds_large_images.xml, or publish reliable or on '
                   '<topic>/compressed')
        text = (f'blind: {publishers} publisher(s) on {" and ".join(topics)} but no frame '
                f'arrived for {now - since:.0f} s; large best-effort frames are lost by '
                f'Fast DDS shared memory (> 512 KB). Fix: {fix}')
        self.info.update(camera=text)
        self._publish_error(text)

    def _refuse(self, request_id, text, reason):
        """Tell the sender (on ``error`` and ``response/info``) why its prompt is not answered."""
        self._publish_error(f'request {request_id}: {reason}')
        self._publish_info({'request_id': request_id, 'prompt': text, 'text': None,
                            'image': None, 'finish_reason': 'refused', 'error': reason})

    def _publish_info(self, info):
        self._safe_publish(self.pub_info, String(data=json.dumps(info, ensure_ascii=False)))

    def _on_prompt(self, msg):
        text = msg.data
        request_id = self._next_request_id
        self._next_request_id += 1
        if not text.strip():
            self._refuse(request_id, text, 'empty prompt ignored')
            return
        if len(text) > MAX_PROMPT_CHARS:
            self._refuse(request_id, text[:200], f'prompt of {len(text)} characters rejected '
                         f'(limit {MAX_PROMPT_CHARS})')
            return
        state = self.info.snapshot().state
        if state != 'ready':
            self._refuse(request_id, text, f'node is {state}: activate it to take prompts')
            return
        now = self.get_clock().now().nanoseconds
        image = self._newest_image
        max_age = self.params['image_max_age_s']
        no_image = ''
        if image is None:
            no_image = 'no image received yet'
        elif (now - image.stamp_ns) / 1e9 > max_age:
            age = (now - image.stamp_ns) / 1e9
            no_image = f'newest image is {age:.1f} s old (> image_max_age_s {max_age:g} s)'
            image = None
        if no_image:
            self.get_logger().info(f'{no_image}: the prompt is answered text-only')
        dropped = None
        with self._cond:
            if len(self._queue) >= self.params['queue_size']:
                dropped = self._queue.popleft()
                self.info.add(dropped_prompts=1)
            self._queue.append(Request(request_id, text, image, now, no_image))
            self.info.update(queue_depth=len(self._queue))
            self._cond.notify_all()
        if dropped is not None:
            self._refuse(dropped.request_id, dropped.text,
                         f"queue full (queue_size {self.params['queue_size']}): dropped the "
                         f"oldest prompt '{_preview(dropped.text)}'")

    def _cancel_generation(self):
        with self._cond:
            if self._busy and self._engine is not None:
                # The engine clears its flag when a turn starts, so the worker repeats the
                # cancel after it has begun (self._cancel_pending) in case we came too early.
                self._cancel_pending = True
                self._engine.cancel()       # the one thread-safe engine call
                return True
        return False

    def _on_reset(self, request, response):
        del request
        with self._cond:
            self._reset_requested = True
            self._cond.notify_all()
        cancelled = self._cancel_generation()
        response.success = True
        response.message = 'conversation reset' + (
            ' (generation in progress cancelled)' if cancelled else '')
        return response

    def _on_cancel(self, request, response):
        del request
        response.success = self._cancel_generation()
        response.message = ('generation cancelled' if response.success
                            else 'no generation in progress')
        return response

    def _on_idle_timer(self):
        # Without an engine the worker cannot publish diagnostics: say what state we are in.
        if self._engine is not None:
            return
        now = time.monotonic()
        if self.info.snapshot().state == 'loading':
            elapsed = now - self._load_started
            self.info.update(detail=f'loading model ({elapsed:.0f} s)')
            if now - self._last_load_log >= 10.0:
                self._last_load_log = now
                self.get_logger().info(f'still loading the model ({elapsed:.0f} s)...')
        with self._diag_lock:
            statuses = self.monitor.update(now, None, self.info)
        if statuses:
            self._publish_diagnostics(statuses)

    # ---- worker thread (owns the engine) --------------------------------------------------

    def start(self):
        """Start the worker thread; the plain node also configures and activates itself."""
        self._py_logger.addHandler(self._log_handler)
        self._worker.start()
        if not self.managed:
            threading.Thread(target=self.autostart, name='orin_llm_autostart',
                             daemon=True).start()

    def stop(self, timeout_s=10.0):
        """Stop the worker (cancelling a generation in progress); True if it has stopped."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._cancel_generation()
        if self._worker.is_alive():
            self._worker.join(timeout_s)
        self._py_logger.removeHandler(self._log_handler)
        return not self._worker.is_alive()

    def _safe_publish(self, pub, msg):
        try:
            pub.publish(msg)
        except Exception as exc:  # noqa: BLE001 - shutting down: the context may be gone
            if not self._stop.is_set() and rclpy.ok(context=self.context):
                self.get_logger().error(f'publishing on {pub.topic_name} failed: {exc}')

    def _publish_diagnostics(self, statuses):
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = statuses
        self._safe_publish(self.pub_diag, msg)

    def _diagnostics(self, force=False, only_if_due=False):
        now = time.monotonic()
        if only_if_due and self.monitor.seconds_until_due(now) > 0:
            return
        with self._cond:
            self.info.update(queue_depth=len(self._queue))
        # Only the worker touches the engine; elsewhere the pool status waits for its turn.
        engine = self._engine if threading.current_thread() is self._worker else None
        stats = engine.stats() if engine is not None else None
        with self._diag_lock:
            statuses = self.monitor.update(now, stats, self.info, force=force)
        if statuses:
            self._publish_diagnostics(statuses)

    def _fail(self, text):
        self.get_logger().fatal(text)
        self.info.update(state='failed', detail=text)
        self.exit_code = 1
        self._diagnostics(force=True)
        self._safe_publish(self.pub_ready, Bool(data=False))
        # Make spin() return so that main() exits with the error code.
        rclpy.try_shutdown(context=self.context)

    def _run_worker(self):
        while not self._stop.is_set():
            request = command = None
            with self._cond:
                if not (self._queue or self._reset_requested or self._command
                        or self._stop.is_set()):
                    wait = (self.monitor.seconds_until_due(time.monotonic())
                            if self._engine is not None else 0.5)
                    self._cond.wait(timeout=max(wait, 0.01))
                command, self._command = self._command, None
                reset, self._reset_requested = self._reset_requested, False
                if (self._queue and self._engine is not None and not reset and not command
                        and not self._stop.is_set()):
                    request = self._queue.popleft()
                    self.info.update(queue_depth=len(self._queue))
                    self._busy = True
                    self._cancel_pending = False
            if self._stop.is_set():
                break
            if command is not None:
                self._command_ok = self._run_command(command)
                self._command_done.set()
                continue
            try:
                if reset and self._engine is not None:
                    self._drop_conversation('reset service')
                if request is not None:
                    self._answer(request)
            except ValueError as exc:   # the engine's verdict on the input (nothing changed)
                self.info.add(errors=1)
                self._report_failure(request, f"prompt rejected: {' '.join(str(exc).split())}")
            except Exception as exc:  # noqa: BLE001 - bad input must never kill the node
                self.info.add(errors=1)
                reason = ' '.join(str(exc).split()) or type(exc).__name__
                self._report_failure(request, f'request failed: {reason}')
                self.get_logger().debug(traceback.format_exc())
            finally:
                with self._cond:
                    self._busy = False
            if self._engine is not None:
                self._diagnostics()

    def _run_command(self, command):
        """Load or free the engine (worker thread: it owns torch and CUDA)."""
        if command == 'unload':
            self._drop_conversation()
            self._engine = None
            _release_memory()
            return True
        try:
            self._engine = self._load_engine()
            return True
        except Exception as exc:  # noqa: BLE001 - any load failure is one fatal line
            self._load_error = ' '.join(str(exc).split()) or type(exc).__name__
            return False

    def _worker_call(self, command):
        """Have the worker run ``command`` and wait for it; False if it failed or we stop."""
        self._command_done.clear()
        with self._cond:
            self._command = command
            self._cond.notify_all()
        while not self._command_done.wait(0.1):
            if self._stop.is_set():
                return False
        return self._command_ok and not self._stop.is_set()

    # ---- lifecycle transitions (executor thread, or autostart's thread) -------------------

    def autostart(self):
        """The plain node: configure, then activate (run on a thread of its own)."""
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def on_configure(self, state):
        """Load the weights, warm up and capture graphs; open the prompt subscription."""
        self._load_started = self._last_load_log = time.monotonic()
        self.info.update(state='loading', detail='loading model')
        self._diagnostics(force=True)
        if not self._worker_call('load'):
            if self._stop.is_set():
                return TransitionCallbackReturn.FAILURE
            text = f'failed to load the model: {self._load_error}'
            if not self.managed:
                self._fail(text)            # the plain node exits with code 1
                return TransitionCallbackReturn.FAILURE
            self.get_logger().error(text)
            self.info.update(state='unconfigured', detail=text)
            self._publish_error(text)
            self._diagnostics(force=True)
            return TransitionCallbackReturn.FAILURE
        # Deep enough that DDS never drops a prompt while the executor is busy: every prompt
        # reaches _on_prompt, where an overflow of the queue is reported.
        self._prompt_sub = self.create_subscription(String, 'prompt', self._on_prompt,
                                                    _qos(PROMPT_DEPTH))
        self.info.update(state='inactive', detail='')
        self._diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state):
        """Open the image subscriptions and the services; ``ready`` turns true."""
        self._image_subs = self._subscribe_images()
        self._open_services = [self.create_service(Trigger, 'reset', self._on_reset),
                          self.create_service(Trigger, 'cancel', self._on_cancel)]
        self.info.update(state='ready', detail='')
        self._safe_publish(self.pub_ready, Bool(data=True))
        self.get_logger().info('ready: publish a prompt on '
                               f"{self.resolve_topic_name('prompt')}")
        self._diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state):
        """Stop taking prompts: cancel the answer in flight, refuse the queued ones."""
        self.info.update(state='inactive')
        self._safe_publish(self.pub_ready, Bool(data=False))
        for sub in self._image_subs:
            self.destroy_subscription(sub)
        for srv in self._open_services:
            self.destroy_service(srv)
        self._image_subs, self._open_services = [], []
        with self._cond:
            queued, self._queue = list(self._queue), deque()
            self._newest_image = None
        self._cancel_generation()
        for request in queued:
            self._refuse(request.request_id, request.text, 'node deactivated')
        self._publish_error('deactivated: prompts are refused until the node is activated')
        self._diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state):
        """Free the engine (weights, KV pool, graphs)."""
        if self._prompt_sub is not None:
            self.destroy_subscription(self._prompt_sub)
            self._prompt_sub = None
        self._worker_call('unload')
        self.info.update(state='unconfigured', detail='')
        self._diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state):
        """From any state: stop answering (main() stops the worker and frees everything)."""
        self.info.update(state='finalized')
        self._safe_publish(self.pub_ready, Bool(data=False))
        self._cancel_generation()
        self.finished.set()             # main() ends the process (exit code 0)
        return TransitionCallbackReturn.SUCCESS

    def _report_failure(self, request, text):
        if request is None:
            self._publish_error(text)
            return
        self._publish_error(f'{text} (request {request.request_id})')
        self._publish_info({'request_id': request.request_id, 'prompt': request.text,
                            'text': None, 'image': None, 'finish_reason': 'error',
                            'error': text})

    def _engine_config(self, model_path):
        from orin_llm_node.engine import EngineConfig
        p = self.params
        return EngineConfig(
            model_path=str(model_path), device=p['device'], dtype=p['dtype'],
            block_size=p['kv_block_size'],
            kv_cache_memory_mb=p['kv_cache_memory_mb'] or None,
            max_model_len=p['max_model_len'], enable_prefix_cache=p['enable_prefix_cache'],
            enable_cuda_graph=p['enable_cuda_graph'],
            image_max_pixels=p['image_max_pixels'] or None,
            image_min_pixels=p['image_min_pixels'] or None)

    def _load_engine(self):
        log = self.get_logger()
        path, random = resolve_model_path(self.params['model_path'], log.info)
        if random:
            log.warning('=' * 72)
            log.warning('model_path is empty and no demo checkpoint is installed: using a tiny '
                        'RANDOM checkpoint; its answers are gibberish. Set model_path to a '
                        'Qwen3-VL checkpoint directory.')
            log.warning('=' * 72)
        log.info(f'loading {path} (device={self.params["device"]}, '
                 f'dtype={self.params["dtype"]})...')
        from orin_llm_node.engine import LLMEngine
        config = self._engine_config(path)
        t0 = time.monotonic()
        engine = LLMEngine(config)
        stats = engine.stats()
        # cuda_graph: reported only when the engine says graphs are really in use.
        self.info.update(device=str(engine.device), dtype=engine.weight_format,
                         cuda_graph=bool(engine.uses_cuda_graph))
        self.monitor.hardware_id = str(engine.device)
        mb = stats.total_blocks * stats.bytes_per_block / 2 ** 20
        log.info(f'loaded in {time.monotonic() - t0:.1f} s on {engine.device} '
                 f'({engine.weight_format}); KV pool: {stats.total_blocks} blocks x '
                 f'{stats.block_size} tokens ({mb:.1f} MB)')
        t0 = time.monotonic()
        self._warm_up(engine)
        log.info(f'warm-up done in {time.monotonic() - t0:.1f} s')
        return engine

    @staticmethod
    def _warm_up(engine):
        # One short image + text turn runs every code path once (vision tower, prefill, decode,
        # graph capture where enabled) before `ready` goes out. No system prompt and a throw-away
        # image, so it leaves nothing in the prefix cache that a real prompt could hit.
        import numpy as np

        from orin_llm_node.engine import SamplingParams
        conv = engine.new_conversation(system_prompt=None)
        grey = np.full((64, 64, 3), 127, np.uint8)
        engine.chat(conv, 'Hi', images=[grey], sampling=SamplingParams(max_tokens=2))
        engine.reset(conv)

    def _drop_conversation(self, why=None):
        if self._conv is not None and self._engine is not None:
            self._engine.reset(self._conv)
            if why:
                self.get_logger().info(f'conversation reset ({why})')
        self._conv = None

    def _conversation(self):
        system_prompt = self._runtime('system_prompt') or None
        if self._conv is not None and system_prompt != self._conv_system_prompt:
            self._drop_conversation('system_prompt changed')
        if self._conv is None:
            self._conv = self._engine.new_conversation(system_prompt=system_prompt)
            self._conv_system_prompt = system_prompt
        return self._conv

    def _sampling(self):
        from orin_llm_node.engine import SamplingParams
        seed = self._runtime('seed')
        deadline = self.params['max_generation_s']
        return SamplingParams(
            max_tokens=self._runtime('max_new_tokens'),
            temperature=self._runtime('temperature'), top_p=self._runtime('top_p'),
            top_k=self._runtime('top_k'), seed=None if seed < 0 else seed,
            timeout_s=deadline if deadline > 0 else None)

    def _decode_image(self, pending):
        try:
            if pending.compressed:
                return ros_image.compressed_to_rgb(pending.msg)
            return ros_image.image_to_rgb(pending.msg)
        except ros_image.ImageConversionError as exc:
            with self._cond:
                if self._newest_image is pending:     # do not pair it with the next prompt
                    self._newest_image = None
            self.info.add(errors=1)
            self._publish_error(f'image rejected: {exc}; the prompt is answered text-only')
            return str(exc)

    def _answer(self, request):
        self.info.add(requests=1)
        rgb = self._decode_image(request.image) if request.image is not None else None
        if isinstance(rgb, str):
            request.no_image, rgb = f'image rejected: {rgb}', None
        images = [rgb] if rgb is not None else []
        if rgb is not None:
            self.info.update(last_image_stamp=request.image.stamp_ns / 1e9)
        sampling = self._sampling()
        conv = self._conversation()
        t0 = time.monotonic()
        result = None
        try:
            for event in self._engine.chat_stream(conv, request.text, images=images,
                                                  sampling=sampling):
                if event.delta:
                    self._safe_publish(self.pub_stream, String(data=event.delta))
                if event.result is not None:
                    result = event.result
                if self._cancel_pending:
                    self._engine.cancel()
                self._diagnostics(only_if_due=True)
        finally:
            if self.params['conversation_mode'] == 'single':
                self._drop_conversation()   # every prompt alone; its blocks stay as cache
        elapsed = time.monotonic() - t0
        if self._stop.is_set() or not self.context.ok():
            return                      # shutting down (Ctrl-C): nobody to tell
        finish = result.finish_reason
        self.info.update(last_finish_reason=finish)
        self._record_latency(result)
        what = f"'{_preview(request.text)}'" + (
            f' + {rgb.shape[1]}x{rgb.shape[0]} image' if rgb is not None else '')
        self._publish_info({
            'request_id': request.request_id, 'prompt': request.text,
            'text': None if result.error else result.text,
            'image': request.image.describe() if rgb is not None else None,
            'no_image': request.no_image or None,
            'finish_reason': finish, 'error': result.error,
            'generated_tokens': len(result.token_ids), 'cached_tokens': result.cached_tokens,
            'prompt_tokens': len(result.prompt_token_ids),
            'ttft_ms': round(1000.0 * result.ttft_s, 3),
            'decode_tok_s': round(result.decode_tok_s, 3),
            'weight_format': self._engine.weight_format})
        if result.error:
            self.info.add(errors=1)
            self._publish_error(f'prompt {what} rejected ({finish}, request '
                                f'{request.request_id}): {result.error}')
            return
        self._safe_publish(self.pub_response, String(data=result.text))
        summary = (
            f'{what} -> {len(result.token_ids)} tokens in {elapsed:.2f} s (finish={finish}, '
            f'ttft {1000 * result.ttft_s:.0f} ms, {result.cached_tokens} cached prompt tokens'
            + (f', {result.dropped_turns} old turn(s) dropped' if result.dropped_turns else '')
            + ')')
        # rclpy loggers insist on one severity per call site: two calls, not one variable.
        if finish in ('kv_exhausted', 'context_full', 'timeout'):
            self.get_logger().warning(summary)
        else:
            self.get_logger().info(summary)

    def _record_latency(self, result):
        self.info.update(last_ttft_ms=1000.0 * result.ttft_s,
                         last_vision_ms=1000.0 * result.vision_s,
                         last_decode_tok_s=result.decode_tok_s)


def main(args=None):
    """Entry point of the ``orin_llm_node`` executable."""
    # Ctrl-C and SIGTERM only set a flag, from here to the end (a second signal changes
    # nothing); the main thread polls it between short spins, so a signal can never land inside
    # a DDS call and teardown always starts.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Before the DDS participant exists (rclpy.init): large camera frames must reach us.
    profile = dds_profile.apply()
    argv = sys.argv if args is None else ['orin_llm_node', *args]
    # --managed: a lifecycle node that waits for `ros2 lifecycle set ... configure`.
    managed = '--managed' in remove_ros_args(argv)[1:]
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    node = None
    code = 0
    try:
        node = OrinLLMNode(managed=managed)
        node.dds_profile = profile
        if profile:
            node.get_logger().info(f'Fast DDS profile {profile} applied (camera frames over '
                                   'UDP; set FASTDDS_DEFAULT_PROFILES_FILE to use your own)')
        node.start()
        while not stop.is_set() and not node.finished.is_set() and rclpy.ok():
            rclpy.spin_once(node, timeout_sec=0.1)
    except ParameterError as exc:
        rclpy.logging.get_logger(NODE_NAME).fatal(str(exc))
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            code = code or node.exit_code
        # Teardown is bounded: a worker stuck in one long call (e.g. still loading weights) or
        # a middleware teardown that blocks must not keep the process alive after a signal.
        watchdog = threading.Timer(15.0, _hard_exit, args=(code,))
        watchdog.daemon = True
        watchdog.start()
        if node is not None:
            # Loading weights cannot be interrupted: a signal while loading ends the process at
            # once (nothing is being answered yet) instead of waiting for the load to finish.
            loading = node.info.snapshot().state == 'loading'
            if not node.stop(timeout_s=1.0 if loading else 10.0):
                _hard_exit(code)
            code = code or node.exit_code
            node.destroy_node()
        rclpy.try_shutdown()
        watchdog.cancel()
    return code


def _release_memory():
    """Give freed weights back to the system (CUDA caching allocator, glibc arenas)."""
    import gc
    gc.collect()
    torch = sys.modules.get('torch')
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        import ctypes
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass                            # not glibc: the allocator keeps what it keeps


def _hard_exit(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == '__main__':
    sys.exit(main())
