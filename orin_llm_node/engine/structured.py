# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Constrained decoding: ``response_format`` checks, grammars and per-token bitmasks.

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
"""

import json

import numpy as np
import torch

from orin_llm_node.bounded_json import MAX_DEPTH, depth, too_deep

__all__ = [
    "RESPONSE_FORMAT_TYPES",
    "Grammar",
    "GrammarTokenizer",
    "StructuredUnavailable",
    "check_grammar",
    "check_response_format",
    "parse_answer",
    "apply_bitmask",
    "host_bitmask",
    "structured_available",
]

RESPONSE_FORMAT_TYPES = ("json_object", "json_schema", "regex")
# Keys each type takes besides "type" (required ones first; json_schema's "name"/"strict" are
# OpenAI's, accepted and ignored so that an OpenAI-style request works unchanged).
_KEYS = {"json_object": ((), ()), "json_schema": (("schema",), ("name", "strict")),
         "regex": (("pattern",), ())}
INSTALL_HINT = "pip install llguidance (see requirements/runtime.txt)"


class StructuredUnavailable(ValueError):
    """A constrained request while the structured-generation library is not installed."""


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
        raise ValueError(f"response_format must be an object, got {type(fmt).__name__}")
    if depth(fmt) > MAX_DEPTH:  # the library's limit; a far deeper dict crashes its converter
        raise ValueError(f"response_format is {too_deep()}")
    kind = fmt.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise ValueError(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}"
                         f", got {kind!r}")
    required, optional = _KEYS[kind]
    unknown = sorted(set(fmt) - {"type", *required, *optional})
    if unknown:
        raise ValueError(f"response_format of type {kind} takes no key {', '.join(unknown)}")
    for key in required:
        if key not in fmt:
            raise ValueError(f"response_format of type {kind} needs {key!r}")
    if kind == "json_schema" and not isinstance(fmt["schema"], dict):
        raise ValueError("response_format.schema must be a JSON Schema object")
    if kind == "regex" and (not isinstance(fmt["pattern"], str) or not fmt["pattern"]):
        raise ValueError("response_format.pattern must be a non-empty string")
    return fmt


def parse_answer(fmt: dict, text: str):
    """The parsed JSON of a complete json answer (``None`` for a regex answer or bad JSON)."""
    if fmt["type"] == "regex":
        return None
    try:
        return json.loads(text)
    except ValueError:
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
    return logits.masked_fill(bits.reshape(-1)[:logits.shape[-1]] == 0, float("-inf"))


def host_bitmask(vocab_size: int, allowed=None, banned=()) -> np.ndarray:
    """An int32 bitmask ``[ceil(V / 32)]``: ``allowed`` ids (all when None) less ``banned``."""
    flags = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    if allowed is None:
        flags[:vocab_size] = True
    else:
        flags[list(allowed)] = True
    flags[list(banned)] = False
    return np.packbits(flags.reshape(-1, 32), axis=1, bitorder="little").view(np.int32)[:, 0]


def _grammar_text(matcher_class, fmt: dict) -> str:
    # The library's grammar for a checked response_format.
    if fmt["type"] == "regex":
        return matcher_class.grammar_from_regex(fmt["pattern"])
    schema = fmt["schema"] if fmt["type"] == "json_schema" else {"type": "object"}
    return matcher_class.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})


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
            f"constrained decoding needs llguidance, which is not installed: {INSTALL_HINT}"
        ) from None
    m = llguidance.LLMatcher
    error = m.validate_grammar(_grammar_text(m, fmt))
    if error:
        raise ValueError(f"response_format rejected: {error}")


class GrammarTokenizer:
    """The library's view of a checkpoint's tokenizer (built once per engine, ~1-3 s at 151k).

    ``tokenizer_json``: the checkpoint's ``tokenizer.json``; ``vocab_size``: the logits'
    width (it may exceed the tokenizer's: the extra ids are never allowed); ``stop_ids``: the
    tokens that end an answer (allowed once the grammar is complete).
    """

    def __init__(self, tokenizer_json, vocab_size: int, stop_ids):
        try:
            import llguidance
        except ImportError:
            raise StructuredUnavailable(
                f"constrained decoding needs llguidance, which is not installed: {INSTALL_HINT}"
            ) from None
        self._ll = llguidance
        self.vocab_size = vocab_size
        self.stop_ids = tuple(stop_ids)
        self.tokenizer = llguidance.LLTokenizer(str(tokenizer_json), n_vocab=vocab_size,
                                                eos_token=list(self.stop_ids))

    def grammar(self, fmt: dict) -> "Grammar":
        """A fresh matcher for ``fmt`` (compiled now, ~1 ms); ``ValueError`` if it is invalid.

        JSON answers are compact (no whitespace between tokens): fewer tokens, and no room for
        a model to pad an answer with blank lines until it runs out of tokens.
        """
        m = self._ll.LLMatcher
        matcher = m(self.tokenizer, _grammar_text(m, fmt), log_level=0)
        if matcher.is_error():
            raise ValueError(f"response_format rejected: {matcher.get_error()}")
        return Grammar(matcher, self.vocab_size)


class Grammar:
    """One answer's matcher: fills the next token's bitmask, advances by the sampled token."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.words = -(-vocab_size // 32)

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed next tokens into ``out`` (int32 ``[ceil(V / 32)]``, contiguous)."""
        if out.dtype != np.int32 or out.shape != (self.words,) or not out.flags.c_contiguous:
            raise ValueError(f"bitmask must be contiguous int32 [{self.words}]")
        # Written in place (the library drops the GIL meanwhile); no copy.
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def accept(self, token: int) -> None:
        """Advance by ``token`` (one the last mask allowed)."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar refused token {token}: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The grammar has accepted a whole answer and its stop token."""
        return self.matcher.is_stopped() and not self.matcher.is_error()
