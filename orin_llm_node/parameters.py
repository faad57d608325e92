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

from orin_llm_node.parameter_values import (  # noqa: F401 - MAX_*, camera_topics, ... are ours
    MAX_CAMERAS,
    MAX_PROMPT_CHARS,
    MAX_TOOLS_CHARS,
    camera_topics,
    model_path_problem,
    one_line,
    response_format,
    response_format_problem,
    tools_problem,
    tools_value,
    topic_names_problem,
)


class ParameterError(ValueError):
    """A parameter value the node cannot run with; ``str(err)`` is one line naming it."""


# The largest integer a ROS parameter holds (int64): the open end of an integer range.
INT_MAX = 2**63 - 1
# The largest normal float32, MAX_TEMPERATURE of engine/config.py (a test keeps them equal):
# this table is read without importing torch.
FLOAT32_MAX = 3.4028234663852886e+38


@dataclass(frozen=True)
class Range:
    """A number parameter's bounds, ``[low, high]``, as ``ros2 param describe`` shows them.

    rclpy refuses a value outside them (FloatingPointRange / IntegerRange: both ends
    included); ``low_open`` (``low`` itself is refused) and ``allow_inf`` (a float may be
    infinite) are the table's own, checked with :meth:`reason`.
    """

    low: float
    high: float = math.inf
    low_open: bool = False
    allow_inf: bool = False

    def reason(self, v):
        """Why ``v`` is out of range (one phrase), or None."""
        if isinstance(v, int):
            if v < self.low or v > self.high:
                return f'must be an integer >= {self.low}' + (
                    f' and <= {self.high}' if self.high < INT_MAX else '')
            return None
        if math.isnan(v) or (math.isinf(v) and not self.allow_inf):
            return 'must be a finite number'
        if (v <= self.low if self.low_open else v < self.low) or v > self.high:
            lo = '(' if self.low_open else '['
            hi = 'inf)' if self.high == math.inf else f'{self.high}]'
            return f'must be in {lo}{self.low}, {hi}'
        return None


@dataclass(frozen=True)
class EngineField:
    """Where a parameter goes in the engine: a field of ``EngineConfig`` or ``SamplingParams``.

    ``to``: ``config``, ``sampling`` or ``openai`` (``OpenAIConfig``, read only with
    ``backend: openai``); ``name``: the field; ``unset``: the parameter's value
    that means "the engine's default" (passed as None); ``convert``: the parameter's value to
    the engine's (``response_format``: its JSON text to a dict), else the value as it is.
    """

    to: str
    name: str
    unset: object = None
    convert: object = None

    def value(self, v):
        """The engine's value for the parameter's value ``v``."""
        if self.unset is not None and v == self.unset:
            return None
        return self.convert(v) if self.convert else v


def _config(name, unset=None):
    return EngineField('config', name, unset)


def _sampling(name, unset=None, convert=None):
    return EngineField('sampling', name, unset, convert)


def _openai(name):
    return EngineField('openai', name)


@dataclass(frozen=True)
class Param:
    """One node parameter: its default (which fixes its type), meaning and rules.

    ``check``: a rule only the node knows (its own encodings, its own settings); ``bounds``:
    the :class:`Range` rclpy enforces and ``ros2 param describe`` shows; ``choices``: the
    texts it takes, said in its description; ``engine``: the :class:`EngineField` it sets.
    The table checks ``bounds`` and ``choices`` of the node's own parameters; what the engine
    takes (``engine`` set) is checked by the engine's EngineConfig / SamplingParams, once, in
    :func:`check_parameters`, so the table holds no second copy of those reasons.
    ``runtime``: settable with ``ros2 param set``; ``constraints``: what it takes, in words.
    """

    name: str
    default: object
    description: str
    check: object = None
    runtime: bool = False
    constraints: str = ''
    bounds: Range | None = None
    choices: tuple = ()
    engine: EngineField | None = None

    def reason(self, v):
        """Why ``v`` (of the right type) is refused by the node's own rules, or None."""
        if self.check is not None and (reason := self.check(v)):
            return reason
        # Server settings too: OpenAIConfig sees them only with backend openai.
        own = self.engine is None or self.engine.to == 'openai'
        if own and self.choices and v not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        if own and self.bounds is not None:
            return self.bounds.reason(v)
        return None


_COUNT = Range(1, INT_MAX)
_ZERO_UP = Range(0, INT_MAX)
_SEEDS = Range(-1, INT_MAX)

PARAMETERS = (
    Param('model_path', '', 'Qwen3-VL checkpoint directory (Hugging Face format); '
          'empty = the embedded demo checkpoint', model_path_problem,
          engine=_config('model_path')),
    Param('device', 'auto', 'torch device', constraints='auto | cpu | cuda | cuda:N',
          choices=('auto', 'cpu', 'cuda', 'cuda:N'), engine=_config('device')),
    Param('dtype', 'auto', 'weights and KV dtype',
          constraints='auto | float32 | bfloat16 | float16',
          choices=('auto', 'float32', 'bfloat16', 'float16'), engine=_config('dtype')),
    Param('quantization', 'none', 'weight-only quantization of a float checkpoint at load '
          '(none = as stored; INT4 / INT8 / FP8 checkpoints load in their own format)',
          constraints='none | int8 | int4 | int4_asym | fp8',
          choices=('none', 'int8', 'int4', 'int4_asym', 'fp8'), engine=_config('quantization')),
    Param('backend', 'local', 'local: this machine runs the checkpoint; openai: the server at '
          'base_url answers (model_path then only sizes the images; empty = Qwen3-VL sizes)',
          constraints='local | openai', choices=('local', 'openai')),
    Param('base_url', '', 'backend openai: the API root, e.g. http://gpu-box:8000/v1',
          constraints='http(s) URL (backend openai)', engine=_openai('base_url')),
    Param('model', '', 'backend openai: the model name the server serves (GET /models lists it)',
          constraints='non-empty (backend openai)', engine=_openai('model')),
    Param('api_key_env', '', 'backend openai: the NAME of the environment variable holding the '
          'API key, never the key (empty = send none)', constraints='variable name or empty',
          engine=_openai('api_key_env')),
    Param('backend_connect_timeout_s', 3.0, 'backend openai: seconds to open a connection',
          constraints='> 0.0', bounds=Range(0.0, low_open=True),
          engine=_openai('connect_timeout_s')),
    Param('backend_read_timeout_s', 60.0, 'backend openai: longest silence of the server (s)',
          constraints='> 0.0', bounds=Range(0.0, low_open=True), engine=_openai('read_timeout_s')),
    Param('backend_request_timeout_s', 300.0, 'backend openai: longest whole answer (seconds)',
          constraints='> 0.0', bounds=Range(0.0, low_open=True),
          engine=_openai('request_timeout_s')),
    Param('backend_retries', 2, 'backend openai: tries more when the server is unreachable or '
          'answers 429/5xx before any text', constraints='0..10', bounds=Range(0, 10),
          engine=_openai('retries')),
    Param('backend_retry_backoff_s', 0.5, 'backend openai: wait before the first retry (doubling)',
          constraints='>= 0.0', bounds=Range(0.0), engine=_openai('retry_backoff_s')),
    Param('return_token_ids', False, "backend openai: ask for the answer's token ids (vLLM's and "
          "orin_llm_serve's extension; without it response/info counts the server's usage)",
          engine=_openai('return_token_ids')),
    Param('max_new_tokens', 256, 'most tokens generated per answer', runtime=True,
          constraints='>= 1', bounds=_COUNT, engine=_sampling('max_tokens')),
    Param('temperature', 0.0, 'sampling temperature (0 = greedy)', runtime=True,
          constraints='0, or a finite float in [1.2e-38, 3.4e38] (normal float32)',
          bounds=Range(0.0, FLOAT32_MAX), engine=_sampling('temperature')),
    Param('top_p', 1.0, 'nucleus sampling threshold (1 = off)', runtime=True,
          constraints='(0, 1]', bounds=Range(0.0, 1.0, low_open=True),
          engine=_sampling('top_p')),
    Param('top_k', 0, 'keep the k most likely tokens (0 = off)', runtime=True,
          constraints='>= 0', bounds=_ZERO_UP, engine=_sampling('top_k')),
    # The node's own rule (-1 is its "random"), then the engine's for what it passes on.
    Param('seed', -1, 'sampling seed (-1 = random)', _SEEDS.reason, runtime=True,
          constraints='>= -1', bounds=_SEEDS, engine=_sampling('seed', unset=-1)),
    Param('system_prompt', 'You are the vision-language assistant of a robot. Answer briefly.',
          'system prompt of every conversation (a change starts a new conversation); the '
          'loaded engine refuses one that leaves no room for a turn',
          lambda v: None if len(v) <= MAX_PROMPT_CHARS else 'is too long', runtime=True),
    Param('kv_block_size', 16, 'tokens per KV block', constraints='>= 1', bounds=_COUNT,
          engine=_config('block_size')),
    Param('kv_cache_memory_mb', 0.0, 'KV pool size in MB (0 = automatic)',
          constraints='>= 0.0', bounds=Range(0.0),
          engine=_config('kv_cache_memory_mb', unset=0.0)),
    Param('max_model_len', 8192, 'longest conversation in tokens', constraints='>= 1',
          bounds=_COUNT, engine=_config('max_model_len')),
    Param('enable_cuda_graph', True, 'capture decode steps as CUDA Graphs (CUDA only)',
          engine=_config('enable_cuda_graph')),
    Param('attention_backend', 'auto', 'auto: the CUDA kernels on CUDA, the torch path when '
          'CuPy cannot import, compile or load them (WARN, reason in diagnostics); cuda: the '
          'kernels or a load failure; torch: never touches CuPy',
          constraints='auto | cuda | torch', choices=('auto', 'cuda', 'torch'),
          engine=_config('attention_backend')),
    Param('enable_prefix_cache', True, 'reuse KV blocks of shared prefixes',
          engine=_config('enable_prefix_cache')),
    Param('image_max_pixels', 307200, 'resize images to at most this many pixels; never '
          "above the checkpoint's own maximum (0 = checkpoint default)", constraints='>= 0',
          bounds=_ZERO_UP, engine=_config('image_max_pixels', unset=0)),
    Param('image_min_pixels', 0, 'resize images to at least this many pixels '
          '(0 = checkpoint default)', constraints='>= 0', bounds=_ZERO_UP,
          engine=_config('image_min_pixels', unset=0)),
    Param('image_qos', 'auto', 'image subscriptions: auto = a best-effort one (matches every '
          'publisher) and a reliable one (reliable publishers get every frame through); '
          'best_effort or reliable = that one only',
          constraints='auto | best_effort | reliable',
          choices=('auto', 'best_effort', 'reliable')),
    Param('image_max_age_s', 2.0, 'a prompt uses the newest image only if it is at most this old',
          constraints='> 0.0', bounds=Range(0.0, low_open=True, allow_inf=True)),
    Param('image_wait_s', 0.5, 'a prompt/json request with image_stamp waits at most this long '
          "for each camera's frame stamped at or after it (README: which frame a prompt gets)",
          runtime=True, constraints='[0, 5]', bounds=Range(0.0, 5.0)),
    Param('image_topics', ['image'], 'camera names: each gets NAME (Image) and NAME/compressed '
          'subscriptions; a prompt pairs with one frame per camera, in this order, each '
          'introduced by its name (README: "Several cameras")', topic_names_problem,
          constraints=f'1..{MAX_CAMERAS} distinct topic names'),
    Param('camera_sync_s', 0.1, "cameras' header stamps in one set lie within this many seconds "
          "(message_filters' approximate-time policy)", constraints='(0, 10]',
          bounds=Range(0.0, 10.0, low_open=True)),
    Param('video_fps', 2.0, 'frames per second each camera keeps for video prompts',
          constraints='(0, 30]', bounds=Range(0.0, 30.0, low_open=True)),
    Param('video_buffer_s', 8.0, 'seconds of frames each camera keeps, at video_fps and the '
          "model's image size (0 = no video)", constraints='[0, 60]', bounds=Range(0.0, 60.0)),
    Param('video_max_pixels', 0, "a clip's pixels (frames x height x width) at most this many; "
          "never above the checkpoint's own maximum (0 = checkpoint default)",
          constraints='>= 0', bounds=_ZERO_UP, engine=_config('video_max_pixels', unset=0)),
    Param('video_window_s', 0.0, 'plain prompts get a clip of the last this many seconds of each '
          'camera instead of one frame (0 = off; the prompt/json envelope asks with video_s)',
          runtime=True, constraints='[0, video_buffer_s]', bounds=Range(0.0, 60.0)),
    Param('queue_size', 4, 'prompts waiting to be answered (overflow drops the oldest)',
          constraints='1..1000', bounds=Range(1, 1000)),
    Param('diagnostics_period_s', 1.0, 'period of /diagnostics', constraints='(0, 3600]',
          bounds=Range(0.0, 3600.0, low_open=True)),
    Param('pool_warn_fraction', 0.9, 'kv_block_pool is WARN from this fraction of blocks in use',
          constraints='(0, 1]', bounds=Range(0.0, 1.0, low_open=True)),
    Param('conversation_mode', 'chat', 'chat: multi-turn history; single: every prompt alone',
          constraints='chat | single', choices=('chat', 'single')),
    Param('max_generation_s', 0.0, 'deadline per answer in seconds (0 = none)',
          constraints='>= 0.0', bounds=Range(0.0),
          engine=_sampling('timeout_s', unset=0.0)),
    Param('response_format', '', 'JSON object constraining the answers to plain prompts: '
          '{"type": "json_object"}, {"type": "json_schema", "schema": {...}} or '
          '{"type": "regex", "pattern": "..."} (empty = free text); refused unless its grammar '
          'compiles', response_format_problem, runtime=True,
          constraints=f'empty | JSON object of at most {MAX_PROMPT_CHARS} characters',
          engine=_sampling('response_format', convert=lambda v: response_format(v))),
    Param('tools', '', 'JSON list of tools (OpenAI function definitions) offered to plain '
          'prompts, the model choosing whether to call them (empty = none; README: "Tool calls '
          'and grounding boxes"); refused unless every schema compiles; not with '
          'response_format', tools_problem, runtime=True,
          constraints=f'empty | JSON list of at most {MAX_TOOLS_CHARS} characters',
          engine=_sampling('tools', convert=lambda v: tools_value(v))),
)
PARAMS_BY_NAME = {p.name: p for p in PARAMETERS}
RUNTIME_PARAMETERS = tuple(p.name for p in PARAMETERS if p.runtime)
# Engine field -> the parameter that sets it (an engine's reason names its field).
PARAMETER_OF_FIELD = {p.engine.name: p.name for p in PARAMETERS if p.engine}

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
    reason = spec.reason(value)
    return None if reason is None else f"parameter '{name}' = {_shown(value)}: {reason}"


def _system_turn(engine, values):
    # The system prompt with the tools rendered beside it (a conversation's system turn) must
    # leave room for a turn: a change of either is judged with the other as it is.
    tools = tools_value(values['tools']) or None
    if tools is None:
        engine.check_system_prompt(values['system_prompt'] or None)
    else:
        engine.check_tools(tools, system_prompt=values['system_prompt'] or None)


# The run-time parameters only a loaded engine can judge, and its check of each (both safe
# from any thread): the system turn (system prompt and tools) against the template, the
# context and the pool, the response format's grammar and each tool's schema compiled against
# the checkpoint's vocabulary, as an answer compiles them.
_LOADED_CHECKS = {
    'system_prompt': _system_turn,
    'response_format': lambda engine, values: engine.check_response_format(
        response_format(values['response_format'])),
    'tools': _system_turn,
}
LOADED_CHECKS = tuple(_LOADED_CHECKS)


def check_loaded(engine, values, names=LOADED_CHECKS):
    """``ParameterError`` naming the first of ``names`` the loaded ``engine`` cannot run with.

    ``values``: every parameter's value (name -> value); names without such a check are
    skipped.
    """
    for name in names:
        if name not in _LOADED_CHECKS:
            continue
        try:
            _LOADED_CHECKS[name](engine, values)
        except ValueError as exc:
            raise ParameterError(f"parameter '{name}' = {_shown(values[name])}: {one_line(exc)}"
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
    if values['backend'] == 'openai' and tools_value(values['tools']):
        raise ParameterError("parameter 'tools': backend openai sends no tools to the server "
                             '(yet): the local engine (backend local) offers them')
    try:
        engine_config(values)
        sampling_params(values)
        if values['backend'] == 'openai':
            openai_config(values)
    except ValueError as exc:
        field = str(exc).split()[0].split('.')[0]  # 'response_format.type' names a parameter
        name = PARAMETER_OF_FIELD.get(field, field)
        given = f' = {_without_password(values[name])!r}' if name in values else ''
        raise ParameterError(f"parameter '{name}'{given}: {exc}") from None


def _without_password(value):
    # A base_url with user:password@ is refused; the refusal (a FATAL log line) must not say it.
    if isinstance(value, str) and '@' in value.partition('//')[2].partition('/')[0]:
        scheme, _, rest = value.partition('//')
        return f"{scheme}//***@{rest.partition('@')[2]}"
    return value


def engine_fields(values, to):
    """The engine fields the parameter ``values`` set (the table's ``engine`` column).

    ``to``: ``'config'`` (EngineConfig) or ``'sampling'`` (SamplingParams).
    """
    return {p.engine.name: p.engine.value(values[p.name]) for p in PARAMETERS
            if p.engine is not None and p.engine.to == to}


def engine_config(values):
    """The EngineConfig the parameters ask for (an empty ``model_path``: the demo checkpoint)."""
    from orin_llm_node.engine import EngineConfig
    return EngineConfig(**engine_fields(values, 'config'))


def openai_config(values):
    """``backend: openai``'s ``OpenAIConfig``; images sized by ``model_path``'s processor."""
    from orin_llm_node.backends.openai_config import OpenAIConfig
    return OpenAIConfig(**engine_fields(values, 'openai'), processor_path=values['model_path'],
                        image_max_pixels=values['image_max_pixels'] or None,
                        image_min_pixels=values['image_min_pixels'] or None)


def sampling_params(values):
    """The SamplingParams of an answer (seed -1: random; max_generation_s 0: no deadline)."""
    from orin_llm_node.engine import SamplingParams
    return SamplingParams(**engine_fields(values, 'sampling'))


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
