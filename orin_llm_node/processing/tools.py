# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Tool definitions and tool choices as a request gives them (OpenAI function shapes).

A tool is ``{"type": "function", "function": {"name", "description", "parameters"}}`` or the
bare function object, which is wrapped so: the chat template renders the wrapped form, as the
published Qwen3-VL checkpoints were trained on it (``apply_chat_template(..., tools=...)``
with the same list renders the same text). ``parameters`` is the JSON Schema of the call's
``arguments`` object; a tool without one takes an empty object.

A tool choice is ``"auto"`` (the model decides), ``"required"`` (the answer is calls only),
``"none"`` (no call) or a named tool (``{"name": ...}`` or OpenAI's ``{"type": "function",
"function": {"name": ...}}``): the answer is calls of that tool only.

Everything here checks shapes only; the engine compiles each tool's schema into the grammar of
its calls (``engine/tool_calls.py``), which refuses a schema the library cannot take.
"""

import json
import re

from orin_llm_node.bounded_json import MAX_DEPTH, depth, too_deep

__all__ = ['TOOL_CHOICES', 'ToolChoice', 'check_tool_choice', 'check_tools', 'spelt_token',
           'tool_names', 'tool_schema']

TOOL_CHOICES = ('auto', 'required', 'none')
# OpenAI's rule for function names; it also keeps a name a plain string in the call's JSON.
_NAME = re.compile(r'[A-Za-z0-9_-]{1,64}')
_FUNCTION_KEYS = frozenset(('name', 'description', 'parameters', 'strict'))
_EMPTY_ARGUMENTS = {'type': 'object', 'properties': {}, 'additionalProperties': False}


class ToolChoice:
    """A checked tool choice: ``mode`` (``auto`` / ``required`` / ``none``) and ``names``.

    ``names``: the tools a call may name (every declared tool, or the one a named choice
    gives; a named choice is ``required`` with one name).
    """

    __slots__ = ('mode', 'names')

    def __init__(self, mode: str, names: tuple[str, ...]):
        self.mode, self.names = mode, names

    def __repr__(self):
        return f'ToolChoice({self.mode!r}, {self.names!r})'


def check_tools(tools) -> list[dict] | None:
    """``tools`` in the wrapped OpenAI shape (None for none); ``ValueError`` says what is wrong."""
    if tools is None or (isinstance(tools, (list, tuple)) and not tools):
        return None
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f'tools must be a list of function definitions, got '
                         f'{type(tools).__name__}')
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f'tools[{i}]'
        if not isinstance(tool, dict):
            raise ValueError(f'{where} must be an object, got {type(tool).__name__}')
        if 'function' in tool or 'type' in tool:
            if tool.get('type') != 'function':
                raise ValueError(f'{where}.type must be "function", got {tool.get("type")!r}')
            unknown = sorted(set(tool) - {'type', 'function'})
            if unknown:
                raise ValueError(f'{where} takes no key {", ".join(unknown)}')
            function, where = tool.get('function'), f'{where}.function'
        else:
            function, tool = tool, {'type': 'function', 'function': tool}
        _check_function(function, where)
        if function['name'] in seen:
            raise ValueError(f'{where}.name {function["name"]!r} is declared twice')
        seen.add(function['name'])
        out.append(tool)
    return out


def _check_function(function, where: str) -> None:
    if not isinstance(function, dict):
        raise ValueError(f'{where} must be an object, got {type(function).__name__}')
    unknown = sorted(set(function) - _FUNCTION_KEYS)
    if unknown:
        raise ValueError(f'{where} takes no key {", ".join(unknown)}')
    name = function.get('name')
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f'{where}.name must be 1-64 letters, digits, "_" or "-", got {name!r}')
    if not isinstance(function.get('description', ''), str):
        raise ValueError(f'{where}.description must be a string')
    if 'parameters' in function:
        params = function['parameters']
        if not isinstance(params, dict):
            raise ValueError(f'{where}.parameters must be a JSON Schema object')
        if depth(params) > MAX_DEPTH:
            raise ValueError(f'{where}.parameters nests too deeply ({too_deep()})')
        # A call's "arguments" is a JSON object (the template's <args-json-object>).
        if params.get('type', 'object') != 'object':
            raise ValueError(f'{where}.parameters must describe an object ("type": "object"), '
                             f'got type {params.get("type")!r}')


def tool_names(tools: list[dict]) -> tuple[str, ...]:
    """The declared names of checked ``tools``, in order."""
    return tuple(t['function']['name'] for t in tools)


def tool_schema(tools: list[dict], name: str) -> dict:
    """The JSON Schema of the arguments of the tool ``name`` (checked ``tools``)."""
    function = next(t['function'] for t in tools if t['function']['name'] == name)
    return function.get('parameters', _EMPTY_ARGUMENTS)


def check_tool_choice(choice, tools: list[dict] | None) -> ToolChoice | None:
    """The checked ``choice`` for checked ``tools`` (None: no tools, so nothing to choose).

    ``None`` means ``"auto"``. ``ValueError`` for an unknown mode, a named tool that is not
    declared, and any choice but ``"none"`` without tools.
    """
    if tools is None:
        if choice is None or choice == 'none':
            return None
        raise ValueError(f'tool_choice {choice!r} needs tools')
    names = tool_names(tools)
    if choice is None:
        choice = 'auto'
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ValueError(f'tool_choice must be one of {", ".join(TOOL_CHOICES)} or a named '
                             f'tool, got {choice!r}')
        return ToolChoice(choice, names)
    if not isinstance(choice, dict):
        raise ValueError(f'tool_choice must be a string or an object, got '
                         f'{type(choice).__name__}')
    named = choice
    if 'function' in choice or 'type' in choice:
        if choice.get('type') != 'function' or set(choice) - {'type', 'function'}:
            raise ValueError('a named tool_choice is {"name": ...} or {"type": "function", '
                             '"function": {"name": ...}}')
        named = choice.get('function')
    if not isinstance(named, dict) or set(named) != {'name'}:
        raise ValueError('a named tool_choice is {"name": ...} or {"type": "function", '
                         '"function": {"name": ...}}')
    if named['name'] not in names:
        raise ValueError(f'tool_choice names {named["name"]!r}, which is not among the tools '
                         f'({", ".join(names)})')
    return ToolChoice('required', (named['name'],))


def spelt_token(tools: list[dict], token_texts) -> str | None:
    """The first of ``token_texts`` (control and tool tokens) that the tools' JSON spells.

    The template writes the tools into the prompt as the checkpoint's own text: such a string
    would become that token, so a tool could forge the turn structure.
    """
    text = json.dumps(tools, ensure_ascii=False)
    return next((t for t in sorted(token_texts) if t and t in text), None)
