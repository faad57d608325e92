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
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from orin_llm_node import ros_image
from orin_llm_node.diagnostics import DiagnosticsMonitor, GenerationInfo
from orin_llm_node.package_files import DEMO_MODEL_DIR

NODE_NAME = 'orin_llm'
MAX_PROMPT_CHARS = 100_000


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
    Param('quantization', 'none', 'weight-only quantization of a float checkpoint at load '
          '(none = as stored; INT4 / INT8 / FP8 checkpoints load in their own format)',
          _choice('none', 'int8', 'int4', 'int4_asym', 'fp8'),
          constraints='none | int8 | int4 | int4_asym | fp8'),
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
    Param('image_qos_reliable', False, 'subscribe to images with reliable QoS instead of '
          'sensor-data best effort (only reliable publishers match then)'),
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


@dataclass
class Request:
    """One queued prompt and the image paired with it when it arrived."""

    text: str
    image: PendingImage | None
    received_ns: int


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


class OrinLLMNode(Node):
    """Qwen3-VL node: see DESIGN §5 for its topics, services and parameters."""

    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.params = self._declare_parameters()
        self.exit_code = 0
        self.info = GenerationInfo()
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
        # Sensor data: best effort matches every publisher. Reliable is there for frames that a
        # best-effort transport drops (Fast DDS: > 512 KB between processes, see README).
        sensor = _qos(1, reliable=self.params['image_qos_reliable'])
        self.create_subscription(Image, 'image', self._on_image, sensor)
        self.create_subscription(CompressedImage, 'image/compressed', self._on_compressed, sensor)
        self.create_subscription(String, 'prompt', self._on_prompt, _qos(10))
        self.create_service(Trigger, 'reset', self._on_reset)
        self.create_service(Trigger, 'cancel', self._on_cancel)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._loading_timer = self.create_timer(self.params['diagnostics_period_s'],
                                                self._on_loading_timer)
        self.pub_ready.publish(Bool(data=False))
        self._worker = threading.Thread(target=self._run_worker, name='orin_llm_worker',
                                        daemon=True)
        self._log_handler = _RosLogHandler(self.get_logger())
        self._py_logger = logging.getLogger('orin_llm_node')

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
        with self._cond:
            self.info.errors += 1
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
        check = ros_image.check_compressed if compressed else ros_image.check_image
        try:
            check(msg)
        except ros_image.ImageConversionError as exc:
            self._reject_image('image/compressed' if compressed else 'image', str(exc))
            return
        stamp, stamped = self._stamp_ns(msg.header)
        with self._cond:
            self._newest_image = PendingImage(msg, compressed, stamp, stamped)

    def _on_prompt(self, msg):
        text = msg.data
        if not text.strip():
            self._publish_error('empty prompt ignored')
            return
        if len(text) > MAX_PROMPT_CHARS:
            self._publish_error(f'prompt of {len(text)} characters rejected '
                                f'(limit {MAX_PROMPT_CHARS})')
            return
        now = self.get_clock().now().nanoseconds
        image = self._newest_image
        max_age = self.params['image_max_age_s']
        if image is None:
            self.get_logger().info('no image received yet: the prompt is answered text-only')
        elif (now - image.stamp_ns) / 1e9 > max_age:
            age = (now - image.stamp_ns) / 1e9
            self.get_logger().info(
                f'newest image is {age:.1f} s old (> image_max_age_s {max_age:g} s): the '
                'prompt is answered text-only')
            image = None
        dropped = None
        with self._cond:
            if len(self._queue) >= self.params['queue_size']:
                dropped = self._queue.popleft()
                self.info.dropped_prompts += 1
            self._queue.append(Request(text, image, now))
            self.info.queue_depth = len(self._queue)
            self._cond.notify_all()
        if dropped is not None:
            self._publish_error(
                f"queue full (queue_size {self.params['queue_size']}): dropped the oldest "
                f"prompt '{_preview(dropped.text)}'")

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

    def _on_loading_timer(self):
        # Until the engine exists the worker cannot publish diagnostics: say we are loading.
        if self.info.state != 'loading':
            self._loading_timer.cancel()
            return
        now = time.monotonic()
        elapsed = now - self._load_started
        self.info.detail = f'loading model ({elapsed:.0f} s)'
        if now - self._last_load_log >= 10.0:
            self._last_load_log = now
            self.get_logger().info(f'still loading the model ({elapsed:.0f} s)...')
        with self._diag_lock:
            statuses = self.monitor.update(now, None, self.info)
        if statuses:
            self._publish_diagnostics(statuses)

    # ---- worker thread (owns the engine) --------------------------------------------------

    def start(self):
        """Start the worker thread (loads the model, then answers prompts)."""
        self._py_logger.addHandler(self._log_handler)
        self._worker.start()

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
            self.info.queue_depth = len(self._queue)
        stats = self._engine.stats() if self._engine is not None else None
        with self._diag_lock:
            statuses = self.monitor.update(now, stats, self.info, force=force)
        if statuses:
            self._publish_diagnostics(statuses)

    def _fail(self, text):
        self.get_logger().fatal(text)
        self.info.state = 'failed'
        self.info.detail = text
        self.exit_code = 1
        self._diagnostics(force=True)
        self._safe_publish(self.pub_ready, Bool(data=False))
        # Make spin() return so that main() exits with the error code.
        rclpy.try_shutdown(context=self.context)

    def _run_worker(self):
        try:
            self._engine = self._load_engine()
        except Exception as exc:  # noqa: BLE001 - any load failure is one fatal line
            msg = ' '.join(str(exc).split()) or type(exc).__name__
            if not self._stop.is_set():
                self._fail(f'failed to load the model: {msg}')
            return
        if self._stop.is_set() or not self.context.ok():
            return                      # shut down while loading: nobody is listening
        self.info.state = 'ready'
        self.info.detail = ''
        self._safe_publish(self.pub_ready, Bool(data=True))
        self.get_logger().info('ready: publish a prompt on '
                               f"{self.resolve_topic_name('prompt')}")
        self._diagnostics(force=True)
        while not self._stop.is_set():
            request = None
            with self._cond:
                if not (self._queue or self._reset_requested or self._stop.is_set()):
                    wait = self.monitor.seconds_until_due(time.monotonic())
                    self._cond.wait(timeout=max(wait, 0.01))
                reset, self._reset_requested = self._reset_requested, False
                if self._queue and not reset and not self._stop.is_set():
                    request = self._queue.popleft()
                    self.info.queue_depth = len(self._queue)
                    self._busy = True
                    self._cancel_pending = False
            if self._stop.is_set():
                break
            try:
                if reset:
                    self._drop_conversation('reset service')
                if request is not None:
                    self._answer(request)
            except ValueError as exc:   # the engine's verdict on the input (nothing changed)
                self.info.errors += 1
                self._publish_error(f"prompt rejected: {' '.join(str(exc).split())}")
            except Exception as exc:  # noqa: BLE001 - bad input must never kill the node
                self.info.errors += 1
                reason = ' '.join(str(exc).split()) or type(exc).__name__
                self._publish_error(f'request failed: {reason}')
                self.get_logger().debug(traceback.format_exc())
            finally:
                with self._cond:
                    self._busy = False
            self._diagnostics()

    def _engine_config(self, model_path):
        from orin_llm_node.engine import EngineConfig
        p = self.params
        return EngineConfig(
            model_path=str(model_path), device=p['device'], dtype=p['dtype'],
            quantization=p['quantization'], block_size=p['kv_block_size'],
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
        self.info.device = str(engine.device)
        self.info.dtype = str(engine.dtype).replace('torch.', '')
        self.info.weight_format = engine.weight_format
        self.info.weight_bytes = engine.weight_bytes
        # Reported only when the engine says graphs are really in use (not just enabled).
        self.info.cuda_graph = bool(getattr(engine, 'uses_cuda_graph', False))
        self.monitor.hardware_id = self.info.device
        mb = stats.total_blocks * stats.bytes_per_block / 2 ** 20
        log.info(f'loaded in {time.monotonic() - t0:.1f} s on {self.info.device} '
                 f'({self.info.dtype}, weights {self.info.weight_format} '
                 f'{self.info.weight_bytes / 2 ** 20:.1f} MB); KV pool: '
                 f'{stats.total_blocks} blocks x {stats.block_size} tokens ({mb:.1f} MB)')
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
        if self._conv is not None:
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
            self.info.errors += 1
            self._publish_error(f'image rejected: {exc}; the prompt is answered text-only')
            return None

    def _answer(self, request):
        from orin_llm_node.engine import FinishReason
        self.info.requests += 1
        rgb = self._decode_image(request.image) if request.image is not None else None
        images = [rgb] if rgb is not None else []
        if rgb is not None:
            self.info.last_image_stamp = request.image.stamp_ns / 1e9
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
        self.info.last_finish_reason = finish
        self._record_latency(result)
        what = f"'{_preview(request.text)}'" + (
            f' + {rgb.shape[1]}x{rgb.shape[0]} image' if rgb is not None else '')
        if result.error:
            self.info.errors += 1
            self._publish_error(f'prompt {what} rejected ({finish}): {result.error}')
            return
        self._safe_publish(self.pub_response, String(data=result.text))
        summary = (
            f'{what} -> {len(result.token_ids)} tokens in {elapsed:.2f} s (finish={finish}, '
            f'ttft {1000 * result.ttft_s:.0f} ms, {result.cached_tokens} cached prompt tokens'
            + (f', {result.dropped_turns} old turn(s) dropped' if result.dropped_turns else '')
            + ')')
        # rclpy loggers insist on one severity per call site: two calls, not one variable.
        if finish in FinishReason.LIMITS:
            self.get_logger().warning(summary)
        else:
            self.get_logger().info(summary)

    def _record_latency(self, result):
        self.info.last_ttft_ms = 1000.0 * result.ttft_s
        self.info.last_vision_ms = 1000.0 * result.vision_s
        self.info.last_decode_tok_s = result.decode_tok_s


def main(args=None):
    """Entry point of the ``orin_llm_node`` executable."""
    # Ctrl-C and SIGTERM only set a flag; the main thread polls it between short spins, so a
    # signal can never land inside a DDS call and teardown always starts.
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    node = None
    code = 0
    try:
        node = OrinLLMNode()
        node.start()
        while not stop.is_set() and rclpy.ok():
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
            if not node.stop():
                _hard_exit(code)
            code = code or node.exit_code
            node.destroy_node()
        rclpy.try_shutdown()
        watchdog.cancel()
    return code


def _hard_exit(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == '__main__':
    sys.exit(main())
