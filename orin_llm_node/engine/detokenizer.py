# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Incremental detokenization that never emits a broken UTF-8 sequence.

Byte-level BPE splits a multi-byte character over several tokens; decoding a prefix that ends
inside such a character yields U+FFFD. The text is held back until the character completes,
decoding only a short window of recent tokens each step (vLLM's prefix/read offsets).
"""

from collections.abc import Callable, Sequence

_REPLACEMENT = '\ufffd'


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas; ``text`` is their concatenation."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ''

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ''
        delta = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a generation: whatever is still held back (may contain U+FFFD)."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ''
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
