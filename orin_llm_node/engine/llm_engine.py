# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""LLMEngine: conversations, ``chat`` / ``chat_stream``, ``cancel``, ``reset``, ``stats``.

Single-threaded: one generation at a time, run by the caller's thread. ``cancel()`` is the one
call another thread may make (a flag checked before every step); ``check_system_prompt()``
reads nothing that a turn changes. Any other call made while one runs (on another thread, or
while a ``chat_stream`` generator is left open) raises ``RuntimeError`` (``thread_guard``).
"""

from dataclasses import asdict, dataclass
import logging
import math
import threading
import time
import weakref

import torch

from orin_llm_node.models import load_model
from orin_llm_node.models.loader import check_stop
from orin_llm_node.processing import (
    ChatTemplate,
    ImageProcessor,
    PromptBuilder,
    Tokenizer,
    VideoProcessor,
)
from orin_llm_node.processing.tools import check_tool_choice, check_tools
from orin_llm_node.quantization import model_weight_bytes

from .answer_shape import AnswerShape
from .block_pool import BlockPool
from .config import EngineConfig, SamplingParams
from .conversation import Conversation
from .finish_reason import FinishReason
from .kv_manager import KVBlocks, KVCacheManager, PoolStats
from .memory_plan import MemoryPlanError, plan_memory
from .model_runner import ModelRunner
from .sampler import Sampler
from .structured import (
    GrammarDeadEnd,
    GrammarTokenizer,
    check_response_format,
    structured_available,
)
from .thread_guard import SingleThreadGuard
from .tool_calls import ToolCalls
from .turn import ChatResult, StreamEvent, TurnLoop, TurnState, check_message, check_text
from .vision_cache import VisionCache
from .warmup import COMMON_FRAME_SIZES, throwaway_turn, vision_grids

__all__ = ['ChatResult', 'EngineStats', 'LLMEngine', 'StreamEvent']

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats(PoolStats):
    """``PoolStats`` (the KV cache manager's) and the vision cache's own figures."""

    vision_cache_hits: int
    vision_cache_misses: int


class LLMEngine:
    """Qwen3-VL on a paged KV cache with a prefix cache across turns."""

    def __init__(self, config: EngineConfig, should_stop=None, *, kernel_launcher=None):
        """Load ``config.model_path`` and size the KV pool.

        ``should_stop`` (a callable, e.g. a stop flag's ``is_set``) is asked between shards and
        tensors; ``LoadInterrupted`` is raised when it answers True. ``kernel_launcher``
        builds the CUDA kernels (``kernels.backend_factory.make_attention_backend``; None:
        CuPy on a CUDA device); tests pass the CPU kernel emulator's. Use the engine in a
        ``with`` block, or call :meth:`close`, to give back what it holds.
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
                                  attention_backend=config.attention_backend,
                                  launcher=kernel_launcher)
        self.pool = BlockPool(num_blocks, config.block_size, self.runner.bytes_per_block,
                              config.block_order_seed)
        self.kv = KVCacheManager(self.pool, config.max_model_len, config.enable_prefix_cache)
        self.vision_cache = VisionCache(int(config.vision_cache_mb * 2**20))
        self._banned = {mcfg.image_token_id, mcfg.video_token_id,
                        mcfg.vision_start_token_id, mcfg.vision_end_token_id}
        self._grammar_tokenizer = None  # built at warm-up or by the first constrained answer
        self._cancel = threading.Event()
        self._guard = SingleThreadGuard()
        self._turns = TurnLoop(self, self._cancel)
        # Every live conversation (for reset()); a weak map, so dropping one frees it.
        self._conversations: weakref.WeakValueDictionary[int, Conversation] = (
            weakref.WeakValueDictionary())
        per_block = self.runner.bytes_per_block
        log.info(
            'KV cache on %s (%s): %d blocks x %d tokens, %d bytes per block, %.1f MiB, '
            'holds at most %d tokens (max_model_len %d)',
            self.device, str(self.dtype).replace('torch.', ''), num_blocks, config.block_size,
            per_block, num_blocks * per_block / 2**20, num_blocks * config.block_size,
            config.max_model_len,
        )

    # ---- public API ------------------------------------------------------------------------

    def close(self) -> None:
        """Give back what the engine holds; a closed engine refuses to run.

        Its fused kernels are no longer installed anywhere (they were only ever installed
        around its own steps), and its model, KV cache, graphs and cached vision rows are
        dropped, so their memory is freed once nothing else refers to them. Afterwards
        ``chat``, ``chat_stream``, ``new_conversation``, ``reset``, ``warmup``, ``stats`` and
        ``check_response_format`` raise ``RuntimeError``. Closing a closed engine does
        nothing; closing it while a turn runs raises ``RuntimeError``.
        """
        if self._guard.closed:
            return
        with self._guard.hold('close'):
            self.runner.close()
            self.runner = self.model = self._turns = self._grammar_tokenizer = None
            self.vision_cache = VisionCache(0)
            self._guard.close()

    def __enter__(self) -> 'LLMEngine':
        """The engine itself; :meth:`close` when the block ends."""
        return self

    def __exit__(self, *exc) -> None:
        """:meth:`close`."""
        self.close()

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
        with self._guard.hold('new_conversation'):
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
        self._guard.peek_closed('check_response_format')
        self._grammar_for(check_response_format(response_format))

    def check_tools(self, tools, tool_choice=None, system_prompt=None) -> None:
        """Raise ``ValueError`` saying why ``tools`` (with ``tool_choice``) cannot be offered.

        The checks a turn makes before it opens: the shapes (``processing/tools.py``), this
        checkpoint's tool tokens, the tools' text, every tool's schema compiled against the
        vocabulary, and the system turn they are rendered in (with ``system_prompt``) leaving
        room for a turn, as ``check_system_prompt`` requires. Any thread may call it, as
        ``check_response_format``.
        """
        self._guard.peek_closed('check_tools')
        tools = check_tools(tools)
        choice = check_tool_choice(tool_choice, tools)
        if tools is not None:
            ToolCalls(tools, choice, self._index_vocabulary(), self.tokenizer)
            self._system_piece(system_prompt, tools)

    def _system_piece(self, system_prompt, tools=None):
        if system_prompt is None and tools is None:
            return self.prompts.system_piece(None)
        if system_prompt is not None:
            check_text('system prompt', system_prompt)
        piece = self.prompts.system_piece(system_prompt, tools)
        shortest = len(piece.token_ids) + len(
            self.prompts.user_turn(piece.messages, '', [], tools=tools).token_ids)
        what = 'the system prompt' + (' and the tools take' if tools is not None else ' takes')
        if shortest >= self.config.max_model_len:
            raise ValueError(
                f'{what} {len(piece.token_ids)} tokens: with the shortest user '
                f'turn that is {shortest} tokens, no room for an answer within max_model_len '
                f'{self.config.max_model_len}')
        blocks = math.ceil(shortest / self.config.block_size)
        if blocks > self.pool.num_blocks:
            raise ValueError(
                f'{what} {len(piece.token_ids)} tokens: with the shortest user '
                f'turn that needs {blocks} KV blocks, the pool has {self.pool.num_blocks}')
        return piece

    def warmup(self, image_sizes=None, video_sizes=(), should_stop=None) -> float:
        """Do at start-up what would otherwise stall the first prompts; returns the seconds.

        Runs the vision tower once per distinct patch grid of ``image_sizes`` (``(height,
        width)`` of the camera frames, default ``COMMON_FRAME_SIZES``; each is resized as a
        real frame would be, within ``image_max_pixels``) and of ``video_sizes`` (``(frames,
        height, width)`` of the clips to come, after sampling at the model's fps; sized as a
        real clip, within ``video_max_pixels``), which keeps the grid's position embeddings
        and rotary and, on a GPU, loads the tower's kernels for that shape; then captures the
        bucketed prefill graphs (CUDA only), indexes the vocabulary for constrained decoding
        when llguidance is installed (1-3 s at 151,936 tokens), and runs one throw-away turn
        (``warmup.throwaway_turn``: a grey frame of the smallest of those image grids, or
        text alone without one; the first decode step captures the decode graph). Call it on
        the thread that will run the engine; nothing is added to the vision or prefix caches
        and no counter moves. ``should_stop`` (a callable) is asked before each step;
        ``LoadInterrupted`` is raised when it answers True.
        """
        with self._guard.hold('warmup'):
            return self._warmup(COMMON_FRAME_SIZES if image_sizes is None else image_sizes,
                                video_sizes, should_stop)

    def _warmup(self, image_sizes, video_sizes, should_stop) -> float:
        t0 = time.perf_counter()
        processor = self.prompts.image_processor
        grids = vision_grids(processor, self.prompts.video_processor, image_sizes, video_sizes)
        # The tower runs once per distinct grid on zero patches: its values do not matter.
        p, t = processor.patch_size, processor.temporal_patch_size
        for grid in grids:
            check_stop(should_stop, 'warming up the vision tower')
            self.runner.encode_image(
                torch.zeros(grid[0] * grid[1] * grid[2], 3 * t * p * p), grid)
        check_stop(should_stop, 'warming up')
        self.runner.capture_prefill_graphs()
        if structured_available():
            check_stop(should_stop, 'warming up')
            self._index_vocabulary()
        check_stop(should_stop, 'warming up')
        frames = [(g[1] * g[2], size) for g, size in grids.items() if size is not None]
        turn = throwaway_turn(self.runner, self.prompts, self.pool,
                              Sampler(SamplingParams(max_tokens=2), self.device, self._banned),
                              min(frames)[1] if frames else None, self.config.max_model_len,
                              self.config.prefill_chunk_tokens)
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        log.info('warm-up: %d vision grid(s) %s, prefill graphs %s, throw-away turn %s, %.2f s',
                 len(grids), sorted(grids), 'captured' if self.runner.prefill_graphs else 'off',
                 'run' if turn else 'skipped', seconds)
        return seconds

    def cancel(self) -> None:
        """Stop the generation in progress at its next step (thread-safe)."""
        self._cancel.set()

    def reset(self, conv: Conversation | None = None) -> None:
        """Forget ``conv``'s history (every conversation's when None); keeps its system prompt.

        The blocks go back to the pool tail first, so hashed ones stay reusable as cache.
        """
        with self._guard.hold('reset'):
            self.kv.collect()
            for c in list(self._conversations.values()) if conv is None else [conv]:
                self.kv.release(c)
                c.reset()

    def stats(self) -> EngineStats:
        """Block pool counts, prefix-cache and exhaustion counters, vision-cache hits.

        Allowed between the steps of this thread's own ``chat_stream``.
        """
        self._guard.peek('stats')
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
                    sampling: SamplingParams | None = None, *, videos=None, tool_results=None,
                    on_stage=None):
        """Like ``chat``, yielding ``StreamEvent``s with text deltas; the last carries the result.

        ``on_stage(stage)`` (optional) is called on this thread as the turn enters each
        ``turn.Stage`` (encoding images, prefill, decoding): what a caller reports as progress
        before the first token.

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
        with self._guard.hold('chat_stream'):
            yield from self._chat_stream(conv, text, images, sampling, videos, tool_results,
                                         on_stage)

    # ---- internals -------------------------------------------------------------------------

    def _chat_stream(self, conv, text, images, sampling, videos, tool_results, on_stage):
        t0 = time.perf_counter()
        self._cancel.clear()
        sampling = sampling or SamplingParams()
        check_message(text, images, videos, tool_results)
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
        loop = self._turns
        before = conv.checkpoint()
        try:
            if system is not None:  # other tools: a new system turn (the cache misses from it)
                self.kv.release(conv)
                conv.replace_system(system, shape.tools)
            plan = self.kv.admit(conv, turn, sampling.max_tokens)
        except BaseException:
            loop.roll_back(conv, before)
            raise
        if plan.refused:
            result = loop.refused(conv, turn, plan)
            if system is not None:
                loop.roll_back(conv, before)
            yield StreamEvent('', result=result)
            return
        state = TurnState(t0, conv.num_kv_tokens, plan.drop)
        state.shape = shape
        if shape.tool_calls is None:
            state.response_format, state.grammar = shape.response_format, shape.grammar
        try:
            yield from loop.generate(conv, sampler, state, turn.pixel_values, on_stage)
        except GrammarDeadEnd as exc:
            state.finish, state.error = FinishReason.ERROR, str(exc)
        except GeneratorExit:  # the stream was closed early: a cancelled answer, kept
            loop.close_turn(conv, state, before)
            raise
        except BaseException:
            loop.roll_back(conv, before)
            raise
        loop.close_turn(conv, state, before)
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
                self.config.model_path / 'tokenizer.json', self.model.config.text.vocab_size,
                self.tokenizer.eos_ids, banned_ids=self._banned)
            log.info('constrained decoding: vocabulary indexed in %.2f s',
                     time.perf_counter() - t0)
        return self._grammar_tokenizer
