# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Tool calls in Qwen3-VL's hermes format, decoded so that every call is valid.

The format (the checkpoint's chat template): a call is the ``<tool_call>`` token, a newline,
``{"name": <a declared name>, "arguments": <an object>}``, a newline and ``</tool_call>``;
several calls follow each other, one per line. Decoding stays free until the model picks the
``<tool_call>`` token (``tool_choice="auto"``); from there to ``</tool_call>`` a grammar allows
only a call of a declared tool whose arguments follow that tool's schema, then decoding is
free again. ``"required"`` (or a named tool) holds the whole answer to calls from its first
token, and ``"none"`` never lets ``<tool_call>`` be picked.

The trigger is the sampler's, not the library's: while free, the mask allows every token (the
sampler's own bans aside), so an answer that opens no call is token for token the
unconstrained one. The JSON inside a call is written as the template writes a call's arguments
(``", "`` and ``": "`` separators, no other whitespace): a model sees its own calls in the
history as it was trained on them.
"""

import json
import secrets

import numpy as np

from orin_llm_node.processing.tools import check_tools, spelt_token, tool_names, tool_schema

from .structured import check_grammar, host_bitmask, parse_answer

__all__ = ['OPEN', 'CLOSE', 'ToolCalls', 'check_tool_schemas', 'order_results']

OPEN, CLOSE = '<tool_call>', '</tool_call>'
# How the template writes a call's arguments (tojson: json.dumps' separators, no indent).
_JSON_STYLE = {'item_separator': ', ', 'key_separator': ': ', 'whitespace_flexible': False}


def _lark_string(text: str) -> str:
    # A lark string literal of ``text`` (names are [A-Za-z0-9_-]: only the quotes need escapes).
    return json.dumps(text)


def call_grammar(tools: list[dict], names, open_id: int, close_id: int,
                 whole_answer: bool) -> str:
    """The lark grammar of one call (``whole_answer``: of an answer of calls, one per line)."""
    rules = []
    for i, name in enumerate(names):
        schema = dict(tool_schema(tools, name), **{'x-guidance': _JSON_STYLE})
        head = _lark_string(f'{{"name": "{name}", "arguments": ')
        rules.append(f'f{i}: {head} a{i} "}}"\na{i}: %json {json.dumps(schema)}')
    start = 'call ("\\n" call)*' if whole_answer else 'call'
    body = ' | '.join(f'f{i}' for i in range(len(names)))
    return '\n'.join(['%llguidance {}', f'start: {start}',
                      f'call: <[{open_id}]> "\\n" body "\\n" <[{close_id}]>',
                      f'body: {body}', *rules]) + '\n'


def check_tool_schemas(tools) -> list[dict] | None:
    """``tools`` checked without a checkpoint at hand (a parameter, a request on arrival).

    The shapes, then every tool's schema compiled by the library without a vocabulary, as
    ``structured.check_grammar`` does for a response format; ``ValueError`` names the tool.
    A turn (``ToolCalls``) compiles against the checkpoint's vocabulary, which may refuse more.
    """
    tools = check_tools(tools)
    for name in tool_names(tools or []):
        try:
            check_grammar({'type': 'json_schema', 'schema': tool_schema(tools, name)})
        except ValueError as exc:
            reason = str(exc).removeprefix('response_format rejected: ')
            raise ValueError(f'tools rejected: the parameters of tool {name!r}: {reason}'
                             ) from None
    return tools


class ToolCalls:
    """One answer's tool-call decoding: the sampler's grammar, and the calls it produced.

    ``tools``/``choice``: checked (``processing.tools``); ``grammar_tokenizer``: the engine's
    ``structured.GrammarTokenizer``; ``tokenizer``: the checkpoint's (``processing.Tokenizer``),
    which must have the ``<tool_call>`` and ``</tool_call>`` tokens. Constructing it compiles
    every tool's grammar once: ``ValueError`` names a tool whose schema the library refuses.
    The sampler treats it as a grammar (``fill_bitmask``, ``accept``).
    """

    def __init__(self, tools: list[dict], choice, grammar_tokenizer, tokenizer):
        ids = {t: tokenizer.added_token_id(t) for t in (OPEN, CLOSE)}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f'this checkpoint cannot call tools: its tokenizer has no '
                             f'{" or ".join(missing)} token')
        spelt = spelt_token(tools, tokenizer.added_texts)
        if spelt is not None:
            raise ValueError(f'tools rejected: they spell the token {spelt!r}, which the '
                             'prompt cannot hold as text')
        self.open_id, self.close_id = ids[OPEN], ids[CLOSE]
        self.mode = choice.mode
        self._decode = tokenizer.decode
        self._compile_with = grammar_tokenizer
        self._tools, self._names = tools, choice.names
        for name in tool_names(tools):  # a refusal names the tool
            try:
                self._compile([name], whole_answer=False)
            except ValueError as exc:
                raise ValueError(f'tools rejected: the parameters of tool {name!r}: {exc}'
                                 ) from None
        vocab = grammar_tokenizer.vocab_size
        self._free = host_bitmask(vocab, banned=[self.open_id] if self.mode == 'none' else ())
        self._grammar = self._compile(self._names, True) if self.mode == 'required' else None
        self._tokens: list[int] = []
        self._open_at = None  # index in _tokens of the open call's <tool_call>
        self._spans: list[tuple[int, int]] = []  # (first, last) token of each closed call

    def _compile(self, names, whole_answer):
        text = call_grammar(self._tools, names, self.open_id, self.close_id, whole_answer)
        return self._compile_with.lark(text, 'tool call', place_ids=(self.open_id, self.close_id))

    # ---- the sampler's grammar interface -------------------------------------------------

    def fill_bitmask(self, out: np.ndarray) -> None:
        """The next token's mask: a call's grammar inside one (or throughout), else free."""
        if self._grammar is not None:
            self._grammar.fill_bitmask(out)
        else:
            out[:] = self._free

    def accept(self, token: int) -> None:
        """Advance by the token just added to the answer."""
        if self._grammar is None and token == self.open_id:  # the model opens a call
            self._grammar = self._compile(self._names, False)
        if self._grammar is not None:
            self._grammar.accept(token)
        self._tokens.append(token)
        if token == self.open_id:
            self._open_at = len(self._tokens) - 1
        elif token == self.close_id and self._open_at is not None:
            self._spans.append((self._open_at, len(self._tokens) - 1))
            self._open_at = None
            if self.mode == 'auto':
                self._grammar = None

    # ---- the answer's calls ----------------------------------------------------------------

    def calls(self) -> list[dict]:
        """``[{id, name, arguments}]`` of every closed call, in order (``arguments``: a dict)."""
        out = []
        for first, last in self._spans:
            call = parse_answer({'type': 'json_object'},
                                self._decode(self._tokens[first + 1:last]).strip())
            out.append({'id': f'call_{secrets.token_hex(12)}', 'name': call['name'],
                        'arguments': call['arguments']})
        return out

    def ends_on_calls(self, stop_ids) -> bool:
        """Whether the answer's last call closes it (only whitespace and a stop token after)."""
        if not self._spans:
            return False
        tail = [t for t in self._tokens[self._spans[-1][1] + 1:] if t not in stop_ids]
        return not self._decode(tail).strip()

    def content(self) -> str:
        """The answer's text outside its calls (what OpenAI's ``content`` holds), stripped."""
        pieces, start = [], 0
        for first, last in self._spans:
            pieces.append(self._tokens[start:first])
            start = last + 1
        pieces.append(self._tokens[start:])
        return '\n'.join(t for t in (self._decode(p).strip() for p in pieces) if t)


def order_results(results, pending: list[dict]) -> list[tuple[str, object]]:
    """``tool_results`` checked against the calls they answer, as ``(id, content)`` in call order.

    ``results``: ``[{"id": ..., "content": text or [parts]}]``; ``pending``: the calls of the
    conversation's last answer (``Conversation.pending_tool_calls``). The template renders tool
    responses without ids, in order, so they follow the calls' order whatever the results'.
    ``ValueError`` for a result of no pending call, a call answered twice, a bad shape.
    """
    if not isinstance(results, (list, tuple)) or not results:
        raise ValueError('tool_results must be a non-empty list of {"id", "content"} objects')
    order = {call['id']: i for i, call in enumerate(pending)}
    seen = {}
    for i, result in enumerate(results):
        if not isinstance(result, dict) or set(result) != {'id', 'content'}:
            raise ValueError(f'tool_results[{i}] must be an object with exactly "id" and '
                             '"content"')
        call_id = result['id']
        if call_id not in order:
            known = ', '.join(order) or 'none'
            raise ValueError(f'tool_results[{i}] answers {call_id!r}, which is not a call of '
                             f'the last answer (its calls: {known})')
        if call_id in seen:
            raise ValueError(f'tool_results answer {call_id!r} twice')
        content = result['content']
        if not isinstance(content, (str, list, tuple)):
            raise ValueError(f'tool_results[{i}].content must be text or a list of parts, got '
                             f'{type(content).__name__}')
        seen[call_id] = content
    return sorted(seen.items(), key=lambda item: order[item[0]])
