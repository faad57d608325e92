# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""One turn of a conversation: what it returns, its bookkeeping, and its loop.

``LLMEngine.chat_stream`` checks the input and admits the turn (``KVCacheManager.admit``);
:class:`TurnLoop` then runs it -- the vision rows, the chunked prefill, the decode steps with
their stop rules -- and closes it: the answer stays in the history, or a failed turn is rolled
back as if it never ran.
"""

from dataclasses import dataclass, field
import logging
import time

import numpy as np
import torch

from orin_llm_node.models import VisionOutput
from orin_llm_node.processing import VideoClip, VideoRef

from .conversation import Conversation
from .detokenizer import IncrementalDetokenizer
from .finish_reason import FinishReason
from .sampler import NonFiniteLogits, Sampler
from .structured import parse_answer

__all__ = ['ChatResult', 'Stage', 'StreamEvent', 'TurnLoop', 'TurnState', 'check_message',
           'check_text']

log = logging.getLogger(__name__)


@dataclass
class ChatResult:
    """The outcome of one turn.

    ``prompt_token_ids``: everything attended for this turn (history included, after any
    dropped turns); ``prompt_images``: the images inside it, in order, as the model sees them
    (resized: the reference image processor gives the same patches from them as from the
    caller's frames); ``prompt_videos``: the
    video clips inside it, in order, each as the model saw it (the sampled frames at model
    size, with their timestamps: ``VideoProcessor.patchify`` gives the reference's pixel input);
    images and clips are two lists, as the reference takes them (``pixel_values`` and
    ``pixel_values_videos``); ``token_ids``: the
    generated ids (a stop token included); ``cached_tokens``: prompt tokens reused from the KV
    cache; ``error``: why the prompt could not run, or why the turn failed
    (``finish_reason == "error"``: a grammar dead end, an unparsable JSON answer, or a step
    whose logits left no token to pick -- NaN, +inf, or every token masked; the turn left no
    trace in the conversation).

    A constrained answer (``SamplingParams.response_format``) also has ``valid``: True exactly
    when ``finish_reason == "stop"`` (its grammar completed; a ``"length"`` answer is
    incomplete and never valid) and ``parsed``: the answer's JSON value when valid (``None``
    for a regex; see ``structured.parse_answer`` for numbers beyond a float's range).
    Unconstrained answers keep ``valid = None``.

    Tools (``SamplingParams.tools``): ``tool_calls`` holds the answer's calls, ``[{id, name,
    arguments}]`` (``arguments`` a dict that follows the tool's schema), and ``finish_reason``
    is ``"tool_calls"`` when the answer ends on them; ``text`` is the whole answer, the calls'
    markup included. Grounding (``SamplingParams.detect``): ``detections`` holds ``[{label,
    bbox_2d, bbox}]``, the model's 0-1000 box and the same box in the caller's frame's pixels
    (``processing/grounding.py``).
    """

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    prompt_images: list[np.ndarray]
    finish_reason: str
    prompt_videos: list[VideoClip] = field(default_factory=list)
    cached_tokens: int = 0
    ttft_s: float = 0.0
    decode_tok_s: float = 0.0
    vision_s: float = 0.0
    dropped_turns: int = 0
    error: str | None = None
    valid: bool | None = None
    parsed: object = None
    tool_calls: list[dict] = field(default_factory=list)
    detections: list[dict] = field(default_factory=list)


class Stage:
    """What a turn is doing, as ``chat_stream(on_stage=...)`` is told at each change.

    The stages come in this order; a turn without images (or whose images are all before the
    cached prefix) skips ``ENCODING_IMAGES``, a turn stopped early ends where it stopped.
    """

    ENCODING_IMAGES = 'encoding_images'
    PREFILL = 'prefill'
    DECODING = 'decoding'       # the first token is sampled (its time is the TTFT)


@dataclass
class StreamEvent:
    """One step of ``chat_stream``: a text delta, and on the last event the ``ChatResult``."""

    delta: str
    token_id: int | None = None
    result: ChatResult | None = None


def check_text(what: str, text) -> None:
    """``ValueError`` unless ``text`` is a str that encodes to UTF-8 (no lone surrogates)."""
    if not isinstance(text, str):
        raise ValueError(f'{what} must be a str, got {type(text).__name__}')
    try:
        text.encode('utf-8')
    except UnicodeEncodeError as exc:
        raise ValueError(f'{what} is not valid Unicode: lone surrogate {text[exc.start]!r} '
                         f'at index {exc.start}') from None


def check_message(text, images, videos, tool_results=None) -> None:
    """The input checks of a user message (its text or parts, images, clips, tool results).

    ``ValueError`` for text that ``check_text`` refuses (in the message or a tool result), a
    bare image array or clip where a list is expected, and anything but ``VideoClip``s in
    ``videos``. ``text`` None is no message (``AnswerShape`` says when that is wrong).
    """
    if isinstance(text, (list, tuple)):  # interleaved parts: text, images, clips
        for part in text:
            if isinstance(part, str):
                check_text('text', part)
    elif text is not None:
        check_text('text', text)
    for result in tool_results if isinstance(tool_results, (list, tuple)) else []:
        content = result.get('content') if isinstance(result, dict) else None
        for part in content if isinstance(content, (list, tuple)) else [content]:
            if isinstance(part, str):
                check_text('tool result', part)
    if isinstance(images, np.ndarray):
        raise ValueError('images must be a list of H x W x 3 uint8 arrays, got one bare '
                         'array (pass [image])')
    if isinstance(videos, VideoClip):
        raise ValueError('videos must be a list of VideoClips, got one bare clip '
                         '(pass [clip])')
    for clip in videos or []:
        if not isinstance(clip, VideoClip):
            raise ValueError(f'videos must hold VideoClips, got {type(clip).__name__}')


def prompt_media(spans) -> tuple[list[np.ndarray], list[VideoClip]]:
    """The images and the clips of a prompt's media spans, each in prompt order."""
    images = [ref.rgb for _, ref in spans if not isinstance(ref, VideoRef)]
    videos = [ref.clip for _, ref in spans if isinstance(ref, VideoRef)]
    return images, videos


class TurnState:
    """Mutable bookkeeping of the turn in progress (shared by the generator and its cleanup)."""

    def __init__(self, t0: float, cached: int, dropped: int):
        self.t0, self.cached, self.dropped = t0, cached, dropped
        self.t_first = self.t_last = t0
        self.prompt_ids: list[int] = []
        self.images: list[np.ndarray] = []
        self.videos: list[VideoClip] = []
        self.token_ids: list[int] = []
        self.detok: IncrementalDetokenizer | None = None
        self.finish: str | None = None
        self.error: str | None = None  # why a failed turn failed
        self.vision_s = 0.0
        self.response_format: dict | None = None
        self.grammar = None  # structured.Grammar of a constrained answer
        self.shape = None  # answer_shape.AnswerShape: what shapes the answer
        self.tail = ''
        self.result: ChatResult | None = None

    def no_token(self, exc: NonFiniteLogits) -> None:
        """End the answer: a step's logits left nothing to pick (the engine goes on)."""
        log.warning('answer ended after %d tokens: %s', len(self.token_ids), exc)
        self.finish, self.error = FinishReason.ERROR, str(exc)


class TurnLoop:
    """Runs admitted turns on the engine's parts (its runner, KV books, prompts and caches).

    ``cancel``: the engine's cancel flag (a ``threading.Event``), checked before every step.
    """

    def __init__(self, engine, cancel):
        self.runner, self.kv, self.prompts = engine.runner, engine.kv, engine.prompts
        self.tokenizer, self.vision_cache = engine.tokenizer, engine.vision_cache
        self.config, self.device, self.cancel = engine.config, engine.device, cancel

    def refused(self, conv: Conversation, turn, plan) -> ChatResult:
        """The result of a turn the KV books would not admit (``plan.refused``)."""
        log.warning('prompt not run (%s): %s', plan.refused, plan.reason)
        tokens, spans = conv.without_oldest(0, turn)
        images, videos = prompt_media(spans)
        return ChatResult('', [], tokens, images, plan.refused, prompt_videos=videos,
                          error=plan.reason)

    def vision_rows(self, spans, start: int, fresh) -> tuple[VisionOutput | None, float]:
        """Vision rows of every image or video pad at or after token ``start``, in order.

        A prefix hit may end inside an image or clip: its uncached pads still need their
        rows. ``fresh``: the new turn's pixel patches by key; older media are patched again.
        Returns the rows and the seconds they took.
        """
        parts, t0 = [], time.perf_counter()
        for s, ref in spans:
            if s + ref.num_tokens <= start:
                continue
            key = (ref.key, ref.grid_thw)
            out = self.vision_cache.get(key)
            if out is None:
                pixels = fresh.get(ref.key)
                if pixels is None:
                    pixels = self.prompts.pixel_values(ref)
                out = self.runner.encode_image(pixels, ref.grid_thw)
                self.vision_cache.put(key, out)
            lo = ref.rows_before(start - s)
            parts.append(out[lo:] if lo else out)
        if not parts:
            return None, 0.0
        if len(parts) > 1:
            parts = [VisionOutput(
                torch.cat([p.embeds for p in parts]),
                tuple(torch.cat(level) for level in zip(*(p.deepstack for p in parts),
                                                         strict=True)),
            )]
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
        return parts[0], time.perf_counter() - t0

    def generate(self, conv: Conversation, sampler: Sampler, state: TurnState, pixels,
                 on_stage=None):
        """Prefill the turn and decode its answer, yielding a ``StreamEvent`` per token.

        ``on_stage(stage)``: told each :class:`Stage` as the turn enters it (a callback, not
        an event: the stream stays one event per token); it may call ``cancel()``. Ends with
        ``state.finish`` set (or none, when closed early); raises ``GrammarDeadEnd`` when a
        constrained answer cannot go on.
        """
        kv, runner, sampling = self.kv, self.runner, sampler.params
        prompt = list(conv.token_ids)
        spans = conv.media_spans()
        state.prompt_ids = prompt
        state.images, state.videos = prompt_media(spans)
        positions, next_pos = self.prompts.positions(prompt, spans)
        deadline = None if sampling.timeout_s is None else state.t0 + sampling.timeout_s
        # The deadline and cancel() cover the prefill too: checked before the vision tower,
        # after it and between prefill chunks (the KV of the chunks done is kept: a later turn
        # reuses it).
        # Each stage is told before the check that follows it: a caller may cancel() from it.
        stage = on_stage or (lambda name: None)
        if any(s + ref.num_tokens > state.cached for s, ref in spans):
            stage(Stage.ENCODING_IMAGES)
        if self._prefill_stopped(state, deadline):
            return
        visual, state.vision_s = self.vision_rows(spans, state.cached, pixels)
        stage(Stage.PREFILL)
        if self._prefill_stopped(state, deadline):
            return
        for written, chunk_logits in runner.prefill_chunks(
                prompt[state.cached:], positions[:, state.cached:], conv.block_table,
                state.cached, visual, self.config.prefill_chunk_tokens):
            kv.kv_written(conv, written)
            logits = chunk_logits
            if written < len(prompt) and self._prefill_stopped(state, deadline):
                return
        detok = state.detok = IncrementalDetokenizer(self.tokenizer.decode)
        eos = set() if sampling.ignore_eos else set(self.tokenizer.eos_ids)
        gen = state.token_ids
        try:
            token = sampler(logits)
        except NonFiniteLogits as exc:
            state.no_token(exc)
            return
        stage(Stage.DECODING)
        while True:
            now = time.perf_counter()
            if not gen:
                state.t_first = now
            state.t_last = now
            gen.append(token)
            conv.append_token(token)
            sampler.accept(token)
            if token in eos:
                state.finish = FinishReason.STOP
                return
            delta = detok.add(token)
            yield StreamEvent(delta, token)
            if len(gen) >= sampling.max_tokens:
                state.finish = FinishReason.LENGTH
                return
            if len(conv.token_ids) >= self.config.max_model_len:
                state.finish = FinishReason.CONTEXT_FULL
                return
            if self.cancel.is_set():
                state.finish = FinishReason.CANCELLED
                return
            if deadline is not None and time.perf_counter() >= deadline:
                state.finish = FinishReason.TIMEOUT
                return
            context = len(conv.token_ids)
            if not kv.extend(conv, context):
                log.warning('KV pool exhausted: answer truncated after %d tokens', len(gen))
                state.finish = FinishReason.KV_EXHAUSTED
                return
            # Under a CUDA graph the token mask is applied inside the graph (greedy: the argmax
            # too, then one 8-byte copy); a grammar's mask is computed while the GPU runs.
            try:
                token = runner.decode_sample(token, next_pos + len(gen) - 1, conv.block_table,
                                             context, sampler)
            except NonFiniteLogits as exc:
                state.no_token(exc)
                return
            kv.kv_written(conv, context)

    def _prefill_stopped(self, state: TurnState, deadline: float | None) -> bool:
        # Whether cancel() or the deadline ends the turn before its first token.
        if self.cancel.is_set():
            state.finish = FinishReason.CANCELLED
        elif deadline is not None and time.perf_counter() >= deadline:
            state.finish = FinishReason.TIMEOUT
        return state.finish is not None

    def close_turn(self, conv: Conversation, state: TurnState, before) -> None:
        """Settle a turn that ended without an exception; ``state.result`` is its result.

        An answer (finished, cut short or cancelled) stays in the history, closed with
        <|im_end|>; a failed one (its grammar reached a dead end, or its JSON cannot be
        parsed) leaves none (:meth:`roll_back` to ``before``).
        """
        state.finish = state.finish or FinishReason.CANCELLED
        state.tail = state.detok.flush() if state.detok else ''
        text = state.detok.text if state.detok else ''
        valid = parsed = None
        if state.grammar is not None:
            valid = state.finish == FinishReason.STOP and state.grammar.complete
            try:
                parsed = parse_answer(state.response_format, text) if valid else None
            except ValueError as exc:
                state.finish, state.error, valid = FinishReason.ERROR, str(exc), False
        out = state.shape.outcome(state.finish, text, parsed, self.tokenizer.eos_ids)
        state.finish, state.error = out.finish, state.error or out.error
        if state.finish == FinishReason.ERROR:
            self.roll_back(conv, before)
        else:
            conv.close_turn(out.content, self.tokenizer.im_end_id, out.tool_calls)
            self.kv.finish(conv)
        gen = state.token_ids
        decode_s = state.t_last - state.t_first
        state.result = ChatResult(
            text=text,
            token_ids=list(gen),
            prompt_token_ids=state.prompt_ids,
            prompt_images=state.images,
            prompt_videos=state.videos,
            finish_reason=state.finish,
            cached_tokens=state.cached,
            ttft_s=(state.t_first - state.t0) if gen else 0.0,
            decode_tok_s=(len(gen) - 1) / decode_s if len(gen) > 1 and decode_s > 0 else 0.0,
            vision_s=state.vision_s,
            dropped_turns=state.dropped,
            error=state.error,
            valid=valid,
            parsed=parsed,
            tool_calls=out.tool_calls,
            detections=out.detections,
        )

    def roll_back(self, conv: Conversation, before) -> None:
        """Leave no trace of a failed turn: ``conv``'s history is ``before``'s again.

        The conversation's blocks go back to the pool (hashed ones stay cached, so the
        restored history's prefix still hits); turns dropped to make room come back.
        """
        self.kv.finish(conv)
        self.kv.release(conv)
        conv.restore(before)
