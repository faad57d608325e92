# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Constrained decoding: ``response_format`` checks, grammars and per-token bitmasks.

The one owner of the structured-generation library, **llguidance** (MIT, no dependencies, one
``abi3`` wheel for every Python >= 3.10 on aarch64 and x86_64). It was chosen by measurement
against xgrammar 0.2.8 and outlines-core 0.2.14 at Qwen3-VL's 151,936-token vocabulary
(``bench/structured_libraries.py``): xgrammar masks faster but imports transformers and needs
torch >= 1.10, pydantic, apache-tvm-ffi (and triton on x86_64) at run time; outlines-core
compiles a schema in 1-35 s and cannot express an object of any depth; llguidance compiles in
about a millisecond and fills a mask in ~0.02 ms (p99 < 0.1 ms).

The library is optional: without it the engine runs as before and refuses a constrained
request with :class:`StructuredUnavailable` (a ``ValueError``) naming the package to install.

A mask is the xgrammar / llguidance layout: int32 words, bit ``i % 32`` of word ``i // 32``
set when token ``i`` is allowed; :func:`apply_bitmask` masks logits with it in torch ops a
CUDA graph can hold. The grammar also decides the end of the answer: the stop tokens are
allowed exactly when the grammar is complete.

What the library lets through is checked here, so that a constrained answer that ends with a
stop token is always a complete, valid one:

* refused when compiled (``ValueError``, one sentence; the library's detail goes to the log):
  a grammar the library rejects or cannot build within its limits, one that matches no text
  at all (a ``$ref`` to itself, ``[^\s\S]``), and one that spells a control token's text
  (``<|im_end|>``, ``<|image_pad|>``, ...): the library would offer that token's id where
  the grammar forces the text, and no answer can hold it;
* during an answer, a mask never offers a control or vision token, nor a stop token before
  the grammar is complete; when nothing is left, :class:`GrammarDeadEnd` says why.
"""

import json
import logging
import math
import re
import sys

import numpy as np
import torch

from orin_llm_node.bounded_json import MAX_DEPTH, depth, too_deep

__all__ = [
    'RESPONSE_FORMAT_TYPES',
    'Grammar',
    'GrammarDeadEnd',
    'GrammarTokenizer',
    'StructuredUnavailable',
    'check_grammar',
    'check_response_format',
    'parse_answer',
    'apply_bitmask',
    'host_bitmask',
    'structured_available',
]

RESPONSE_FORMAT_TYPES = ('json_object', 'json_schema', 'regex')
# Keys each type takes besides "type" (required ones first; json_schema's "name"/"strict" are
# OpenAI's, accepted and ignored so that an OpenAI-style request works unchanged).
_KEYS = {'json_object': ((), ()), 'json_schema': (('schema',), ('name', 'strict')),
         'regex': (('pattern',), ())}
INSTALL_HINT = 'pip install llguidance (see requirements/runtime.txt)'
# Longest library detail written to the log for one refusal (its dumps echo the whole grammar).
LOG_DETAIL_CHARS = 2000
# Schema keywords that only annotate: their text never reaches an answer.
_ANNOTATIONS = frozenset(('title', 'description', '$comment', 'examples', 'default'))

log = logging.getLogger(__name__)


class StructuredUnavailable(ValueError):
    """A constrained request while the structured-generation library is not installed."""


class GrammarDeadEnd(RuntimeError):
    """No token can continue a constrained answer; ``str()`` is one sentence saying why."""


def structured_available() -> bool:
    """Whether llguidance imports (constrained decoding works)."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def check_response_format(fmt) -> dict | None:
    """``fmt`` checked for shape (``None`` / empty: unconstrained); ``ValueError`` says why.

    ``{"type": "json_object"}``, ``{"type": "json_schema", "schema": {...}}`` or
    ``{"type": "regex", "pattern": "..."}``. The schema's own validity is the library's
    verdict, given when the grammar is compiled (:meth:`GrammarTokenizer.grammar`).
    """
    if fmt is None or fmt == {}:
        return None
    if not isinstance(fmt, dict):
        raise ValueError(f'response_format must be an object, got {type(fmt).__name__}')
    if depth(fmt) > MAX_DEPTH:  # the library's limit; a far deeper dict crashes its converter
        raise ValueError('response_format rejected: the schema nests too deeply for the '
                         f'constrained decoder ({too_deep()})')
    kind = fmt.get('type')
    if kind not in RESPONSE_FORMAT_TYPES:
        raise ValueError(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}"
                         f", got {kind!r}")
    required, optional = _KEYS[kind]
    unknown = sorted(set(fmt) - {'type', *required, *optional})
    if unknown:
        raise ValueError(f"response_format of type {kind} takes no key {', '.join(unknown)}")
    for key in required:
        if key not in fmt:
            raise ValueError(f'response_format of type {kind} needs {key!r}')
    if kind == 'json_schema' and not isinstance(fmt['schema'], dict):
        raise ValueError('response_format.schema must be a JSON Schema object')
    if kind == 'regex' and (not isinstance(fmt['pattern'], str) or not fmt['pattern']):
        raise ValueError('response_format.pattern must be a non-empty string')
    return fmt


def parse_answer(fmt: dict, text: str):
    """The parsed JSON of a complete json answer (``None`` for a regex answer).

    Every value is one strict JSON can carry: a number beyond a 64-bit float's range (an
    unbounded ``"number"`` may come back as ``1e999``) or an integer too long for Python to
    convert is ``None`` (JSON null), where ``json.loads`` would give ``inf`` or raise; ``text``
    keeps the digits as written. ``ValueError`` when the answer cannot be parsed at all (a JSON
    nesting deeper than Python's parser goes).
    """
    if fmt['type'] == 'regex':
        return None
    try:
        return json.loads(text, parse_float=_finite_float, parse_int=_int_or_none)
    except RecursionError:
        raise ValueError("the answer is valid JSON but nests deeper than Python's JSON parser "
                         f"goes ({sys.getrecursionlimit()} levels)") from None


def _finite_float(literal: str):
    value = float(literal)
    return value if math.isfinite(value) else None


def _int_or_none(literal: str):
    try:
        return int(literal)
    except ValueError:  # more digits than sys.get_int_max_str_digits() converts
        return None


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                  shifts: torch.Tensor | None = None) -> torch.Tensor:
    """``logits [V]`` with the ids not allowed by ``bitmask`` (int32 ``[ceil(V / 32)]``) at -inf.

    Four kernels of fixed shape and no host read: a CUDA graph captures them once and applies
    whatever mask is written into ``bitmask`` before each replay. ``shifts``: a static
    ``arange(32)`` (int32, on the device) for graphs; made here when None.
    """
    if shifts is None:
        shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(bitmask.unsqueeze(1), shifts), 1)
    return logits.masked_fill(bits.reshape(-1)[:logits.shape[-1]] == 0, float('-inf'))


def host_bitmask(vocab_size: int, allowed=None, banned=()) -> np.ndarray:
    """An int32 bitmask ``[ceil(V / 32)]``: ``allowed`` ids (all when None) less ``banned``."""
    flags = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    if allowed is None:
        flags[:vocab_size] = True
    else:
        flags[list(allowed)] = True
    flags[list(banned)] = False
    return np.packbits(flags.reshape(-1, 32), axis=1, bitorder='little').view(np.int32)[:, 0]


def _grammar_text(matcher_class, fmt: dict) -> str:
    # The library's grammar for a checked response_format.
    if fmt['type'] == 'regex':
        return matcher_class.grammar_from_regex(fmt['pattern'])
    schema = fmt['schema'] if fmt['type'] == 'json_schema' else {'type': 'object'}
    return matcher_class.grammar_from_json_schema(schema, defaults={'whitespace_flexible': False})


def check_grammar(fmt: dict) -> None:
    """``ValueError`` with the library's reason when the grammar of ``fmt`` does not compile.

    For checks made without a checkpoint at hand (the node's start-up, ``orin_llm_check``, a
    request on arrival): the library validates the grammar without a vocabulary. An answer
    compiles it against the checkpoint's vocabulary (:meth:`GrammarTokenizer.grammar`), which
    may refuse more. ``fmt``: a value :func:`check_response_format` passed;
    :class:`StructuredUnavailable` without the library.
    """
    try:
        import llguidance
    except ImportError:
        raise StructuredUnavailable(
            f'constrained decoding needs llguidance, which is not installed: {INSTALL_HINT}'
        ) from None
    m = llguidance.LLMatcher
    try:
        error = m.validate_grammar(_grammar_text(m, fmt))
    except (ValueError, TypeError) as exc:  # the library's own checks
        error = str(exc)
    if error:
        # No log of the library's detail here: this check runs before the value is taken (the
        # command-line check prints only the one line); an answer's compile logs it.
        what = 'regex' if fmt['type'] == 'regex' else 'schema'
        raise ValueError('response_format rejected: '
                         f'{_library_reason(what, error, log_detail=False)}') from None


class GrammarTokenizer:
    """The library's view of a checkpoint's tokenizer (built once per engine, ~1-3 s at 151k).

    ``tokenizer_json``: the checkpoint's ``tokenizer.json``; ``vocab_size``: the logits'
    width (it may exceed the tokenizer's: the extra ids are never allowed); ``stop_ids``: the
    tokens that end an answer (allowed once the grammar is complete); ``banned_ids``: tokens no
    answer may hold besides the tokenizer's special ones (the engine's vision placeholders).
    """

    def __init__(self, tokenizer_json, vocab_size: int, stop_ids, banned_ids=()):
        try:
            import llguidance
        except ImportError:
            raise StructuredUnavailable(
                f'constrained decoding needs llguidance, which is not installed: {INSTALL_HINT}'
            ) from None
        self._ll = llguidance
        self.vocab_size = vocab_size
        self.stop_ids = tuple(stop_ids)
        self.tokenizer = llguidance.LLTokenizer(str(tokenizer_json), n_vocab=vocab_size,
                                                eos_token=list(self.stop_ids))
        # The library's special tokens can never be consumed as answer text (it marks their
        # bytes), yet it offers one where a grammar forces its text: they, the ids past the
        # tokenizer's vocabulary and the banned ones are never in a mask (the stop tokens are,
        # once the grammar is complete).
        tok = self.tokenizer
        control = {i for i in range(vocab_size) if tok.is_special_token(i)} | set(banned_ids)
        never = control - set(self.stop_ids)
        self.answer_words = host_bitmask(vocab_size, banned=never)
        # Their text, which a grammar may not spell (ids without text read "<[id]>").
        names = (tok.decode_bytes([i]).decode('utf-8', 'replace')
                 for i in sorted(control | set(self.stop_ids)))
        self.control_texts = tuple(sorted(
            {n for n in names if n and not re.fullmatch(r'<\[\d+\]>', n)}))

    def grammar(self, fmt: dict) -> 'Grammar':
        """A fresh matcher for ``fmt`` (compiled now, ~1 ms); ``ValueError`` if it is invalid.

        Refused with one sentence (the library's detail is logged): a grammar the library
        rejects or cannot build within its limits, one that matches no text, one that spells a
        control token (module docstring). JSON answers are compact (no whitespace between
        tokens): fewer tokens, and no room for a model to pad an answer with blank lines until
        it runs out of tokens.
        """
        what = 'regex' if fmt['type'] == 'regex' else 'schema'
        spelt = self._control_text(fmt)
        if spelt is not None:
            raise ValueError(f'response_format rejected: the {what} spells the control token '
                             f'{spelt!r}, which no answer can hold as text')
        m = self._ll.LLMatcher
        try:
            matcher = m(self.tokenizer, _grammar_text(m, fmt), log_level=0)
        except (ValueError, TypeError) as exc:  # the library's own checks
            raise ValueError(f'response_format rejected: {_library_reason(what, str(exc))}'
                             ) from None
        if matcher.is_error():
            raise ValueError(f'response_format rejected: '
                             f'{_library_reason(what, matcher.get_error())}')
        grammar = Grammar(matcher, self.vocab_size, self.stop_ids, self.answer_words, what)
        try:  # the first mask: a grammar that matches no text has nothing to offer
            grammar.fill_bitmask(np.empty(grammar.words, dtype=np.int32))
        except GrammarDeadEnd as exc:
            raise ValueError(f'response_format rejected: {exc}') from None
        return grammar

    def lark(self, text: str, what: str, place_ids=()) -> 'Grammar':
        """A fresh matcher for one of the engine's own lark grammars (e.g. a tool call's).

        ``place_ids``: control-like tokens the grammar places itself (``<[id]>``), the only
        ones besides the stop tokens its masks may offer. ``ValueError`` with the library's
        reason for ``what`` (one sentence; the detail is logged) when it refuses the grammar.
        """
        m = self._ll.LLMatcher
        try:
            matcher = m(self.tokenizer, text, log_level=0)
        except (ValueError, TypeError) as exc:  # the library's own checks
            raise ValueError(_library_reason(what, str(exc))) from None
        if matcher.is_error():
            raise ValueError(_library_reason(what, matcher.get_error()))
        words = self.answer_words | host_bitmask(self.vocab_size, allowed=place_ids)
        return Grammar(matcher, self.vocab_size, self.stop_ids, words, what)

    def _control_text(self, fmt: dict) -> str | None:
        # The first control token whose text the grammar spells: in any string of the schema
        # that can shape an answer, or in a pattern read as literal text (escapes and
        # one-character classes such as ``[|]`` resolved). Literal spellings only: one the
        # library still forces is a dead end when reached (Grammar.fill_bitmask).
        if fmt['type'] == 'regex':
            strings = [fmt['pattern']]
        elif fmt['type'] == 'json_schema':
            strings = _schema_strings(fmt['schema'])
        else:
            return None
        text = '\0'.join(strings)
        text += '\0' + re.sub(r'\\(\W)', r'\1', re.sub(r'\[(\\?[^\]\\])\]', r'\1', text))
        return next((name for name in self.control_texts if name in text), None)


def _schema_strings(schema) -> list[str]:
    # Every key and string value of a JSON Schema but the annotations' (iterative: a schema
    # may nest deeper than Python's recursion limit).
    strings, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key not in _ANNOTATIONS:
                    strings.append(str(key))
                    stack.append(value)
    return strings


# The library's messages for the limits a grammar can hit, by the words that name them.
_LIMITS = (
    ('too many expressions', "the {what} is too big: its regular expressions expand beyond "
                             "the constrained decoder's limit"),
    ('too big', "the {what} is too large: its grammar is beyond the constrained decoder's "
                "size limit"),
    ('recursion limit', 'the {what} nests too deeply for the constrained decoder'),
)
# How the library's message starts when a grammar admits no text from where it stands.
_NO_EXTENSION = 'NoExtension'


def _library_reason(what: str, detail: str, log_detail: bool = True) -> str:
    """One sentence (at most ~200 characters) for the library's ``detail`` on a ``what``.

    The limits are named in our words; a parse error keeps the library's own line for it
    (``unclosed group``); anything else keeps its first line, cut short. The whole ``detail``
    (the library's parser-state dumps run to hundreds of characters and echo the grammar)
    goes to the log.
    """
    if log_detail:
        log.warning('llguidance on a response_format %s: %s', what,
                    _cut(detail, LOG_DETAIL_CHARS))
    head = detail.split('<state>', 1)[0]  # what follows is the parser's state and the grammar
    for words, sentence in _LIMITS:
        if words in head:
            return sentence.format(what=what)
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    if not lines:
        return f'the library refused the {what}'
    if 'regex parse error' in head:
        said = next((line for line in lines if line.startswith('error:')), lines[0])
        subject = 'the regex' if what == 'regex' else 'a regular expression in the schema'
        return _cut(f"{subject} does not parse: {said.removeprefix('error:').strip()}", 200)
    return _cut(f'the library refused the {what}: {lines[0]}', 200)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + '...'


class Grammar:
    """One answer's matcher: fills the next token's bitmask, advances by the sampled token.

    ``answer_words``: the bitmask of the ids an answer may ever hold (every mask is cut to
    it); ``stop_ids``: the ids the library offers when the grammar is complete; ``what``:
    ``"regex"`` or ``"schema"``, for the sentences of :class:`GrammarDeadEnd`.
    """

    def __init__(self, matcher, vocab_size: int, stop_ids, answer_words: np.ndarray,
                 what: str):
        self.matcher = matcher
        self.words = -(-vocab_size // 32)
        self._stop_bits = [(i >> 5, 1 << (i & 31)) for i in stop_ids]  # (word, bit)
        self.answer_words = answer_words
        self.what = what
        self.num_tokens = 0  # accepted so far

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed next tokens into ``out`` (int32 ``[ceil(V / 32)]``, contiguous).

        :class:`GrammarDeadEnd` when no token is allowed.
        """
        if out.dtype != np.int32 or out.shape != (self.words,) or not out.flags.c_contiguous:
            raise ValueError(f'bitmask must be contiguous int32 [{self.words}]')
        # Written in place (the library drops the GIL meanwhile); no copy.
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        np.bitwise_and(out, self.answer_words, out=out)
        # A stop token is only right once the grammar is complete; before that, the library
        # offers one where the grammar cannot go on (and refuses it when it is consumed).
        bits = out.view(np.uint32)
        offered = [(w, b) for w, b in self._stop_bits if bits.item(w) & b]
        if offered and not self.matcher.is_accepting():
            for w, b in offered:
                bits[w] &= ~np.uint32(b)
        if not np.count_nonzero(out):
            raise GrammarDeadEnd(self._dead_end())

    def _dead_end(self, consuming: bool = False) -> str:
        # Why no token can go on (``consuming``: the library failed on the token given to
        # accept): its verdict when it has one, else a forced text that only a control token
        # (or no token of the vocabulary) spells.
        n = self.num_tokens
        if consuming:
            where = f"on the answer's token {n + 1}"
        else:
            where = ('at its start' if not n else "after the answer's first token" if n == 1
                     else f"after the answer's first {n} tokens")
        if self.matcher.is_error():
            detail = self.matcher.get_error()
            if not detail.startswith(_NO_EXTENSION):
                return f'{_library_reason(self.what, detail)} ({where})'
            log.warning('llguidance on a response_format %s: %s', self.what,
                        _cut(detail, LOG_DETAIL_CHARS))
            if self.what == 'regex':
                return f"the regex matches no text {'at all' if not n else where}"
            return (f"the schema admits no JSON value {'at all' if not n else where}"
                    " (e.g. a $ref that only leads back to itself: the recursion never ends)")
        return (f'the {self.what} allows no token {where}: what it asks for next is spelt '
                'only by a control token, or by no token of the vocabulary')

    def accept(self, token: int) -> None:
        """Advance by ``token`` (one the last mask allowed).

        :class:`GrammarDeadEnd` when the library fails on it (a limit it reaches only then,
        e.g. a regex that expands beyond its bounds).
        """
        if not self.matcher.consume_token(token):
            raise GrammarDeadEnd(self._dead_end(consuming=True))
        self.num_tokens += 1

    @property
    def complete(self) -> bool:
        """The grammar has accepted a whole answer and its stop token."""
        return self.matcher.is_stopped() and not self.matcher.is_error()
