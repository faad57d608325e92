# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's parameters: the one table, its checks, and what the node and launch make of it.

:data:`PARAMETERS` is the single source: the node declares it (node_parameters.py),
``launch/orin_llm.launch.py`` builds one launch argument per entry from it, and
``config/orin_llm.yaml`` and the README are checked against it (test/test_params_agree.py,
test/test_readme.py).  Values are checked here, once, when the node starts or a run-time
parameter is set.  No rclpy (``orin_llm_check`` reads the parameters without it).
"""

from dataclasses import dataclass
import math
from pathlib import Path
import re

from orin_llm_node import bounded_json
from orin_llm_node.ros.refusals import REASON_CHARS, clip

# Longest prompt, prompt/json message and response_format value taken (characters).
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


def _response_format_text(v):
    # The library compiles the grammar without a vocabulary here (no checkpoint is loaded at
    # start-up or in orin_llm_check); the loaded engine's own compile: check_loaded.
    if len(v) > MAX_PROMPT_CHARS:
        return f'is too long ({len(v)} characters, limit {MAX_PROMPT_CHARS})'
    from orin_llm_node.engine.structured import check_grammar, check_response_format
    try:
        fmt = response_format(v)
        if fmt is not None and not isinstance(fmt, dict):
            return 'must be a JSON object'
        fmt = check_response_format(fmt)
        if fmt is not None:
            check_grammar(fmt)
    except ValueError as exc:
        return clip(' '.join(str(exc).split()), REASON_CHARS)
    return None


def response_format(text):
    """The ``response_format`` parameter's JSON text as a dict (empty: None).

    ``ValueError`` for text that is not JSON or is nested too deep (``bounded_json``).
    """
    return bounded_json.loads(text) if text else None


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
          '{"type": "regex", "pattern": "..."} (empty = free text); refused unless its grammar '
          'compiles', _response_format_text, runtime=True,
          constraints=f'empty | JSON object of at most {MAX_PROMPT_CHARS} characters'),
)
PARAMS_BY_NAME = {p.name: p for p in PARAMETERS}
RUNTIME_PARAMETERS = tuple(p.name for p in PARAMETERS if p.runtime)

_TYPE_NAMES = {bool: 'a boolean', int: 'an integer', float: 'a double (e.g. 1.0)',
               str: 'a string', list: 'a list of strings (e.g. [front, wrist])'}


def _shown(value):
    # A value as repeated in a reason: its repr, cut short (a value can be 100,000 characters).
    text = repr(value)
    if len(text) <= 60:
        return text
    return text[:57] + '...' + (f' ({len(value)} characters)' if isinstance(value, str) else '')


def wrong_type(name, value=None):
    """The one-line reason why ``value`` (None: not known) is not of parameter ``name``'s type."""
    kind = type(PARAMS_BY_NAME[name].default)
    given = '' if value is None else f', got {_shown(value)}'
    return f"parameter '{name}' must be {_TYPE_NAMES[kind]}{given}"


def check_parameter(name, value):
    """Return the one-line reason why ``value`` is invalid for parameter ``name``, or None."""
    spec = PARAMS_BY_NAME[name]
    if type(value) is not type(spec.default):
        return wrong_type(name, value)
    reason = spec.check(value) if spec.check else None
    return None if reason is None else f"parameter '{name}' = {_shown(value)}: {reason}"


# The run-time parameters only a loaded engine can judge, and its check of each (both safe
# from any thread): the system prompt against the template and the pool, the response format's
# grammar compiled against the checkpoint's vocabulary, as an answer compiles it.
_LOADED_CHECKS = {
    'system_prompt': lambda engine, v: engine.check_system_prompt(v or None),
    'response_format': lambda engine, v: engine.check_response_format(response_format(v)),
}
LOADED_CHECKS = tuple(_LOADED_CHECKS)


def check_loaded(engine, values, names=LOADED_CHECKS):
    """``ParameterError`` naming the first of ``names`` the loaded ``engine`` cannot run with.

    ``values``: name -> value (at least ``names``); names without such a check are skipped.
    """
    for name in names:
        if name not in _LOADED_CHECKS:
            continue
        try:
            _LOADED_CHECKS[name](engine, values[name])
        except ValueError as exc:
            reason = clip(' '.join(str(exc).split()), REASON_CHARS)
            raise ParameterError(f"parameter '{name}' = {_shown(values[name])}: {reason}"
                                 ) from None


def check_parameters(values):
    """Check a complete name -> value mapping once; raise ParameterError naming the parameter.

    The node's own rules come from the table; the values the engine takes are checked by the
    engine itself (EngineConfig and SamplingParams, built exactly as the session builds them).
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
        except RecursionError:
            raise ParameterError(f'params file {path}: nested too deeply') from None
        except (OSError, ValueError, yaml.YAMLError) as exc:   # ValueError: not UTF-8
            raise ParameterError(f'params file {path}: {" ".join(str(exc).split())}') from None
        for section, body in _mapping(doc, path).items():
            if section == '/**' or str(section).rstrip('/').split('/')[-1] == node_name:
                given = _mapping(_mapping(body or {}, path).get('ros__parameters') or {}, path)
                values.update((k, v) for k, v in given.items() if k in PARAMS_BY_NAME)
    for text in overrides:
        name, sep, value = text.partition(':=')
        if not sep or name not in PARAMS_BY_NAME:
            raise ParameterError(f'override {text!r} is not name:=value for a node parameter')
        values[name] = from_text(name, value)
    check_parameters(values)
    return values


def _mapping(value, path):
    # A params file's document, section or ros__parameters: a mapping, else ParameterError.
    if not isinstance(value, dict):
        raise ParameterError(f'params file {path}: expected a mapping of node names to '
                             f'ros__parameters, got {type(value).__name__}')
    return value
