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

Message text stays text: the template is rendered with a random placeholder in place of each
text of the new message, and those texts are tokenized with no added token recognised in them
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

from orin_llm_node.processing.rope_index import rope_positions
from orin_llm_node.processing.video import VideoClip, video_key

__all__ = ['ImageRef', 'PromptBuilder', 'PromptPiece', 'VideoRef', 'image_key']


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

    @property
    def rope_grids(self) -> list[tuple[int, int, int]]:
        """Grids of the image's runs of pad tokens, for ``rope_positions``."""
        return [self.grid_thw]

    def rows_before(self, offset: int) -> int:
        """Vision-tower rows of the pad tokens before span offset ``offset``."""
        return min(max(offset, 0), self.num_tokens)


@dataclass(frozen=True)
class VideoRef:
    """One video clip of a prompt: its frames as the model sees them, hash, grid and layout.

    ``clip``: the sampled frames at model size with their timestamps (re-prefills patchify it
    again; never the caller's full-resolution frames); ``key``: content hash of those frames;
    ``grid_thw``: ``(t, h, w)`` patches; the clip's span in the prompt runs from the first video
    pad of its first temporal group to the last pad of its last one (``num_tokens`` tokens),
    the timestamp text and vision start/end tokens between groups included;
    ``pad_offsets``: where each group's pads start in the span; ``tokens_per_group``: pads per
    group.
    """

    clip: VideoClip
    key: bytes
    grid_thw: tuple[int, int, int]
    num_tokens: int
    pad_offsets: tuple[int, ...]
    tokens_per_group: int

    @property
    def rope_grids(self) -> list[tuple[int, int, int]]:
        """One ``(1, h, w)`` grid per temporal group (how the reference splits a video)."""
        _, h, w = self.grid_thw
        return [(1, h, w)] * len(self.pad_offsets)

    def rows_before(self, offset: int) -> int:
        """Vision-tower rows of the pad tokens before span offset ``offset``."""
        n = self.tokens_per_group
        return sum(min(max(offset - start, 0), n) for start in self.pad_offsets)


@dataclass
class PromptPiece:
    """Tokens of the system prompt or of one new user message, with the media inside them.

    ``media``: (offset of the item's first pad token in ``token_ids``, ``ImageRef`` or
    ``VideoRef``), in prompt order; ``pixel_values``: the image patches computed while building
    the piece, by image key (the piece's own prefill uses them; later re-prefills, and clips,
    take the vision cache or ``PromptBuilder.pixel_values``).
    """

    messages: list[dict]
    token_ids: list[int]
    media: list[tuple[int, ImageRef | VideoRef]] = field(default_factory=list)
    pixel_values: dict[bytes, torch.Tensor] = field(default_factory=dict)


class PromptBuilder:
    """Turns system prompts and user messages into ``PromptPiece``s (the checkpoint's template)."""

    def __init__(self, template, tokenizer, image_processor, image_token_id: int,
                 merge_size: int, video_processor=None, video_token_id: int | None = None):
        self.template = template
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.merge_size = merge_size
        self.video_processor = video_processor
        self.video_token_id = video_token_id
        self.im_end = tokenizer.IM_END

    def _head(self, rendered: str) -> tuple[str, str]:
        # Split a rendered history after its last <|im_end|>: (what our ids hold, the tail).
        cut = rendered.rfind(self.im_end)
        if cut < 0:
            return rendered, ''
        cut += len(self.im_end)
        return rendered[:cut], rendered[cut:]

    def _prefix(self, history: Sequence[dict], tools) -> str:
        # What the template renders before a new message: the history, else (tools without a
        # system prompt) the tools' system turn alone, cut after its <|im_end|>.
        if history:
            return self.template.render(history, add_generation_prompt=False, tools=tools)
        if not tools:
            return ''
        slot = _slot()
        probe = self.template.render([{'role': 'user', 'content': slot}],
                                     add_generation_prompt=False, tools=tools)
        head, _ = self._head(probe[:probe.index(slot)])
        return head if head.endswith(self.im_end) else ''

    def _encode(self, message, texts: list[str], add_generation_prompt: bool,
                history: Sequence[dict] | None = (), tools=None) -> list[int]:
        # ``message(ts)``: the HF-style message (or list of messages) holding texts ``ts``.
        # Returns the ids of what it adds to ``history`` (up to its last <|im_end|> without a
        # generation prompt), with every text tokenized as text. ``history=None``: the
        # messages open the conversation (a system prompt), nothing comes before them.
        def messages(ts):
            made = message(ts)
            return [*(history or ()), *(made if isinstance(made, list) else [made])]

        slots = [_slot() for _ in texts]
        full = self.template.render(messages(slots), add_generation_prompt=add_generation_prompt,
                                    tools=tools)
        rendered = '' if history is None else self._prefix(history, tools)
        if not full.startswith(rendered):
            raise ValueError('the chat template does not render conversations incrementally')
        _, tail = self._head(rendered)
        piece = full[len(rendered):]
        if not add_generation_prompt:
            piece, _ = self._head(piece)
        real = full
        for slot, text in zip(slots, texts, strict=True):
            if piece.count(slot) != 1 or full.count(slot) != 1:
                raise ValueError('the chat template does not render message text as it is')
            real = real.replace(slot, text)
        if self.template.render(messages(list(texts)), add_generation_prompt=add_generation_prompt,
                                tools=tools) != real:
            raise ValueError('the chat template renders this text differently from other text '
                             '(it inspects or transforms message text)')
        parts, pos, trusted = [], 0, tail
        for at, slot, text in sorted((piece.index(sl), sl, t)
                                     for sl, t in zip(slots, texts, strict=True)):
            parts += [(trusted + piece[pos:at], True), (text, False)]
            pos, trusted = at + len(slot), ''
        parts.append((trusted + piece[pos:], True))
        return self.tokenizer.encode_parts(parts)

    def system_piece(self, system_prompt: str | None, tools=None) -> PromptPiece:
        """Piece of a system prompt and of the tools the template renders beside it.

        An empty piece for neither. Its text is tokenized as text; the tools' JSON as the
        template writes it (``processing.tools.check_tools`` refuses control-token text in it).
        """
        if system_prompt is None:
            ids = self.tokenizer.encode_parts([(self._prefix((), tools), True)])
            return PromptPiece([], ids)
        ids = self._encode(lambda ts: {'role': 'system', 'content': ts[0]}, [system_prompt],
                           add_generation_prompt=False, history=None, tools=tools)
        return PromptPiece([{'role': 'system', 'content': system_prompt}], ids)

    def user_turn(self, history: Sequence[dict], text, images: Sequence[np.ndarray] = (),
                  videos: Sequence[VideoClip] = (), tools=None,
                  tool_results: Sequence[tuple[str, object]] = ()) -> PromptPiece:
        """Piece of a new user message after ``history`` (HF-style messages).

        The message's content is ``images``, then ``videos``, then ``text``, in the order the
        chat template renders a content list; ``text`` is a ``str`` or a list of parts, each a
        ``str``, an image array or a ``VideoClip``, rendered in their order (interleaved
        content); ``None`` with ``tool_results`` and no media: no user message. It runs up to
        the assistant generation prompt; every text is tokenized as text.

        ``tools``: the tools the conversation's system turn renders (see ``system_piece``);
        ``tool_results``: ``(call id, content)`` pairs rendered first, one ``tool`` message
        each, in order; a content is a ``str`` or a list of parts as ``text``.
        """
        refs, pixels = [], {}
        results = [(call_id, self._content(_parts(body), refs, pixels))
                   for call_id, body in tool_results]
        content = None
        if text is not None or images or videos:
            content = self._content([*images, *videos, *_parts(text)], refs, pixels)
        if content is None and not results:
            raise ValueError('a turn needs a message or tool results')
        blocks = [c for _, body in results for c in body] + (content or [])
        texts = [c['text'] for c in blocks if c['type'] == 'text']

        def message(ts):
            it = iter(ts)

            def fill(body):
                return [{'type': 'text', 'text': next(it)} if c['type'] == 'text' else c
                        for c in body]

            made = [{'role': 'tool', 'tool_call_id': call_id, 'content': fill(body)}
                    for call_id, body in results]
            if content is not None:
                made.append({'role': 'user', 'content': fill(content)})
            return made

        raw = self._encode(message, texts, add_generation_prompt=True, history=history,
                           tools=tools)
        ids, media = self._expand(raw, refs)
        return PromptPiece(message(texts), ids, media, pixels)

    def _content(self, items, refs: list, pixels: dict) -> list[dict]:
        # The content list of ``items`` (text, image arrays, clips); their refs and image
        # patches are appended to ``refs`` / ``pixels`` in order.
        content = []
        for item in items:
            if isinstance(item, str):
                content.append({'type': 'text', 'text': item})
                continue
            if isinstance(item, VideoClip):
                if self.video_processor is None or self.video_token_id is None:
                    raise ValueError('this checkpoint takes no video (no video processor or '
                                     'video pad token)')
                content.append({'type': 'video'})
                refs.append(self.video_processor.resize(item))
            elif isinstance(item, np.ndarray):
                content.append({'type': 'image'})
                processed = self.image_processor.preprocess(item)
                key = image_key(item)
                refs.append(ImageRef(processed.image, key, tuple(processed.grid_thw),
                                     processed.num_tokens))
                pixels[key] = processed.pixel_values
            else:
                raise ValueError(f'message content must be text, an image (H x W x 3 uint8 '
                                 f'array) or a VideoClip, got {type(item).__name__}')
        return content

    def _video_ids(self, group_times, tokens_per_group: int):
        # transformers 5.x's expansion of the template's <|video_pad|> (the pad alone: the
        # template's <|vision_start|> and <|vision_end|> around it stay): per temporal group
        # "<{t:.1f} seconds>", <|vision_start|>, the group's pads, <|vision_end|>. Returned as
        # (ids before the first pad, the span from the first pad to the last, each group's pad
        # start in the span); the final <|vision_end|> follows the span.
        tok = self.tokenizer
        groups = [tok.encode(f'<{t:.1f} seconds>') for t in group_times]
        head = [*groups[0], tok.vision_start_id]
        span, starts = [], []
        for g, text in enumerate(groups):
            if g:
                span.extend([tok.vision_end_id, *text, tok.vision_start_id])
            starts.append(len(span))
            span.extend([self.video_token_id] * tokens_per_group)
        return head, span, starts

    def _expand(self, raw: list[int], items: list):
        # Expand the k-th image or video pad of ``raw`` for items[k] (an ImageRef or a clip
        # from VideoProcessor.resize); returns the ids and (first pad offset, ref) of every
        # item. A clip's patches are made only if the vision cache lacks it (pixel_values).
        ids, media = [], []
        for tok in raw:
            if tok != self.image_token_id and tok != self.video_token_id:
                ids.append(int(tok))
                continue
            k = len(media)
            item = items[k] if k < len(items) else None
            is_image = isinstance(item, ImageRef)
            if item is None or (tok == self.image_token_id) != is_image:
                raise ValueError("the chat template's image/video pads do not match the "
                                 "message's images and videos")
            if is_image:
                media.append((len(ids), item))
                ids.extend([tok] * item.num_tokens)
                continue
            grid, group_times, per_group = self.video_processor.layout(item)
            head, span, starts = self._video_ids(group_times, per_group)
            ids.extend(head)
            key = video_key(np.stack(item.frames))
            media.append((len(ids), VideoRef(item, key, grid, len(span), tuple(starts),
                                             per_group)))
            ids.extend(span)
            ids.append(self.tokenizer.vision_end_id)
        if len(media) != len(items):
            raise ValueError(f'the chat template rendered {len(media)} image/video pad(s) for '
                             f'{len(items)} item(s)')
        return ids, media

    def pixel_values(self, ref: ImageRef | VideoRef) -> torch.Tensor:
        """Pixel patches of an image or clip of the history (patchified again, no resize)."""
        if isinstance(ref, VideoRef):
            return self.video_processor.patchify(ref.clip).pixel_values
        return self.image_processor.patchify(ref.rgb).pixel_values

    def positions(self, token_ids: list[int], spans) -> tuple[np.ndarray, int]:
        """M-RoPE positions ``[3, N]`` of a whole history and the start of what follows."""
        grids = [g for _, ref in spans for g in ref.rope_grids]
        pads = [self.image_token_id]
        if self.video_token_id is not None:
            pads.append(self.video_token_id)
        return rope_positions(token_ids, grids, pads, self.merge_size)


def _parts(text) -> list:
    # A message's parts: a list of them as it is, a str (or None: nothing) alone.
    if text is None:
        return []
    return list(text) if isinstance(text, (list, tuple)) else [text]


def _slot() -> str:
    # A placeholder no message text can contain by chance or by design (random per prompt).
    return f'\ue000{secrets.token_hex(16)}\ue001'
