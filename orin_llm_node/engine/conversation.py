# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Conversation state: token history in segments (system prompt, turns), image spans, KV blocks.

How a turn's tokens are built from the chat template: ``orin_llm_node.processing.prompt``.
"""

import itertools

from orin_llm_node.processing import ImageRef, PromptPiece

_ids = itertools.count()


class Conversation:
    """One chat's history and the KV blocks holding it (owned by an ``LLMEngine``)."""

    def __init__(self, system_prompt: str | None, system: PromptPiece | None):
        self.id = next(_ids)
        self.system_prompt = system_prompt
        self.segments: list[PromptPiece] = [system or PromptPiece([], [])]
        self.token_ids: list[int] = list(self.segments[0].token_ids)
        # KV state: blocks referenced by this conversation, hashes of its full blocks, and how
        # many leading tokens of token_ids have K/V in those blocks.
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_kv_tokens = 0

    @property
    def num_turns(self) -> int:
        """User turns in the history (the system segment excluded)."""
        return len(self.segments) - 1

    def messages(self) -> list[dict]:
        """HF-style messages of the whole history."""
        return [m for seg in self.segments for m in seg.messages]

    def image_spans(self) -> list[tuple[int, ImageRef]]:
        """(first token index, image) of every image in ``token_ids``, in order."""
        return spans_of(self.segments)

    def clear_kv(self) -> None:
        """Forget the KV bookkeeping (the caller has released the blocks)."""
        self.block_table = []
        self.block_hashes = []
        self.num_kv_tokens = 0

    def replace_segments(self, segments: list[PromptPiece]) -> None:
        """Set the history to ``segments`` (after dropping turns); KV must be cleared first."""
        if self.block_table:
            raise RuntimeError("release the conversation's blocks before rewriting its history")
        self.segments = segments
        self.token_ids = [t for seg in segments for t in seg.token_ids]

    def reset(self) -> None:
        """Back to the system prompt only (blocks must have been released)."""
        self.replace_segments(self.segments[:1])


def spans_of(segments: list[PromptPiece]) -> list[tuple[int, ImageRef]]:
    """Absolute (start, image) spans of the images in a list of segments."""
    spans, base = [], 0
    for seg in segments:
        spans.extend((base + off, img) for off, img in seg.images)
        base += len(seg.token_ids)
    return spans
