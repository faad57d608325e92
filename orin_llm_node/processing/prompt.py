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

Message text stays text: the template is rendered with a random placeholder in place of the
new message's text, and the text is tokenized with no added token recognised in it
(``Tokenizer.encode_parts``), so control-token strings typed by a user never become control
tokens. A template whose output would differ with the real text in place (one that transforms
or inspects message text) is refused rather than guessed at.

Images: a conversation keeps each image at the size the model sees (``ImageRef.rgb``, at most
3 bytes per pixel of ``max_pixels``, i.e. 3 x 1024 bytes per image token with patch 16 and merge
2), never the caller's full-resolution frame; the prefix-cache key stays the content hash of the
frame the caller passed.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
import hashlib
import secrets

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
    """One image of a prompt: its pixels, content hash, grid and token count.

    ``rgb``: the uint8 image at the size the model sees (``ImageProcessor.resize`` of the
    caller's frame; re-prefills patchify it again); ``key``: the content hash of the caller's
    frame (the prefix-cache and vision-cache key).
    """

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

    def _encode(self, message, text: str, add_generation_prompt: bool,
                history: Sequence[dict] = ()) -> list[int]:
        # ``message(t)``: the HF-style message holding text ``t``. Returns the ids of what it
        # adds to ``history`` (up to its last <|im_end|> without a generation prompt), with
        # ``text`` tokenized as text.
        slot = _slot()
        full = self.template.render([*history, message(slot)],
                                    add_generation_prompt=add_generation_prompt)
        start, tail = 0, ""
        if history:
            rendered = self.template.render(history, add_generation_prompt=False)
            if not full.startswith(rendered):
                raise ValueError("the chat template does not render conversations incrementally")
            _, tail = self._head(rendered)
            start = len(rendered)
        piece = full[start:]
        if not add_generation_prompt:
            piece, _ = self._head(piece)
        if piece.count(slot) != 1 or full.count(slot) != 1:
            raise ValueError("the chat template does not render message text as it is")
        before, after = piece.split(slot)
        if self.template.render([*history, message(text)],
                                add_generation_prompt=add_generation_prompt
                                ) != full.replace(slot, text):
            raise ValueError("the chat template renders this text differently from other text "
                             "(it inspects or transforms message text)")
        return self.tokenizer.encode_parts([(tail + before, True), (text, False),
                                            (after, True)])

    def system_piece(self, system_prompt: str | None) -> PromptPiece:
        """Piece of a system prompt (an empty piece for None); its text is tokenized as text."""
        if system_prompt is None:
            return PromptPiece([], [])
        ids = self._encode(lambda t: {"role": "system", "content": t}, system_prompt,
                           add_generation_prompt=False)
        return PromptPiece([{"role": "system", "content": system_prompt}], ids)

    def user_turn(self, history: Sequence[dict], text: str,
                  images: Sequence[np.ndarray]) -> PromptPiece:
        """Piece of a new user message (with images) after ``history`` (HF-style messages).

        It runs up to the assistant generation prompt; ``text`` is tokenized as text.
        """
        refs, pixels = [], {}
        for rgb in images:
            processed = self.image_processor.preprocess(rgb)
            key = image_key(rgb)
            refs.append(ImageRef(processed.image, key, tuple(processed.grid_thw),
                                 processed.num_tokens))
            pixels[key] = processed.pixel_values
        raw = self._encode(lambda t: user_message(t, len(refs)), text,
                           add_generation_prompt=True, history=history)
        counts = [r.num_tokens for r in refs]
        ids = self.tokenizer.expand_image_pads(raw, counts)  # checks pads == images
        pads = [i for i, t in enumerate(raw) if t == self.image_token_id]
        offsets = [i + sum(counts[:k]) - k for k, i in enumerate(pads)]
        return PromptPiece([user_message(text, len(refs))], ids,
                           list(zip(offsets, refs, strict=True)), pixels)

    def pixel_values(self, img: ImageRef) -> torch.Tensor:
        """Pixel patches of an image of the history (patchified again from its stored pixels)."""
        return self.image_processor.patchify(img.rgb).pixel_values

    def positions(self, token_ids: list[int], spans) -> tuple[np.ndarray, int]:
        """M-RoPE positions ``[3, N]`` of a whole history and the start of what follows."""
        return rope_positions(token_ids, [img.grid_thw for _, img in spans],
                              self.image_token_id, self.merge_size)


def _slot() -> str:
    # A placeholder no message text can contain by chance or by design (random per prompt).
    return f"\ue000{secrets.token_hex(16)}\ue001"

