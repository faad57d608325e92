# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""LLMEngine: conversations, ``chat`` / ``chat_stream``, ``cancel``, ``reset``, ``stats``.

Single-threaded: one generation at a time, run by the caller's thread. ``cancel()`` is the one
call another thread may make (a flag checked before every step); ``check_system_prompt()``
reads nothing that a turn changes. Any other call made while one runs (on another thread, or
while a ``chat_stream`` generator is left open) raises ``RuntimeError`` (``thread_guard``).
"""

from dataclasses import asdict, dataclass, field
import logging
import math
import threading
import time
import weakref

import numpy as np
import torch

from orin_llm_node.models import VisionOutput, load_model
from orin_llm_node.models.loader import check_stop
from orin_llm_node.processing import (
    ChatTemplate,
    ImageProcessor,
    PromptBuilder,
    Tokenizer,
    VideoClip,
    VideoProcessor,
    VideoRef,
)
from orin_llm_node.processing.tools import check_tool_choice, check_tools
from orin_llm_node.quantization import model_weight_bytes

from .answer_shape import AnswerShape
from .block_pool import BlockPool
from .config import EngineConfig, SamplingParams
from .conversation import Conversation
from .detokenizer import IncrementalDetokenizer
from .finish_reason import FinishReason
from .kv_manager import KVBlocks, KVCacheManager, PoolStats
from .memory_plan import MemoryPlanError, plan_memory
from .model_runner import ModelRunner
from .sampler import NonFiniteLogits, Sampler
from .structured import (
    GrammarDeadEnd,
    GrammarTokenizer,
    check_response_format,
    parse_answer,
    structured_available,
)
from .thread_guard import SingleThreadGuard
from .tool_calls import ToolCalls
from .vision_cache import VisionCache

__all__ = ["ChatResult", "EngineStats", "LLMEngine", "StreamEvent"]

log = logging.getLogger(__name__)

#: Camera frame sizes (height, width) ``warmup`` prepares when given none: VGA, the 16:9
#: sizes of common depth/colour cameras, and a square crop.
COMMON_FRAME_SIZES = ((480, 640), (480, 848), (720, 1280), (1080, 1920), (448, 448))


@dataclass(frozen=True)
class EngineStats(PoolStats):
    """``PoolStats`` (the KV cache manager's) and the vision cache's own figures."""

    vision_cache_hits: int
    vision_cache_misses: int


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


@dataclass
class StreamEvent:
    """One step of ``chat_stream``: a text delta, and on the last event the ``ChatResult``."""

    delta: str
    token_id: int | None = None
    result: ChatResult | None = None


class LLMEngine:
    """Qwen3-VL on a paged KV cache with a prefix cache across turns."""

    def __init__(self, config: EngineConfig, should_stop=None):
        """Load ``config.model_path`` and size the KV pool.

        ``should_stop`` (a callable, e.g. a stop flag's ``is_set``) is asked between shards and
        tensors; ``LoadInterrupted`` is raised when it answers True.
        """
        self.config = config
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        path = config.model_path
        # Before a weight is read: a checkpoint that cannot fit is one clear line, not an
        # out-of-memory kill halfway through loading (Jetson: unified memory).
        self.memory_plan = plan_memory(config, self.device, self.dtype)
        if not self.memory_plan.fits:
            raise MemoryPlanError(self.memory_plan.refusal())
        self.model = load_model(path, dtype=self.dtype, device=self.device,
                                quantization=config.quantization,
                                should_stop=should_stop).eval()
        self._weight_bytes = model_weight_bytes(self.model)
        mcfg = self.model.config
        self.tokenizer = Tokenizer.from_pretrained(path)
        image_processor = ImageProcessor.from_pretrained(path).capped(
            max_pixels=config.image_max_pixels, min_pixels=config.image_min_pixels
        )
        self.prompts = PromptBuilder(
            ChatTemplate.from_pretrained(path), self.tokenizer, image_processor,
            mcfg.image_token_id, mcfg.vision.spatial_merge_size,
            VideoProcessor.from_pretrained(path).capped(config.video_max_pixels),
            mcfg.video_token_id,
        )
        num_blocks = self.memory_plan.num_blocks
        self.runner = ModelRunner(self.model, num_blocks, config.block_size,
                                  config.max_model_len, self.device, self.dtype,
                                  enable_cuda_graph=config.enable_cuda_graph,
                                  attention_backend=config.attention_backend)
        self.pool = BlockPool(num_blocks, config.block_size, self.runner.bytes_per_block,
                              config.block_order_seed)
        self.kv = KVCacheManager(self.pool, config.max_model_len, config.enable_prefix_cache)
        self.vision_cache = VisionCache(int(config.vision_cache_mb * 2**20))
        self._banned = {mcfg.image_token_id, mcfg.video_token_id,
                        mcfg.vision_start_token_id, mcfg.vision_end_token_id}
        self._grammar_tokenizer = None  # built at warm-up or by the first constrained answer
        self._cancel = threading.Event()
        self._guard = SingleThreadGuard()
        # Every live conversation (for reset()); a weak map, so dropping one frees it.
        self._conversations: weakref.WeakValueDictionary[int, Conversation] = (
            weakref.WeakValueDictionary())
        per_block = self.runner.bytes_per_block
        log.info(
            "KV cache on %s (%s): %d blocks x %d tokens, %d bytes per block, %.1f MiB, "
            "holds at most %d tokens (max_model_len %d)",
            self.device, str(self.dtype).replace("torch.", ""), num_blocks, config.block_size,
            per_block, num_blocks * per_block / 2**20, num_blocks * config.block_size,
            config.max_model_len,
        )

    # ---- public API ------------------------------------------------------------------------

    @property
    def uses_cuda_graph(self) -> bool:
        """Whether decode steps replay a captured CUDA graph (not merely enabled)."""
        return self.runner.cuda_graph_active

    @property
    def attention_backend(self) -> str:
        """Which attention runs: ``cuda`` (the CuPy kernels) or ``torch``."""
        return self.runner.attn.name

    @property
    def backend_fallback_reason(self) -> str | None:
        """Why ``attention_backend: auto`` runs torch on a CUDA device (None: no fallback)."""
        return self.runner.backend_fallback_reason

    @property
    def weight_format(self) -> str:
        """How the weights are held: the dtype name, or the quantized layers' source and format.

        E.g. ``bfloat16``, ``at-load:int4``, ``compressed-tensors:int4-asym``, ``fp8:fp8``.
        """
        return self.model.weight_format

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's weights on the device (codes, scales and float parameters)."""
        return self._weight_bytes

    def new_conversation(self, system_prompt: str | None = None) -> Conversation:
        """Start a conversation; the system prompt's blocks are shared through the cache.

        ``ValueError`` (see ``check_system_prompt``) for a system prompt no turn could follow.
        """
        with self._guard.hold("new_conversation"):
            conv = Conversation(self._system_piece(system_prompt), KVBlocks())
            self.kv.track(conv)
            self._conversations[conv.id] = conv
            return conv

    def check_system_prompt(self, system_prompt: str | None) -> None:
        """Raise ``ValueError`` saying why ``system_prompt`` cannot lead a usable conversation.

        Refused: text that is not a str or not valid Unicode, text the chat template cannot
        render as it is, and a prompt that leaves no room, within ``max_model_len`` or the KV
        pool, for the shortest user turn and one answer token. Control-token strings in it are
        not refused: they are tokenized as text. Any thread may call it (it reads only the
        template, the tokenizer and the configuration), e.g. to check a new value while a
        turn runs.
        """
        self._system_piece(system_prompt)

    def check_response_format(self, response_format) -> None:
        """Raise ``ValueError`` saying why ``response_format`` cannot constrain an answer.

        The check an answer makes before its turn opens: the shape, then the grammar compiled
        against this checkpoint's vocabulary (``StructuredUnavailable`` without llguidance).
        Any thread may call it, as ``check_system_prompt`` (after ``warmup`` the vocabulary is
        indexed; each call compiles a fresh matcher and touches no engine state).
        """
        self._grammar_for(check_response_format(response_format))

    def check_tools(self, tools, tool_choice=None) -> None:
        """Raise ``ValueError`` saying why ``tools`` (with ``tool_choice``) cannot be offered.

        The checks a turn makes before it opens: the shapes (``processing/tools.py``), this
        checkpoint's tool tokens, the tools' text, every tool's schema compiled against the
        vocabulary. Any thread may call it, as ``check_response_format``.
        """
        tools = check_tools(tools)
        choice = check_tool_choice(tool_choice, tools)
        if tools is not None:
            ToolCalls(tools, choice, self._index_vocabulary(), self.tokenizer)

    def _system_piece(self, system_prompt, tools=None):
        if system_prompt is None and tools is None:
            return self.prompts.system_piece(None)
        if system_prompt is not None:
            _check_text("system prompt", system_prompt)
        piece = self.prompts.system_piece(system_prompt, tools)
        shortest = len(piece.token_ids) + len(
            self.prompts.user_turn(piece.messages, "", [], tools=tools).token_ids)
        if shortest >= self.config.max_model_len:
            raise ValueError(
                f"the system prompt takes {len(piece.token_ids)} tokens: with the shortest user "
                f"turn that is {shortest} tokens, no room for an answer within max_model_len "
                f"{self.config.max_model_len}")
        blocks = math.ceil(shortest / self.config.block_size)
        if blocks > self.pool.num_blocks:
            raise ValueError(
                f"the system prompt takes {len(piece.token_ids)} tokens: with the shortest user "
                f"turn that needs {blocks} KV blocks, the pool has {self.pool.num_blocks}")
        return piece

    def warmup(self, image_sizes=None, video_sizes=(), should_stop=None) -> float:
        """Do at start-up what would otherwise stall the first prompts; returns the seconds.

        Runs the vision tower once per distinct patch grid of ``image_sizes`` (``(height,
        width)`` of the camera frames, default ``COMMON_FRAME_SIZES``; each is resized as a
        real frame would be, within ``image_max_pixels``) and of ``video_sizes`` (``(frames,
        height, width)`` of the clips to come, after sampling at the model's fps; sized as a
        real clip, within ``video_max_pixels``), which keeps the grid's position embeddings
        and rotary and, on a GPU, loads the tower's kernels for that shape; then captures the
        bucketed prefill graphs (CUDA only), and indexes the vocabulary for constrained
        decoding when llguidance is installed (1-3 s at 151,936 tokens). Call it on the thread
        that will run the engine; nothing is added to the vision or prefix caches.
        ``should_stop`` (a callable) is asked before each step; ``LoadInterrupted`` is raised
        when it answers True.
        """
        with self._guard.hold("warmup"):
            return self._warmup(COMMON_FRAME_SIZES if image_sizes is None else image_sizes,
                                video_sizes, should_stop)

    def _warmup(self, image_sizes, video_sizes, should_stop) -> float:
        t0 = time.perf_counter()
        processor, video = self.prompts.image_processor, self.prompts.video_processor
        # The grid follows from the size alone (no frame is built, resized or patched): the
        # tower runs once per distinct grid on zero patches, its values do not matter.
        p, t = processor.patch_size, processor.temporal_patch_size
        grids = {(1, h // p, w // p) for h, w in
                 (processor.target_size(int(h), int(w)) for h, w in image_sizes)}
        for n, height, width in video_sizes:
            h, w = video.target_size(int(n), int(height), int(width))
            grids.add((-(-int(n) // video.temporal_patch_size), h // video.patch_size,
                       w // video.patch_size))
        for grid in grids:
            check_stop(should_stop, "warming up the vision tower")
            self.runner.encode_image(
                torch.zeros(grid[0] * grid[1] * grid[2], 3 * t * p * p), grid)
        check_stop(should_stop, "warming up")
        self.runner.capture_prefill_graphs()
        if structured_available():
            check_stop(should_stop, "warming up")
            self._index_vocabulary()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        log.info("warm-up: %d vision grid(s) %s, prefill graphs %s, %.2f s", len(grids),
                 sorted(grids), "captured" if self.runner.prefill_graphs else "off", seconds)
        return seconds

    def cancel(self) -> None:
        """Stop the generation in progress at its next step (thread-safe)."""
        self._cancel.set()

    def reset(self, conv: Conversation | None = None) -> None:
        """Forget ``conv``'s history (every conversation's when None); keeps its system prompt.

        The blocks go back to the pool tail first, so hashed ones stay reusable as cache.
        """
        with self._guard.hold("reset"):
            self.kv.collect()
            for c in list(self._conversations.values()) if conv is None else [conv]:
                self.kv.release(c)
                c.reset()

    def stats(self) -> EngineStats:
        """Block pool counts, prefix-cache and exhaustion counters, vision-cache hits.

        Allowed between the steps of this thread's own ``chat_stream``.
        """
        self._guard.peek("stats")
        return EngineStats(**asdict(self.kv.stats()), vision_cache_hits=self.vision_cache.hits,
                           vision_cache_misses=self.vision_cache.misses)

    def chat(self, conv: Conversation, text=None, images=None,
             sampling: SamplingParams | None = None, *, videos=None,
             tool_results=None) -> ChatResult:
        """Answer a user message in ``conv``; see ``ChatResult``.

        The message is ``images`` (RGB uint8 ``H x W x 3`` arrays), then ``videos``
        (``VideoClip``s), then ``text``, as the chat template renders a content list. ``text``
        may also be a list of parts -- ``str``, image arrays, ``VideoClip``s -- rendered in
        that order (e.g. ``["front camera:", img1, "wrist camera:", img2, "What moved?"]``).

        ``tool_results`` (``[{"id", "content"}]``, content a ``str`` or a list of parts as
        ``text``) answer the calls of the conversation's last answer: rendered as the template
        renders tool responses, in the calls' order, before the message (``text`` may then be
        None: no message). ``SamplingParams.detect`` without ``text`` asks its grounding
        prompt; its turn holds exactly one image.
        """
        result = None
        for event in self.chat_stream(conv, text, images, sampling, videos=videos,
                                      tool_results=tool_results):
            result = event.result
        return result

    def chat_stream(self, conv: Conversation, text=None, images=None,
                    sampling: SamplingParams | None = None, *, videos=None, tool_results=None):
        """Like ``chat``, yielding ``StreamEvent``s with text deltas; the last carries the result.

        Invalid input (text, images, clips, sampling values, a ``response_format`` the library
        rejects or cannot take because it is not installed) raises ``ValueError`` before
        anything changes; running out of context or KV blocks never raises: ``finish_reason``
        says what happened (a clip longer than the context is refused with ``context_full``).
        A turn that fails leaves the conversation as it was before it, its KV blocks back in
        the pool: a grammar that reaches a dead end mid-answer ends it with ``finish_reason
        "error"`` and the reason in ``error``; any exception is raised after the rollback. A
        stream closed early keeps its answer so far (``cancelled``). The generator holds the
        engine from its first step to its end (or ``close()``): see the module docstring.
        """
        with self._guard.hold("chat_stream"):
            yield from self._chat_stream(conv, text, images, sampling, videos, tool_results)

    # ---- internals -------------------------------------------------------------------------

    def _chat_stream(self, conv, text, images, sampling, videos, tool_results):
        t0 = time.perf_counter()
        self._cancel.clear()
        sampling = sampling or SamplingParams()
        if isinstance(text, (list, tuple)):  # interleaved parts: text, images, clips
            for part in text:
                if isinstance(part, str):
                    _check_text("text", part)
        elif text is not None:  # None: no message (AnswerShape says when that is wrong)
            _check_text("text", text)
        for result in tool_results if isinstance(tool_results, (list, tuple)) else []:
            content = result.get("content") if isinstance(result, dict) else None
            for part in content if isinstance(content, (list, tuple)) else [content]:
                if isinstance(part, str):
                    _check_text("tool result", part)
        if isinstance(images, np.ndarray):
            raise ValueError("images must be a list of H x W x 3 uint8 arrays, got one bare "
                             "array (pass [image])")
        if isinstance(videos, VideoClip):
            raise ValueError("videos must be a list of VideoClips, got one bare clip "
                             "(pass [clip])")
        for clip in videos or []:
            if not isinstance(clip, VideoClip):
                raise ValueError(f"videos must hold VideoClips, got {type(clip).__name__}")
        # SamplingParams is a plain dataclass: a value changed after construction is checked
        # here, before the turn opens.
        sampling.validate()
        shape = AnswerShape.build(conv, text, images, sampling, tool_results, self._grammar_for,
                                  self._index_vocabulary, self.tokenizer)
        sampler = Sampler(sampling, self.device, self._banned, shape.grammar)
        system = None
        if shape.tools_changed:
            system = self._system_piece(conv.system_prompt, shape.tools)
        turn = self.prompts.user_turn(conv.messages(), shape.text, list(images or []),
                                      list(videos or []), tools=shape.tools,
                                      tool_results=shape.tool_results)
        before = conv.checkpoint()
        try:
            if system is not None:  # other tools: a new system turn (the cache misses from it)
                self.kv.release(conv)
                conv.replace_system(system, shape.tools)
            plan = self.kv.admit(conv, turn, sampling.max_tokens)
        except BaseException:
            self._roll_back(conv, before)
            raise
        if plan.refused:
            result = self._refused(conv, turn, plan)
            if system is not None:
                self._roll_back(conv, before)
            yield StreamEvent("", result=result)
            return
        state = _TurnState(t0, conv.num_kv_tokens, plan.drop)
        state.shape = shape
        if shape.tool_calls is None:
            state.response_format, state.grammar = shape.response_format, shape.grammar
        try:
            yield from self._generate(conv, sampler, state, turn.pixel_values)
        except GrammarDeadEnd as exc:
            state.finish, state.error = FinishReason.ERROR, str(exc)
        except GeneratorExit:  # the stream was closed early: a cancelled answer, kept
            self._close_turn(conv, state, before)
            raise
        except BaseException:
            self._roll_back(conv, before)
            raise
        self._close_turn(conv, state, before)
        yield StreamEvent(state.tail, result=state.result)

    def _grammar_for(self, response_format):
        # A fresh matcher for this answer (None when unconstrained).
        if not response_format:
            return None
        return self._index_vocabulary().grammar(response_format)

    def _index_vocabulary(self) -> GrammarTokenizer:
        # The library's view of the tokenizer, built once (StructuredUnavailable without it).
        if self._grammar_tokenizer is None:
            t0 = time.perf_counter()
            self._grammar_tokenizer = GrammarTokenizer(
                self.config.model_path / "tokenizer.json", self.model.config.text.vocab_size,
                self.tokenizer.eos_ids, banned_ids=self._banned)
            log.info("constrained decoding: vocabulary indexed in %.2f s",
                     time.perf_counter() - t0)
        return self._grammar_tokenizer

    def _refused(self, conv, turn, plan) -> ChatResult:
        log.warning("prompt not run (%s): %s", plan.refused, plan.reason)
        tokens, spans = conv.without_oldest(0, turn)
        images, videos = _prompt_media(spans)
        return ChatResult("", [], tokens, images, plan.refused, prompt_videos=videos,
                          error=plan.reason)

    def _vision_rows(self, spans, start: int, fresh) -> tuple[VisionOutput | None, float]:
        # Vision rows of every image or video pad at or after token index ``start``, in order.
        # A prefix hit may end inside an image or clip: its uncached pads still need their
        # rows. ``fresh``: the new turn's pixel patches by key; older media are patched again.
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
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return parts[0], time.perf_counter() - t0

    def _generate(self, conv: Conversation, sampler: Sampler, state: "_TurnState", pixels):
        kv, runner, sampling = self.kv, self.runner, sampler.params
        prompt = list(conv.token_ids)
        spans = conv.media_spans()
        state.prompt_ids = prompt
        state.images, state.videos = _prompt_media(spans)
        positions, next_pos = self.prompts.positions(prompt, spans)
        deadline = None if sampling.timeout_s is None else state.t0 + sampling.timeout_s
        # The deadline and cancel() cover the prefill too: checked before the vision tower,
        # after it and between prefill chunks (the KV of the chunks done is kept: a later turn
        # reuses it).
        if self._prefill_stopped(state, deadline):
            return
        visual, state.vision_s = self._vision_rows(spans, state.cached, pixels)
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
            if self._cancel.is_set():
                state.finish = FinishReason.CANCELLED
                return
            if deadline is not None and time.perf_counter() >= deadline:
                state.finish = FinishReason.TIMEOUT
                return
            context = len(conv.token_ids)
            if not kv.extend(conv, context):
                log.warning("KV pool exhausted: answer truncated after %d tokens", len(gen))
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

    def _prefill_stopped(self, state: "_TurnState", deadline: float | None) -> bool:
        # Whether cancel() or the deadline ends the turn before its first token.
        if self._cancel.is_set():
            state.finish = FinishReason.CANCELLED
        elif deadline is not None and time.perf_counter() >= deadline:
            state.finish = FinishReason.TIMEOUT
        return state.finish is not None

    def _close_turn(self, conv: Conversation, state: "_TurnState", before) -> None:
        # Runs whatever ended the turn but an exception: an answer (finished, cut short or
        # cancelled) stays in the history, closed with <|im_end|>; a failed one (its grammar
        # reached a dead end, or its JSON cannot be parsed) leaves none.
        state.finish = state.finish or FinishReason.CANCELLED
        state.tail = state.detok.flush() if state.detok else ""
        text = state.detok.text if state.detok else ""
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
            self._roll_back(conv, before)
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

    def _roll_back(self, conv: Conversation, before) -> None:
        # A failed turn leaves no trace: the conversation's blocks go back to the pool (hashed
        # ones stay cached, so the restored history's prefix still hits) and its history is
        # ``before``'s again (turns dropped to make room for the turn included).
        self.kv.finish(conv)
        self.kv.release(conv)
        conv.restore(before)


def _check_text(what: str, text) -> None:
    # ValueError unless ``text`` is a str that encodes to UTF-8 (no lone surrogates).
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode: lone surrogate {text[exc.start]!r} "
                         f"at index {exc.start}") from None


def _prompt_media(spans) -> tuple[list[np.ndarray], list[VideoClip]]:
    # The images and the clips of a prompt's media spans, each in prompt order.
    images = [ref.rgb for _, ref in spans if not isinstance(ref, VideoRef)]
    videos = [ref.clip for _, ref in spans if isinstance(ref, VideoRef)]
    return images, videos


class _TurnState:
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
        self.shape: AnswerShape | None = None
        self.tail = ""
        self.error: str | None = None
        self.result: ChatResult | None = None

    def no_token(self, exc: NonFiniteLogits) -> None:
        """End the answer: a step's logits left nothing to pick (the engine goes on)."""
        log.warning("answer ended after %d tokens: %s", len(self.token_ids), exc)
        self.finish, self.error = FinishReason.ERROR, str(exc)

