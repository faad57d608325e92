# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Prompt building: system prompts and user messages -> token pieces with their images.

A conversation's history holds the *generated* ids of every answer (exact KV reuse), closed with
the checkpoint's ``<|im_end|>``. The next turn's tokens come from the checkpoint's own chat
template: the text it renders for the whole conversation plus the new message, minus what it
renders for the conversation so far, starting right after the last ``<|im_end|>`` (the
template's "\n<|im_start|>user\n..." continuation). Every piece boundary sits next to a special
token, so tokenizing piece by piece gives the same ids as tokenizing the whole text: the history
equals what the template renders for the conversation.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
import hashlib

import numpy as np
import torch

from orin_llm_node.processing.chat import user_message
from orin_llm_node.processing.rope_index import rope_positions

__all__ = ["ImageRef", "PromptBuilder", "PromptPiece", "image_key"]


def image_key(rgb: np.ndarray) -> bytes:
    """Content hash of an image array (shape, dtype and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((rgb.shape, str(rgb.dtype))).encode())
    h.update(np.ascontiguousarray(rgb).data)
    return h.digest()


@dataclass(frozen=True)
class ImageRef:
    """One image of a prompt: the caller's array, its content hash, grid and token count."""

    rgb: np.ndarray
    key: bytes
    grid_thw: tuple[int, int, int]
    num_tokens: int


@dataclass
class PromptPiece:
    """Tokens of the system prompt or of one new user message, with the images inside them.

    ``images``: (offset of the image's first token in ``token_ids``, image); ``pixel_values``:
    the patches computed while building the piece, by image key (the piece's own prefill uses
    them; later re-prefills take the vision cache or ``PromptBuilder.pixel_values``).
    """

    messages: list[dict]
    token_ids: list[int]
    images: list[tuple[int, ImageRef]] = field(default_factory=list)
    pixel_values: dict[bytes, torch.Tensor] = field(default_factory=dict)


class PromptBuilder:
    """Turns system prompts and user messages into ``PromptPiece``s (the checkpoint's template)."""

    def __init__(self, template, tokenizer, image_processor, image_token_id: int,
                 merge_size: int):
        self.template = template
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.merge_size = merge_size
        self.im_end = tokenizer.IM_END

    def _head(self, rendered: str) -> tuple[str, str]:
        # Split a rendered history after its last <|im_end|>: (what our ids hold, the tail).
        cut = rendered.rfind(self.im_end)
        if cut < 0:
            return rendered, ""
        cut += len(self.im_end)
        return rendered[:cut], rendered[cut:]

    def system_piece(self, system_prompt: str | None) -> PromptPiece:
        """Piece of a system prompt (an empty piece for None)."""
        if system_prompt is None:
            return PromptPiece([], [])
        messages = [{"role": "system", "content": system_prompt}]
        head, _ = self._head(self.template.render(messages, add_generation_prompt=False))
        return PromptPiece(messages, self.tokenizer.encode(head))

    def user_turn(self, history: Sequence[dict], text: str,
                  images: Sequence[np.ndarray]) -> PromptPiece:
        """Piece of a new user message (with images) after ``history`` (HF-style messages).

        It runs up to the assistant generation prompt.
        """
        refs, pixels = [], {}
        for rgb in images:
            processed = self.image_processor.preprocess(rgb)
            key = image_key(rgb)
            refs.append(ImageRef(rgb, key, tuple(processed.grid_thw), processed.num_tokens))
            pixels[key] = processed.pixel_values
        user = user_message(text, len(refs))
        full = self.template.render([*history, user], add_generation_prompt=True)
        piece = full
        if history:
            rendered = self.template.render(history, add_generation_prompt=False)
            if not full.startswith(rendered):
                raise ValueError("the chat template does not render conversations incrementally")
            _, tail = self._head(rendered)
            piece = tail + full[len(rendered):]
        raw = self.tokenizer.encode(piece)
        counts = [r.num_tokens for r in refs]
        ids = self.tokenizer.expand_image_pads(raw, counts)  # checks pads == images
        pads = [i for i, t in enumerate(raw) if t == self.image_token_id]
        offsets = [i + sum(counts[:k]) - k for k, i in enumerate(pads)]
        return PromptPiece([user], ids, list(zip(offsets, refs, strict=True)), pixels)

    def pixel_values(self, img: ImageRef) -> torch.Tensor:
        """Pixel patches of an image of the history (preprocessed again from its array)."""
        return self.image_processor.preprocess(img.rgb).pixel_values

    def positions(self, token_ids: list[int], spans) -> tuple[np.ndarray, int]:
        """M-RoPE positions ``[3, N]`` of a whole history and the start of what follows."""
        return rope_positions(token_ids, [img.grid_thw for _, img in spans],
                              self.image_token_id, self.merge_size)
