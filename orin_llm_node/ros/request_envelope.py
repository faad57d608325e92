# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The request envelope of the ``prompt/json`` topic: one JSON object per request.

``{"prompt": "...", "response_format": {...}, "max_new_tokens": 64, "temperature": 0.0,
"conversation": "new" | "continue", "tag": "client-chosen id", "video_s": 4}``, and
``tools``, ``tool_choice``, ``tool_results`` and ``detect`` (their checks: tool_requests.py):
only ``prompt`` is required, and not with ``detect`` or ``tool_results``.
:data:`KEYS` is the one table of what an envelope may hold (a new key is one row there, plus
what the session does with it); :func:`parse_envelope` checks a message against it and raises
:class:`EnvelopeError` with the reason (and the ``tag``, when one could be read, so that the
refusal can be matched by the client) for anything the answer could not be run with: text that
is too long or nested too deep, unknown keys, bad values, text that is not valid Unicode,
sampling values the engine refuses (its own ``SamplingParams`` checks) and a
``response_format`` whose grammar does not compile.  A request over the length limit still has
its tag read, up to :data:`MAX_TAG_SCAN_CHARS`.
"""

from dataclasses import dataclass
import json
import math

from orin_llm_node import bounded_json
from orin_llm_node.engine.config import SamplingParams
from orin_llm_node.engine.structured import check_grammar, check_response_format
from orin_llm_node.parameters import MAX_PROMPT_CHARS, PARAMS_BY_NAME
from orin_llm_node.ros import tool_requests

# A request over MAX_PROMPT_CHARS is still read for its tag (the refusal echoes it) up to this.
MAX_TAG_SCAN_CHARS = 10 * MAX_PROMPT_CHARS


class EnvelopeError(ValueError):
    """An envelope the node refuses; ``str(err)`` is the reason, ``tag`` the client's id.

    The reason is made one line of valid UTF-8 (a library's multi-line message, a sender's
    lone surrogate escaped), so that it can be published as it is.
    """

    def __init__(self, reason, tag=None):
        reason = ' '.join(str(reason).split())
        super().__init__(reason.encode('utf-8', 'backslashreplace').decode('utf-8'))
        self.tag = tag


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 'must be a number'
    return None if math.isfinite(v) else 'must be a finite number'


def _non_negative(v):
    return _number(v) or (None if v >= 0 else 'must be >= 0')


def _positive_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return 'must be a positive integer'
    return None


def _text(v):
    if not isinstance(v, str):
        return 'must be a string'
    try:
        v.encode('utf-8')
    except UnicodeEncodeError:          # "\ud800" in JSON: no str the node can publish
        return 'must be valid Unicode (it holds a lone surrogate)'
    return None


def _unicode(v):
    # Any text inside a key's value (a label, a tool result, a schema's description): what the
    # node cannot encode it cannot prompt with, publish or echo.
    try:
        json.dumps(v, ensure_ascii=False).encode('utf-8')
    except UnicodeEncodeError:
        return 'must be valid Unicode (it holds a lone surrogate)'
    return None


def _prompt(v):
    return _text(v) or (None if v.strip() else 'must not be empty')


def _whole(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _stamp(v):
    if (isinstance(v, dict) and set(v) == {'sec', 'nanosec'} and _whole(v['sec'])
            and _whole(v['nanosec']) and v['nanosec'] < 1_000_000_000):
        return None
    return 'must be a header stamp {"sec": s, "nanosec": ns} (integers >= 0, nanosec < 1e9)'


def stamp_ns(envelope):
    """A checked envelope's ``image_stamp`` in nanoseconds, or None without one."""
    stamp = envelope.get('image_stamp')
    return None if stamp is None else stamp['sec'] * 1_000_000_000 + stamp['nanosec']


def _choice(*options):
    def check(v):   # exactly one of them: never a prefix, a part or another case of one
        if isinstance(v, str) and v in options:
            return None
        return f"must be one of {', '.join(map(repr, options))}"
    return check


def _response_format(v):
    try:
        fmt = check_response_format(v)
        if fmt is not None:
            check_grammar(fmt)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Key:
    """One envelope key: its check (``value -> reason or None``) and what it means.

    ``required``: the key must be there, unless the envelope holds one of ``optional_with``.
    ``overrides``: the run-time parameter it overrides for its own answer, if any; a
    sampling parameter's ``SamplingParams`` field is the table's (its ``engine`` column), and
    the engine's checks of that field apply to it as well.  The envelope gives the engine's
    value itself (``response_format``: a JSON object, not the parameter's JSON text).
    """

    check: object
    description: str
    required: bool = False
    optional_with: tuple = ()
    overrides: str = ''

    @property
    def sampling(self):
        """The ``SamplingParams`` field this key sets ('' for none)."""
        engine = PARAMS_BY_NAME[self.overrides].engine if self.overrides else None
        return engine.name if engine is not None and engine.to == 'sampling' else ''


KEYS = {
    # Without a prompt, detect asks the grounding question and tool results add no message.
    'prompt': Key(_prompt, 'the question (text)', required=True,
                  optional_with=('detect', 'tool_results')),
    'response_format': Key(_response_format, 'json_object / json_schema / regex constraint; '
                           'overrides the response_format parameter',
                           overrides='response_format'),
    'max_new_tokens': Key(_positive_int, 'most tokens generated (overrides max_new_tokens)',
                          overrides='max_new_tokens'),
    'temperature': Key(_non_negative, 'sampling temperature (overrides temperature)',
                       overrides='temperature'),
    'conversation': Key(_choice('new', 'continue'), "'new' forgets the history first; "
                        "'continue' (default) answers in the current conversation"),
    'tag': Key(_text, 'client-chosen id, echoed in response/info'),
    'video_s': Key(_non_negative, "a clip of each camera's last this many seconds instead of "
                   'one frame (0: one frame; at most video_buffer_s)',
                   overrides='video_window_s'),
    'tools': Key(tool_requests.check_tools_key, 'tools (OpenAI function definitions) the model '
                 'may call; overrides the tools parameter', overrides='tools'),
    'tool_choice': Key(tool_requests.check_tool_choice_key, "'auto' (default), 'required', "
                       "'none' or {'name': tool}, for the tools in effect"),
    'tool_results': Key(tool_requests.check_tool_results_key, 'answers to the calls of the '
                        'last answer: [{"id", "content", "name"?}], sent before the prompt'),
    'detect': Key(tool_requests.check_detect_key, 'labels (list) or a phrase: grounding boxes '
                  "in each camera's pixels (response/info detections)"),
    'image_stamp': Key(_stamp, "{sec, nanosec}: pair only with frames stamped at or after it, "
                       "waiting up to image_wait_s for them (a frame's own header stamp: that "
                       'frame or a newer one)'),
}


def _tag(data):
    # The client's tag of a parsed envelope, if it can be echoed.
    return data.get('tag') if isinstance(data, dict) and _text(data.get('tag')) is None else None


def _long_request_tag(text):
    # A request over the limit is refused, but its tag is still read (up to
    # MAX_TAG_SCAN_CHARS: parsing costs time in proportion) so that the client can match it.
    if len(text) > MAX_TAG_SCAN_CHARS:
        return None
    try:
        return _tag(bounded_json.loads(text))
    except ValueError:
        return None


def sampling_overrides(envelope):
    """The ``SamplingParams`` fields a checked envelope overrides, as ``{field: value}``."""
    return {key.sampling: envelope[name] for name, key in KEYS.items()
            if key.sampling and name in envelope}


def parse_envelope(text, tools_parameter=''):
    """The checked keys of one ``prompt/json`` message, as a dict; ``EnvelopeError`` if not.

    ``tools_parameter``: the ``tools`` parameter's JSON text now (the tools a request without
    its own has: what its ``tool_choice`` and results may name).
    """
    if len(text) > MAX_PROMPT_CHARS:
        raise EnvelopeError(f'request of {len(text)} characters rejected (limit '
                            f'{MAX_PROMPT_CHARS})', _long_request_tag(text))
    try:
        data = bounded_json.loads(text)
    except ValueError as exc:
        raise EnvelopeError(exc) from None
    if not isinstance(data, dict):
        raise EnvelopeError(f'must be a JSON object, got {type(data).__name__}')
    tag = _tag(data)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise EnvelopeError(f"unknown key(s) {', '.join(map(repr, unknown))} (known: "
                            f"{', '.join(KEYS)})", tag)
    for name, key in KEYS.items():
        if name not in data:
            if key.required and not any(k in data for k in key.optional_with):
                raise EnvelopeError(f'{name!r} is required', tag)
            continue
        reason = _unicode(data[name]) or key.check(data[name])
        if reason:      # the engine's reasons name response_format themselves
            raise EnvelopeError(reason if reason.startswith(name) else f'{name} {reason}', tag)
    if 'image_stamp' in data and data.get('video_s', 0) > 0:
        raise EnvelopeError('image_stamp pairs single frames, not a clip (video_s)', tag)
    try:
        SamplingParams(**sampling_overrides(data))
        tool_requests.check_request(data, tools_parameter)
    except ValueError as exc:
        raise EnvelopeError(exc, tag) from None
    return data
