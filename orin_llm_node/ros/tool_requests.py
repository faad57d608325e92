# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The tool and grounding keys of a ``prompt/json`` request: their checks, the answer's shape.

``tools`` (OpenAI function definitions; they replace the ``tools`` parameter for this answer),
``tool_choice`` (``auto`` / ``required`` / ``none`` / a named tool, for the tools in effect),
``tool_results`` (``[{"id", "content", "name"?}]``: the answers to the calls of the last
answer, sent back before the prompt) and ``detect`` (labels or a phrase: grounding boxes).
Everything that can be checked on arrival is (request_envelope.py refuses it with the reason):
the shapes, each tool's schema compiled, a ``tool_choice`` or a result's ``name`` naming no
tool in effect, ``detect`` with another shaping key or a clip.  The session checks the rest
against the conversation (a result's ``id`` must be a call of the last answer: the engine's
check, with the ``name`` the call had).

No rclpy.
"""

from dataclasses import replace
import json

from orin_llm_node.engine.tool_calls import check_tool_schemas
from orin_llm_node.parameters import MAX_TOOLS_CHARS, tools_value
from orin_llm_node.processing.grounding import check_detect, grounding_prompt
from orin_llm_node.processing.tools import check_tool_choice, tool_names

# The keys that shape an answer (SamplingParams allows one of them per answer).
SHAPING = ('response_format', 'tools', 'detect')


def _reason(check, v):
    try:
        check(v)
    except ValueError as exc:
        return str(exc)
    return None


def request_text(envelope):
    """The prompt of a checked envelope, taken out of it (``''``: none).

    ``detect`` without a prompt asks the engine's grounding prompt (``response/info`` shows
    it); ``tool_results`` without one add no user message: the model answers the results.
    """
    text = envelope.pop('prompt', None)
    if text is None and 'detect' in envelope:
        return grounding_prompt(envelope['detect'])
    return text or ''


def check_tools_key(v):
    """Why an envelope's ``tools`` is refused, or None (shapes, size, schemas compiled)."""
    size = len(json.dumps(v, ensure_ascii=False))
    if size > MAX_TOOLS_CHARS:
        return f'tools are too long ({size} characters of JSON, limit {MAX_TOOLS_CHARS})'
    return _reason(check_tool_schemas, v)


def check_tool_choice_key(v):
    """Why an envelope's ``tool_choice`` is refused on its own, or None (the names: later)."""
    if isinstance(v, (str, dict)):
        return None
    return f'tool_choice must be a string or an object, got {type(v).__name__}'


def check_tool_results_key(v):
    """Why an envelope's ``tool_results`` is refused, or None (their shapes only)."""
    if not isinstance(v, list) or not v:
        return 'tool_results must be a non-empty list of {"id", "content"} objects'
    ids = set()
    for i, result in enumerate(v):
        where = f'tool_results[{i}]'
        if not isinstance(result, dict) or not {'id', 'content'} <= set(result) or (
                set(result) - {'id', 'content', 'name'}):
            return f'{where} must be an object with "id", "content" and optionally "name"'
        for key in result:
            if not isinstance(result[key], str) or (key != 'content' and not result[key]):
                return f'{where}.{key} must be a{"" if key == "content" else " non-empty"} string'
        if result['id'] in ids:
            return f'tool_results answer {result["id"]!r} twice'
        ids.add(result['id'])
    return None


def check_detect_key(v):
    """Why an envelope's ``detect`` is refused on its own, or None."""
    return _reason(check_detect, v)


def check_request(envelope, tools_parameter):
    """``ValueError`` for keys that do not go together (``tools_parameter``: its JSON text).

    ``detect`` with another shaping key or a clip; a ``tool_choice`` for tools not in effect
    (the envelope's, else the parameter's); a result ``name`` that names none of them.
    """
    if 'detect' in envelope:
        others = [k for k in (*SHAPING, 'tool_choice', 'tool_results')
                  if k != 'detect' and k in envelope]
        if others:
            raise ValueError(f'detect cannot be combined with {", ".join(others)} (detect '
                             'shapes the answer as a list of boxes)')
        if envelope.get('video_s', 0) > 0:
            raise ValueError('detect takes single frames (one per camera), not video_s')
        return
    tools = _tools_in_effect(envelope, tools_parameter)
    if 'tool_choice' in envelope:
        check_tool_choice(envelope['tool_choice'], tools)
    names = tool_names(tools or [])
    for i, result in enumerate(envelope.get('tool_results', [])):
        if 'name' in result and result['name'] not in names:
            raise ValueError(f'tool_results[{i}] names {result["name"]!r}, which is not a '
                             f'declared tool ({", ".join(names) or "no tools"})')


def _tools_in_effect(envelope, tools_parameter):
    if 'tools' in envelope or any(k in envelope for k in SHAPING):
        return check_tool_schemas(envelope.get('tools'))
    return check_tool_schemas(tools_value(tools_parameter))


def request_sampling(sampling, envelope, overrides):
    """The parameters' ``sampling`` with the envelope's ``overrides`` and shape applied.

    ``overrides``: the envelope's ``SamplingParams`` fields (request_envelope's
    ``sampling_overrides``). An envelope's shaping key replaces whatever the parameters shape
    (``response_format`` or ``tools``), so a request that asks for boxes or its own format
    never gets the tools parameter; ``tool_choice`` applies to the tools in effect.
    """
    fields = {k: v for k, v in overrides.items() if k not in SHAPING}
    shaped = {k: envelope[k] for k in SHAPING if k in envelope}
    if shaped:
        fields.update({'response_format': None, 'tools': None, 'tool_choice': None, **shaped})
    if 'tool_choice' in envelope:
        fields['tool_choice'] = envelope['tool_choice']
    return replace(sampling, **fields) if fields else sampling


def engine_results(results, pending):
    """The engine's ``tool_results`` (``[{"id", "content"}]``) of an envelope's ``results``.

    ``pending``: the calls of the conversation's last answer (OpenAI ``tool_calls`` entries).
    ``ValueError`` when a result's ``name`` is not the name of the call its ``id`` answers;
    an ``id`` that answers no call is the engine's refusal.
    """
    called = {c['id']: c['function']['name'] for c in pending}
    for i, result in enumerate(results):
        name = called.get(result['id'])
        if 'name' in result and name is not None and result['name'] != name:
            raise ValueError(f'tool_results[{i}] names {result["name"]!r}, but call '
                             f'{result["id"]!r} called {name!r}')
    return [{'id': r['id'], 'content': r['content']} for r in results]
