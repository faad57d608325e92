# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The KV cache manager: admits turns, keeps each conversation's KV books, walks the ladder.

Before a turn runs, ``plan`` decides (without changing anything) how much of the oldest history
must go and which blocks the prompt reuses; ``admit`` applies it. The ladder, never a crash:

1. evict cached blocks, least recently released first (``BlockPool.allocate`` does it);
2. release the blocks of the least recently used *idle* conversations (not generating): they
   become cached, so such a conversation that returns still hits its prefix unless evicted;
3. drop the oldest turns of the active conversation in large chunks (the older half of what is
   left each time; the system prompt stays) when ``max_model_len`` or the pool would overflow;
4. truncate the generation when the pool runs dry mid-answer (``finish_reason="kv_exhausted"``);
5. reject the prompt when even its own tokens cannot be held.

The manager is the one writer of every conversation's ``KVBlocks`` and of the pool and
prefix-cache figures in ``PoolStats`` (the pool itself counts its evictions). A conversation
that is garbage-collected gives its blocks back at the manager's next ``admit`` or ``collect``:
its finalizer only queues its id, so it is safe whichever thread the collector runs on.
"""

from collections import OrderedDict, deque
from dataclasses import dataclass, field
import math
import weakref

from orin_llm_node.processing import PromptPiece

from .block_hash import chained_hashes
from .block_pool import BlockPool
from .conversation import Conversation
from .finish_reason import FinishReason


class KVBlocks:
    """The KV blocks of one conversation (its block table); written by the manager only.

    ``ids``: the block table; ``hashes``: hashes of its leading full blocks; ``num_tokens``:
    how many leading tokens of the history have K/V in those blocks.
    """

    __slots__ = ('ids', 'hashes', 'num_tokens')

    def __init__(self):
        self.ids: list[int] = []
        self.hashes: list[bytes] = []
        self.num_tokens = 0


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the block pool, the prefix cache and every exhaustion-ladder counter."""

    total_blocks: int
    free_blocks: int
    cached_blocks: int
    used_blocks: int
    block_size: int
    bytes_per_block: int
    usage_pct: float
    prefix_hits: int
    prefix_misses: int
    prefix_hit_rate: float
    evictions: int
    exhaustion_events: int
    truncated_generations: int
    rejected_prompts: int
    dropped_turns: int
    idle_releases: int  # idle conversations whose blocks were released to make room


@dataclass
class TurnPlan:
    """What admitting a turn takes: turns to drop, prefix blocks to reuse, or why it cannot run.

    ``refused``: None when the turn can run, else the finish reason of the refusal
    (``context_full`` or ``kv_exhausted``) with ``reason`` saying why.
    """

    refused: str | None = None
    prompt_len: int = 0
    drop: int = 0
    pool_drop: bool = False  # the drop was forced by the pool, not by max_model_len
    keep_kv: bool = False  # the conversation's own blocks are the prefix
    hits: list[int] = field(default_factory=list)
    hit_hashes: list[bytes] = field(default_factory=list)
    shortfall: int = 0  # blocks missing for the whole answer without a pool-forced drop
    reason: str = ''


def drop_levels(num_turns: int) -> list[int]:
    """Candidate counts of oldest turns to drop: 0, then the older half of what is left, ..."""
    levels, k = [0], 0
    while k < num_turns:
        k += max(1, (num_turns - k + 1) // 2)
        levels.append(k)
    return levels


class KVCacheManager:
    """Applies the admission policy to one conversation at a time over a ``BlockPool``."""

    def __init__(self, pool: BlockPool, max_model_len: int, enable_prefix_cache: bool = True):
        self.pool = pool
        self.block_size = pool.block_size
        self.max_model_len = max_model_len
        self.enable_prefix_cache = enable_prefix_cache
        # Prompt tokens served from the cache / computed, and the ladder's steps (PoolStats names).
        self._counts = dict.fromkeys(
            ('prefix_hits', 'prefix_misses', 'exhaustion_events', 'truncated_generations',
             'rejected_prompts', 'dropped_turns', 'idle_releases'), 0)
        # Conversations holding blocks, least recently admitted first; those generating now.
        self._holders: OrderedDict[int, KVBlocks] = OrderedDict()
        self._busy: set[int] = set()
        # Ids of garbage-collected conversations, queued by their finalizers.
        self._collected: deque[int] = deque()

    def stats(self) -> PoolStats:
        """Snapshot of the pool's counts and of the manager's counters (changes nothing)."""
        pool, counts = self.pool, self._counts
        queried = counts['prefix_hits'] + counts['prefix_misses']
        return PoolStats(
            total_blocks=pool.num_blocks,
            free_blocks=pool.num_free,
            cached_blocks=pool.num_cached,
            used_blocks=pool.num_used,
            block_size=pool.block_size,
            bytes_per_block=pool.bytes_per_block,
            usage_pct=100.0 * pool.num_used / pool.num_blocks,
            prefix_hit_rate=counts['prefix_hits'] / queried if queried else 0.0,
            evictions=pool.evictions,
            **counts,
        )

    # ---- conversations ---------------------------------------------------------------------

    def track(self, conv: Conversation) -> None:
        """Give ``conv``'s blocks back once it is garbage-collected (at the next ``collect``)."""
        weakref.finalize(conv, self._collected.append, conv.id).atexit = False

    def collect(self) -> None:
        """Release the blocks of the conversations collected since the last call."""
        while self._collected:
            kv = self._holders.pop(self._collected.popleft(), None)
            if kv is not None:
                self._give_back(kv)

    def _release_idle(self, active: Conversation, blocks: int) -> bool:
        # Release least recently used idle conversations until ``blocks`` more blocks are
        # available (or none is left); False when there was nothing to release.
        goal = self.pool.num_available + blocks
        idle = [cid for cid in self._holders if cid != active.id and cid not in self._busy]
        for cid in idle:
            if self.pool.num_available >= goal:
                break
            self._give_back(self._holders.pop(cid))
            self._counts['idle_releases'] += 1
        return bool(idle)

    # ---- planning (pure) -------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _lookup(self, tokens: list[int], spans):
        """Longest run of cached full blocks of a prompt (never covering its last token)."""
        hits, hashes = [], []
        if not self.enable_prefix_cache:
            return hits, hashes
        for h in chained_hashes(tokens[:-1], spans, self.block_size, 0, None):
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
            hashes.append(h)
        return hits, hashes

    def _evaluate(self, conv: Conversation, drop: int, turn: PromptPiece, max_tokens: int):
        tokens, spans = conv.without_oldest(drop, turn)
        plan = TurnPlan(prompt_len=len(tokens), drop=drop)
        own = conv.kv.ids
        if drop == 0 and own:
            plan.keep_kv = True
            held, available = len(own), self.pool.num_available
        else:
            released = {b for b in own if self.pool.ref_count(b) == 1}
            plan.hits, plan.hit_hashes = self._lookup(tokens, spans)
            held = len(plan.hits)
            revived = sum(1 for b in plan.hits if b in released or self.pool.ref_count(b) == 0)
            available = self.pool.num_available + len(released) - revived
        answer = max(1, min(max_tokens, self.max_model_len - len(tokens)))
        need_prompt = self._blocks(len(tokens)) - held
        need_full = self._blocks(len(tokens) + answer - 1) - held
        return plan, need_prompt - available, need_full - available

    def plan(self, conv: Conversation, turn: PromptPiece, max_tokens: int) -> TurnPlan:
        """Decide how to admit ``turn`` into ``conv`` (changes nothing)."""
        history = conv.turn_lengths()
        newest = history[0] + len(turn.token_ids)
        if newest >= self.max_model_len:
            return TurnPlan(
                FinishReason.CONTEXT_FULL, prompt_len=newest,
                reason=f'the prompt alone takes {newest} tokens; max_model_len is '
                       f'{self.max_model_len}',
            )
        levels = drop_levels(conv.num_turns)
        # Fewest dropped turns that leave room for the whole answer within max_model_len.
        context_level = next(
            (k for k in levels
             if sum(history) - sum(history[1:1 + k]) + len(turn.token_ids) + max_tokens
             <= self.max_model_len),
            levels[-1],
        )
        shortfall = None
        for k in levels[levels.index(context_level):]:
            plan, prompt_short, answer_short = self._evaluate(conv, k, turn, max_tokens)
            if shortfall is None:
                shortfall = max(0, answer_short)
            plan.shortfall = shortfall
            if answer_short <= 0:
                plan.pool_drop = k > context_level
                return plan
        if prompt_short <= 0:  # the prompt fits, not the whole answer: it may be truncated
            plan.pool_drop = plan.drop > context_level
            return plan
        return TurnPlan(
            FinishReason.KV_EXHAUSTED, prompt_len=plan.prompt_len, shortfall=shortfall,
            reason=f'KV pool exhausted: the prompt needs {self._blocks(plan.prompt_len)} blocks '
                   f'of {self.block_size} tokens, {self.pool.num_available} are available '
                   f'of {self.pool.num_blocks}',
        )

    # ---- applying --------------------------------------------------------------------------

    def admit(self, conv: Conversation, turn: PromptPiece, max_tokens: int) -> TurnPlan:
        """Plan ``turn`` and, unless refused, open it in ``conv`` with the prompt's blocks.

        Idle conversations give way first when the pool is short; then the planned turns are
        dropped, the cached prefix reused and the rest of the prompt's blocks allocated;
        ``conv.num_kv_tokens`` is then the prefix-cache hit length. Until ``finish(conv)``,
        ``conv`` is generating and never gives way.
        """
        self.collect()
        plan = self.plan(conv, turn, max_tokens)
        while plan.shortfall and self._release_idle(conv, plan.shortfall):
            plan = self.plan(conv, turn, max_tokens)
        if plan.refused:
            if plan.refused == FinishReason.KV_EXHAUSTED:
                self._counts['rejected_prompts'] += 1
                self._counts['exhaustion_events'] += 1
            return plan
        kv = conv.kv
        if plan.drop:
            self.release(conv)
            conv.drop_oldest(plan.drop)
            self._counts['dropped_turns'] += plan.drop
        if plan.pool_drop:
            self._counts['exhaustion_events'] += 1
        conv.open_turn(turn)
        if not plan.keep_kv:
            for block in plan.hits:
                self.pool.acquire(block)
            kv.ids = list(plan.hits)
            kv.hashes = list(plan.hit_hashes)
            kv.num_tokens = len(plan.hits) * self.block_size
        self._counts['prefix_hits'] += kv.num_tokens
        self._counts['prefix_misses'] += plan.prompt_len - kv.num_tokens
        if not self._reserve(kv, plan.prompt_len):
            raise RuntimeError('KV pool changed between plan and admit')  # single-threaded
        self._holders[conv.id] = kv
        self._holders.move_to_end(conv.id)
        self._busy.add(conv.id)
        return plan

    def finish(self, conv: Conversation) -> None:
        """The turn of ``conv`` has ended: it is idle (and holds nothing without prefix cache)."""
        self._busy.discard(conv.id)
        if not self.enable_prefix_cache:
            self.release(conv)

    def _reserve(self, kv: KVBlocks, num_tokens: int) -> bool:
        # Allocate blocks until ``kv`` holds room for ``num_tokens`` tokens; False when dry.
        while len(kv.ids) * self.block_size < num_tokens:
            block = self.pool.allocate()
            if block is None:
                return False
            kv.ids.append(block)
        return True

    def extend(self, conv: Conversation, num_tokens: int) -> bool:
        """Make room for ``num_tokens`` tokens before a decode step.

        Idle conversations give way first; False when the pool is still exhausted (counted as
        a truncated generation).
        """
        while not self._reserve(conv.kv, num_tokens):
            if not self._release_idle(conv, 1):
                self._counts['truncated_generations'] += 1
                self._counts['exhaustion_events'] += 1
                return False
        return True

    def kv_written(self, conv: Conversation, num_kv_tokens: int) -> None:
        """Record that the first ``num_kv_tokens`` tokens have K/V; hash newly full blocks."""
        kv = conv.kv
        kv.num_tokens = num_kv_tokens
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        full = num_kv_tokens // bs
        start = len(kv.hashes)
        if start >= full:
            return
        parent = kv.hashes[-1] if start else None
        tokens = conv.token_ids[:full * bs]
        for block, h in zip(kv.ids[start:full],
                            chained_hashes(tokens, conv.media_spans(), bs, start, parent),
                            strict=True):
            self.pool.register(block, h)
            kv.hashes.append(h)

    def release(self, conv: Conversation) -> None:
        """Hand all of ``conv``'s blocks back (tail first; hashed ones stay cached)."""
        self._holders.pop(conv.id, None)
        self._give_back(conv.kv)

    def _give_back(self, kv: KVBlocks) -> None:
        self.pool.release(kv.ids)
        kv.ids, kv.hashes, kv.num_tokens = [], [], 0
