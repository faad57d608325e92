# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Conversation state: token history in segments (system prompt, turns), image spans, KV blocks.

The history holds the *generated* ids of every answer (exact KV reuse), closed with the
checkpoint's ``<|im_end|>`` when a turn ended without it. The next turn's tokens come from the
checkpoint's own chat template: the text it renders for the whole conversation plus the new
message, minus what it renders for the conversation so far, starting right after the last
``<|im_end|>`` (the template's "\n<|im_start|>user\n..." continuation). Every segment boundary
sits next to a special token, so tokenizing segment by segment gives the same ids as
tokenizing the whole text: the history equals what the template renders for the conversation.
"""

from dataclasses import dataclass, field
import hashlib
import itertools

import numpy as np
import torch

from orin_llm_node.processing import rope_positions, user_message

_ids = itertools.count()


def image_key(rgb: np.ndarray) -> bytes:
    """Content hash of an image array (shape, dtype and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((rgb.shape, str(rgb.dtype))).encode())
    h.update(np.ascontiguousarray(rgb).data)
    return h.digest()


@dataclass
class ImageRef:
    """One image of the history: the caller's array, its hash, grid and token count.

    ``pixel_values`` is kept only until the turn that brought the image has been prefilled;
    later re-prefills take the vision cache or re-run preprocessing from ``rgb``.
    """

    rgb: np.ndarray
    key: bytes
    grid_thw: tuple[int, int, int]
    num_tokens: int
    pixel_values: torch.Tensor | None = None


@dataclass
class Segment:
    """A run of history: the system prompt, or one user turn with its answer."""

    messages: list[dict]
    token_ids: list[int]
    images: list[tuple[int, ImageRef]] = field(default_factory=list)  # (offset, image)


class Conversation:
    """One chat's history and the KV blocks holding it (owned by an ``LLMEngine``)."""

    def __init__(self, system_prompt: str | None, system: Segment | None):
        self.id = next(_ids)
        self.system_prompt = system_prompt
        self.segments: list[Segment] = [system or Segment([], [])]
        self.token_ids: list[int] = list(self.segments[0].token_ids)
        # KV state: blocks referenced by this conversation, hashes of its full blocks, and how
        # many leading tokens of token_ids have K/V in those blocks.
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_kv_tokens = 0
        # Ids past token_ids whose K/V are already in the blocks: the header the next user turn
        # is expected to start with, prefilled after an answer (LLMEngine); the next turn
        # keeps the part of it that its tokens really start with.
        self.kv_ahead: list[int] = []

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
        self.kv_ahead = []

    def replace_segments(self, segments: list[Segment]) -> None:
        """Set the history to ``segments`` (after dropping turns); KV must be cleared first."""
        if self.block_table:
            raise RuntimeError("release the conversation's blocks before rewriting its history")
        self.segments = segments
        self.token_ids = [t for seg in segments for t in seg.token_ids]

    def reset(self) -> None:
        """Back to the system prompt only (blocks must have been released)."""
        self.replace_segments(self.segments[:1])


def spans_of(segments: list[Segment]) -> list[tuple[int, ImageRef]]:
    """Absolute (start, image) spans of the images in a list of segments."""
    spans, base = [], 0
    for seg in segments:
        spans.extend((base + off, img) for off, img in seg.images)
        base += len(seg.token_ids)
    return spans


class PromptBuilder:
    """Turns system prompts and user messages into token segments (the checkpoint's template)."""

    def __init__(self, template, tokenizer, image_processor, image_token_id: int,
                 merge_size: int):
        self.template = template
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.merge_size = merge_size
        self.im_end = tokenizer.IM_END
        self.im_end_id = tokenizer.im_end_id

    def _head(self, rendered: str) -> tuple[str, str]:
        # Split a rendered history after its last <|im_end|>: (what our ids hold, the tail).
        cut = rendered.rfind(self.im_end)
        if cut < 0:
            return rendered, ""
        cut += len(self.im_end)
        return rendered[:cut], rendered[cut:]

    def system_segment(self, system_prompt: str | None) -> Segment:
        """Segment of a system prompt (empty segment for None)."""
        if system_prompt is None:
            return Segment([], [])
        messages = [{"role": "system", "content": system_prompt}]
        head, _ = self._head(self.template.render(messages, add_generation_prompt=False))
        return Segment(messages, self.tokenizer.encode(head))

    def user_turn(self, conv: Conversation, text: str, images: list[np.ndarray]) -> Segment:
        """Segment of a new user message (with images), up to the assistant generation prompt."""
        refs = []
        for rgb in images:
            processed = self.image_processor.preprocess(rgb)
            refs.append(ImageRef(rgb, image_key(rgb), tuple(processed.grid_thw),
                                 processed.num_tokens, processed.pixel_values))
        user = user_message(text, len(refs))
        prev = conv.messages()
        full = self.template.render([*prev, user], add_generation_prompt=True)
        if prev:
            rendered = self.template.render(prev, add_generation_prompt=False)
            if not full.startswith(rendered):
                raise ValueError("the chat template does not render conversations incrementally")
            _, tail = self._head(rendered)
            piece = tail + full[len(rendered):] if conv.token_ids else full
        else:
            piece = full
        raw = self.tokenizer.encode(piece)
        counts = [r.num_tokens for r in refs]
        ids = self.tokenizer.expand_image_pads(raw, counts)  # checks pads == images
        pads = [i for i, t in enumerate(raw) if t == self.image_token_id]
        offsets = [i + sum(counts[:k]) - k for k, i in enumerate(pads)]
        return Segment([user], ids, list(zip(offsets, refs, strict=True)))

    def user_header(self, conv: Conversation) -> list[int]:
        r"""Ids every next user turn of ``conv`` starts with (e.g. ``\n<|im_start|>user\n``).

        What the template renders before the message text: the ids of a text-free turn up to
        its ``<|im_end|>``. Empty when the template puts nothing fixed there.
        """
        ids = self.user_turn(conv, "", []).token_ids
        return ids[: ids.index(self.im_end_id)] if self.im_end_id in ids else []

    def positions(self, token_ids: list[int], spans) -> tuple[np.ndarray, int]:
        """M-RoPE positions ``[3, N]`` of a whole history and the start of what follows."""
        return rope_positions(token_ids, [img.grid_thw for _, img in spans],
                              self.image_token_id, self.merge_size)
