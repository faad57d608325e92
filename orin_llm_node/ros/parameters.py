# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's parameters: the one table, its checks, and what the node and launch make of it.

:data:`PARAMETERS` is the single source: the node declares it, ``launch/orin_llm.launch.py``
builds one launch argument per entry from it, and ``config/orin_llm.yaml`` and the README are
checked against it (test/test_params_agree.py, test/test_readme.py).  Values are checked here,
once, when the node starts or a run-time parameter is set.
"""

from dataclasses import dataclass
import json
import math
from pathlib import Path
import re

MAX_PROMPT_CHARS = 100_000
MAX_CAMERAS = 8
# A relative or absolute ROS topic name made of plain tokens (no substitutions, no '~').
_TOPIC_NAME = re.compile(r'/?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*')


class ParameterError(ValueError):
    """A parameter value the node cannot run with; ``str(err)`` is one line naming it."""


def _model_path_ok(v):
    if v == '' or (Path(v).expanduser() / 'config.json').is_file():
        return None
    return 'must be empty (demo checkpoint) or a checkpoint directory containing config.json'


def camera_topics(name):
    """The topics camera ``name`` is read from: ``NAME`` (Image) and ``NAME/compressed``."""
    return name, f'{name}/compressed'


def _topic_names(names):
    if not 1 <= len(names) <= MAX_CAMERAS:
        return f'must name 1 to {MAX_CAMERAS} cameras'
    bad = [n for n in names if not isinstance(n, str) or not _TOPIC_NAME.fullmatch(n)]
    if bad:
        return f'{bad[0]!r} is not a topic name (tokens of letters, digits and _ joined by /)'
    if len(set(names)) != len(names):
        return 'names a camera twice'
    twins = {camera_topics(n)[1]: n for n in names}
    clash = next((n for n in names if n in twins), None)
    if clash is not None:
        return (f'camera {clash!r} is the CompressedImage topic of camera {twins[clash]!r} '
                '(each camera NAME is also read on NAME/compressed)')
    return None


def check_camera_topics(node, names, services=()):
    """``ParameterError`` when a camera would read a topic the node owns or another camera reads.

    ``names``: ``image_topics``; each camera's topics are resolved as ``node`` resolves them
    (namespace, remapping) and compared with every topic and service name of ``node`` (call it
    once they exist) and ``services`` (opened later, on activation).  An Image subscription on
    one of the node's own topics cannot even be created (another message type on that topic):
    activation would fail only after the model was loaded.
    """
    topics = [p.topic_name for p in node.publishers] + [s.topic_name for s in node.subscriptions]
    # Not in rclpy's lists: the lifecycle state machine's publisher and rcl's log topic.
    topics += [node.resolve_topic_name('~/transition_event'), '/rosout']
    seen = dict.fromkeys(topics, "this node's own topic")
    services = [s.srv_name for s in node.services] + list(services)
    seen.update(dict.fromkeys(map(node.resolve_service_name, services),
                              "this node's own service"))
    for camera in names:
        for topic in camera_topics(camera):
            try:
                resolved = node.resolve_topic_name(topic)
            except RuntimeError as exc:     # rcl's RCLError, e.g. longer than DDS allows
                raise ParameterError(f"parameter 'image_topics': camera {camera!r} is not a "
                                     f"usable topic name ({str(exc).split(', at ')[0]})"
                                     ) from None
            if resolved in seen:
                raise ParameterError(f"parameter 'image_topics': camera {camera!r} would read "
                                     f'{resolved}, {seen[resolved]}; choose another name (or '
                                     'remap it)')
            seen[resolved] = f'which camera {camera!r} reads too'


def _choice(*options):
    def check(v):
        return None if v in options else f"must be one of {', '.join(options)}"
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


def _json_object_text(v):
    if v == '':
        return None
    try:
        return None if isinstance(json.loads(v), dict) else 'must be a JSON object'
    except ValueError as exc:
        return f'is not JSON: {exc}'


def response_format(text):
    """The ``response_format`` parameter's JSON text as a dict (empty: None)."""
    return json.loads(text) if text else None


@dataclass(frozen=True)
class Param:
    """One node parameter: default (which fixes its type), meaning, check, run-time settable.

    ``check`` is for what only the node knows (its own encodings, its own settings); what the
    engine takes is checked by the engine's EngineConfig / SamplingParams, once, in
    :func:`check_parameters` (the table has no second copy of those rules).
    """

    name: str
    default: object
    description: str
    check: object = None
    runtime: bool = False
    constraints: str = ''


PARAMETERS = (
    Param('model_path', '', 'Qwen3-VL checkpoint directory (Hugging Face format); '
          'empty = the embedded demo checkpoint', _model_path_ok),
    Param('device', 'auto', 'torch device', constraints='auto | cpu | cuda | cuda:N'),
    Param('dtype', 'auto', 'weights and KV dtype',
          constraints='auto | float32 | bfloat16 | float16'),
    Param('quantization', 'none', 'weight-only quantization of a float checkpoint at load '
          '(none = as stored; INT4 / INT8 / FP8 checkpoints load in their own format)',
          constraints='none | int8 | int4 | int4_asym | fp8'),
    Param('max_new_tokens', 256, 'most tokens generated per answer', runtime=True,
          constraints='>= 1'),
    Param('temperature', 0.0, 'sampling temperature (0 = greedy)', runtime=True,
          constraints='0, or a finite float in [1.2e-38, 3.4e38] (normal float32)'),
    Param('top_p', 1.0, 'nucleus sampling threshold (1 = off)', runtime=True,
          constraints='(0, 1]'),
    Param('top_k', 0, 'keep the k most likely tokens (0 = off)', runtime=True,
          constraints='>= 0'),
    Param('seed', -1, 'sampling seed (-1 = random)', _int_at_least(-1), runtime=True,
          constraints='>= -1'),
    Param('system_prompt', 'You are the vision-language assistant of a robot. Answer briefly.',
          'system prompt of every conversation (a change starts a new conversation); the '
          'loaded engine refuses one that leaves no room for a turn',
          lambda v: None if len(v) <= MAX_PROMPT_CHARS else 'is too long', runtime=True),
    Param('kv_block_size', 16, 'tokens per KV block', constraints='>= 1'),
    Param('kv_cache_memory_mb', 0.0, 'KV pool size in MB (0 = automatic)',
          constraints='>= 0.0'),
    Param('max_model_len', 8192, 'longest conversation in tokens', constraints='>= 1'),
    Param('enable_cuda_graph', True, 'capture decode steps as CUDA Graphs (CUDA only)'),
    Param('attention_backend', 'auto', 'auto: the CUDA kernels on CUDA, the torch path when '
          'CuPy cannot import, compile or load them (WARN, reason in diagnostics); cuda: the '
          'kernels or a load failure; torch: never touches CuPy',
          constraints='auto | cuda | torch'),
    Param('enable_prefix_cache', True, 'reuse KV blocks of shared prefixes'),
    Param('image_max_pixels', 307200, 'resize images to at most this many pixels; never '
          "above the checkpoint's own maximum (0 = checkpoint default)", constraints='>= 0'),
    Param('image_min_pixels', 0, 'resize images to at least this many pixels '
          '(0 = checkpoint default)', constraints='>= 0'),
    Param('image_qos', 'auto', 'image subscriptions: auto = a best-effort one (matches every '
          'publisher) and a reliable one (reliable publishers get every frame through); '
          'best_effort or reliable = that one only', _choice('auto', 'best_effort', 'reliable'),
          constraints='auto | best_effort | reliable'),
    Param('image_max_age_s', 2.0, 'a prompt uses the newest image only if it is at most this old',
          _float_in(0.0, low_open=True, allow_inf=True), constraints='> 0.0'),
    Param('image_topics', ['image'], 'camera names: each gets NAME (Image) and NAME/compressed '
          'subscriptions; a prompt pairs with one frame per camera, in this order, each '
          'introduced by its name (README: "Several cameras")', _topic_names,
          constraints=f'1..{MAX_CAMERAS} distinct topic names'),
    Param('camera_sync_s', 0.1, "cameras' header stamps in one set lie within this many seconds "
          "(message_filters' approximate-time policy)", _float_in(0.0, 10.0, low_open=True),
          constraints='(0, 10]'),
    Param('video_fps', 2.0, 'frames per second each camera keeps for video prompts',
          _float_in(0.0, 30.0, low_open=True), constraints='(0, 30]'),
    Param('video_buffer_s', 8.0, 'seconds of frames each camera keeps, at video_fps and the '
          "model's image size (0 = no video)", _float_in(0.0, 60.0), constraints='[0, 60]'),
    Param('video_max_pixels', 0, "a clip's pixels (frames x height x width) at most this many; "
          "never above the checkpoint's own maximum (0 = checkpoint default)",
          constraints='>= 0'),
    Param('video_window_s', 0.0, 'plain prompts get a clip of the last this many seconds of each '
          'camera instead of one frame (0 = off; the prompt/json envelope asks with video_s)',
          _float_in(0.0, 60.0), runtime=True, constraints='[0, video_buffer_s]'),
    Param('queue_size', 4, 'prompts waiting to be answered (overflow drops the oldest)',
          _int_at_least(1, 1000), constraints='1..1000'),
    Param('diagnostics_period_s', 1.0, 'period of /diagnostics',
          _float_in(0.0, 3600.0, low_open=True), constraints='(0, 3600]'),
    Param('pool_warn_fraction', 0.9, 'kv_block_pool is WARN from this fraction of blocks in use',
          _float_in(0.0, 1.0, low_open=True), constraints='(0, 1]'),
    Param('conversation_mode', 'chat', 'chat: multi-turn history; single: every prompt alone',
          _choice('chat', 'single'), constraints='chat | single'),
    Param('max_generation_s', 0.0, 'deadline per answer in seconds (0 = none)',
          constraints='>= 0.0'),
    Param('response_format', '', 'JSON object constraining the answers to plain prompts: '
          '{"type": "json_object"}, {"type": "json_schema", "schema": {...}} or '
          '{"type": "regex", "pattern": "..."} (empty = free text)', _json_object_text,
          runtime=True, constraints='empty | JSON object'),
)
PARAMS_BY_NAME = {p.name: p for p in PARAMETERS}
RUNTIME_PARAMETERS = tuple(p.name for p in PARAMETERS if p.runtime)

_TYPE_NAMES = {bool: 'a boolean', int: 'an integer', float: 'a double (e.g. 1.0)',
               str: 'a string', list: 'a list of strings (e.g. [front, wrist])'}


def check_parameter(name, value):
    """Return the one-line reason why ``value`` is invalid for parameter ``name``, or None."""
    spec = PARAMS_BY_NAME[name]
    kind = type(spec.default)
    if type(value) is not kind:
        return f"parameter '{name}' must be {_TYPE_NAMES[kind]}, got {value!r}"
    reason = spec.check(value) if spec.check else None
    return None if reason is None else f"parameter '{name}' = {value!r}: {reason}"


def check_system_prompt(engine, value):
    """``ParameterError`` when ``engine`` cannot lead a conversation with this system prompt.

    The engine's own check (``LLMEngine.check_system_prompt``, safe from any thread); empty
    means none.
    """
    try:
        engine.check_system_prompt(value or None)
    except ValueError as exc:
        shown = value if len(value) <= 60 else value[:57] + '...'
        raise ParameterError(f"parameter 'system_prompt' = {shown!r} ({len(value)} characters)"
                             f": {' '.join(str(exc).split())}") from None


def check_parameters(values):
    """Check a complete name -> value mapping once; raise ParameterError naming the parameter.

    The node's own rules come from the table; the values the engine takes are checked by the
    engine itself (EngineConfig and SamplingParams, built exactly as the worker builds them).
    """
    for name in PARAMS_BY_NAME:
        reason = check_parameter(name, values[name])
        if reason:
            raise ParameterError(reason)
    if values['video_window_s'] > values['video_buffer_s']:
        raise ParameterError(
            f"parameter 'video_window_s' = {values['video_window_s']!r}: must not exceed "
            f"video_buffer_s ({values['video_buffer_s']!r}), the seconds each camera keeps")
    try:
        engine_config(values, values['model_path'] or 'demo_model')
        sampling_params(values)
    except ValueError as exc:
        field = str(exc).split()[0].split('.')[0]  # 'response_format.type' names a parameter
        name = _ENGINE_FIELDS.get(field, field)
        given = f' = {values[name]!r}' if name in values else ''
        raise ParameterError(f"parameter '{name}'{given}: {exc}") from None


# Engine field -> the parameter that sets it (where the names differ).
_ENGINE_FIELDS = {'block_size': 'kv_block_size', 'max_tokens': 'max_new_tokens',
                  'timeout_s': 'max_generation_s'}


def engine_config(values, model_path):
    """The EngineConfig the parameters ask for (0 means "the engine's default")."""
    from orin_llm_node.engine import EngineConfig
    return EngineConfig(
        model_path=str(model_path), device=values['device'], dtype=values['dtype'],
        quantization=values['quantization'], block_size=values['kv_block_size'],
        kv_cache_memory_mb=values['kv_cache_memory_mb'] or None,
        max_model_len=values['max_model_len'], enable_prefix_cache=values['enable_prefix_cache'],
        enable_cuda_graph=values['enable_cuda_graph'],
        attention_backend=values['attention_backend'],
        image_max_pixels=values['image_max_pixels'] or None,
        image_min_pixels=values['image_min_pixels'] or None,
        video_max_pixels=values['video_max_pixels'] or None)


def sampling_params(values):
    """The SamplingParams of an answer (seed -1: random; max_generation_s 0: no deadline)."""
    from orin_llm_node.engine import SamplingParams
    seed, deadline = values['seed'], values['max_generation_s']
    return SamplingParams(
        max_tokens=values['max_new_tokens'], temperature=values['temperature'],
        top_p=values['top_p'], top_k=values['top_k'], seed=None if seed == -1 else seed,
        timeout_s=None if deadline == 0 else deadline,
        response_format=response_format(values['response_format']))


_TRUE = ('true', '1', 'yes', 'on')
_FALSE = ('false', '0', 'no', 'off')


def from_text(name, text):
    """A launch argument's text as the parameter's type; ``ParameterError`` naming it if not."""
    kind = type(PARAMS_BY_NAME[name].default)
    try:
        if kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if kind is list:                # "[front, wrist]" or "front,wrist"
            inner = text.strip().removeprefix('[').removesuffix(']')
            return [t.strip().strip('\'"') for t in inner.split(',') if t.strip()]
        return text if kind is str else kind(text)
    except ValueError:
        raise ParameterError(
            f'launch argument {name}:={text!r} is not a valid {kind.__name__}') from None


def declare(node):
    """Declare every parameter on ``node``, check the values once; returns name -> value."""
    from rcl_interfaces.msg import ParameterDescriptor, ParameterType
    from rclpy.exceptions import InvalidParameterTypeException, ParameterException

    ros_types = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
                 float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING,
                 list: ParameterType.PARAMETER_STRING_ARRAY}
    overrides = getattr(node, '_parameter_overrides', {})
    values = {}
    for spec in PARAMETERS:
        kind = type(spec.default)
        descriptor = ParameterDescriptor(
            name=spec.name, type=ros_types[kind], description=spec.description,
            additional_constraints=spec.constraints, read_only=not spec.runtime)
        try:
            values[spec.name] = node.declare_parameter(spec.name, spec.default, descriptor).value
        except InvalidParameterTypeException:
            given = overrides.get(spec.name)
            given = f', got {given.value!r}' if given is not None else ''
            raise ParameterError(
                f"parameter '{spec.name}' must be {_TYPE_NAMES[kind]}{given}") from None
        except (ParameterException, TypeError, ValueError) as exc:
            raise ParameterError(f"parameter '{spec.name}': {exc}") from None
    check_parameters(values)
    for name in sorted(set(overrides) - set(PARAMS_BY_NAME)):
        if not node.has_parameter(name):
            node.get_logger().warning(f"unknown parameter '{name}' ignored (typo?)")
    return values


def on_set(node, params):
    """The node's set-parameters callback: only run-time parameters, only valid values."""
    from rcl_interfaces.msg import SetParametersResult

    values = {name: node.get_parameter(name).value for name in PARAMS_BY_NAME}
    for param in params:
        if param.name not in PARAMS_BY_NAME:
            continue
        if param.name not in RUNTIME_PARAMETERS:
            return SetParametersResult(
                successful=False, reason=f"parameter '{param.name}' is read-only at run "
                'time: restart the node (or relaunch) to change it')
        values[param.name] = param.value
    try:
        check_parameters(values)
        engine = node.worker.engine
        if engine is not None and any(p.name == 'system_prompt' for p in params):
            check_system_prompt(engine, values['system_prompt'])
    except ParameterError as exc:
        return SetParametersResult(successful=False, reason=str(exc))
    for param in params:
        if param.name in RUNTIME_PARAMETERS:
            node.get_logger().info(
                f'{param.name} set to {param.value!r} (takes effect at the next prompt)')
    return SetParametersResult(successful=True)


def values_from_files(params_files=(), overrides=(), node_name='orin_llm'):
    """The values the node would start with, read without rclpy (``orin_llm_check``).

    ``params_files``: ``--params-file`` YAML files in order (sections ``/**``, ``node_name``
    or ``/<ns>/node_name``, each with ``ros__parameters``); ``overrides``: ``name:=value``
    texts, last wins, as after ``-p``. Checked like the node's; raises ParameterError.
    """
    import yaml

    values = {p.name: p.default for p in PARAMETERS}
    for path in params_files:
        try:
            doc = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ParameterError(f'params file {path}: {exc}') from None
        for section, body in doc.items():
            if section == '/**' or str(section).rstrip('/').split('/')[-1] == node_name:
                given = (body or {}).get('ros__parameters') or {}
                values.update((k, v) for k, v in given.items() if k in PARAMS_BY_NAME)
    for text in overrides:
        name, sep, value = text.partition(':=')
        if not sep or name not in PARAMS_BY_NAME:
            raise ParameterError(f'override {text!r} is not name:=value for a node parameter')
        values[name] = from_text(name, value)
    check_parameters(values)
    return values
