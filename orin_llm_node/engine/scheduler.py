# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Admission and KV bookkeeping for the one active generation, and the exhaustion ladder.

Before a turn runs, ``plan`` decides (without changing anything) how much of the oldest history
must go and which blocks the prompt reuses; ``commit`` applies it. The ladder, never a crash:

1. evict cached blocks, least recently released first (``BlockPool.allocate`` does it);
2. drop the oldest turns of the active conversation in large chunks (the older half of what is
   left each time; the system prompt stays) when ``max_model_len`` or the pool would overflow;
3. truncate the generation when the pool runs dry mid-answer (``finish_reason="kv_exhausted"``);
4. reject the prompt when even its own tokens cannot be held.

Each step is counted in the pool's counters.
"""

from dataclasses import dataclass, field
import math

from .block_pool import BlockPool, block_hash
from .conversation import Conversation, Segment, spans_of

OK, CONTEXT_FULL, REJECTED = "ok", "context_full", "rejected"


@dataclass
class TurnPlan:
    """What admitting a turn takes: turns to drop, prefix blocks to reuse, or why it cannot run."""

    status: str
    prompt_len: int = 0
    drop: int = 0
    pool_drop: bool = False  # the drop was forced by the pool, not by max_model_len
    keep_kv: bool = False  # the conversation's own blocks are the prefix
    hits: list[int] = field(default_factory=list)
    hit_hashes: list[bytes] = field(default_factory=list)
    may_truncate: bool = False  # the prompt fits but not the whole answer
    reason: str = ""


def drop_levels(num_turns: int) -> list[int]:
    """Candidate counts of oldest turns to drop: 0, then the older half of what is left, ..."""
    levels, k = [0], 0
    while k < num_turns:
        k += max(1, (num_turns - k + 1) // 2)
        levels.append(k)
    return levels


def extra_keys(spans, start: int, end: int) -> tuple:
    """(image key, image start - block start) of every image overlapping tokens [start, end)."""
    return tuple(
        (img.key, s - start) for s, img in spans if s < end and s + img.num_tokens > start
    )


class Scheduler:
    """Applies the admission policy to one conversation at a time over a ``BlockPool``."""

    def __init__(self, pool: BlockPool, max_model_len: int, enable_prefix_cache: bool = True):
        self.pool = pool
        self.block_size = pool.block_size
        self.max_model_len = max_model_len
        self.enable_prefix_cache = enable_prefix_cache

    # ---- planning (pure) -------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _lookup(self, tokens: list[int], spans, prompt_len: int):
        """Longest run of cached full blocks of a prompt (never covering its last token)."""
        hits, hashes, parent = [], [], None
        if not self.enable_prefix_cache:
            return hits, hashes
        bs = self.block_size
        for i in range((prompt_len - 1) // bs):
            parent = block_hash(parent, tokens[i * bs:(i + 1) * bs],
                                extra_keys(spans, i * bs, (i + 1) * bs))
            block = self.pool.lookup(parent)
            if block is None:
                break
            hits.append(block)
            hashes.append(parent)
        return hits, hashes

    def _evaluate(self, conv: Conversation, drop: int, turn: Segment, max_tokens: int):
        segments = [conv.segments[0], *conv.segments[1 + drop:], turn]
        tokens = [t for seg in segments for t in seg.token_ids]
        plan = TurnPlan(OK, prompt_len=len(tokens), drop=drop)
        if drop == 0 and conv.block_table:
            plan.keep_kv = True
            held, available = len(conv.block_table), self.pool.num_available
        else:
            released = {b for b in conv.block_table if self.pool.ref_count(b) == 1}
            plan.hits, plan.hit_hashes = self._lookup(tokens, spans_of(segments), len(tokens))
            held = len(plan.hits)
            revived = sum(1 for b in plan.hits if b in released or self.pool.ref_count(b) == 0)
            available = self.pool.num_available + len(released) - revived
        answer = max(1, min(max_tokens, self.max_model_len - len(tokens)))
        need_prompt = self._blocks(len(tokens)) - held
        need_full = self._blocks(len(tokens) + answer - 1) - held
        return plan, need_prompt <= available, need_full <= available

    def plan(self, conv: Conversation, turn: Segment, max_tokens: int) -> TurnPlan:
        """Decide how to admit ``turn`` into ``conv`` (changes nothing)."""
        newest = len(conv.segments[0].token_ids) + len(turn.token_ids)
        if newest >= self.max_model_len:
            return TurnPlan(
                CONTEXT_FULL, prompt_len=newest,
                reason=f"the prompt alone takes {newest} tokens; max_model_len is "
                       f"{self.max_model_len}",
            )
        levels = drop_levels(conv.num_turns)
        history = [len(seg.token_ids) for seg in conv.segments]
        # Fewest dropped turns that leave room for the whole answer within max_model_len.
        context_level = next(
            (k for k in levels
             if sum(history) - sum(history[1:1 + k]) + len(turn.token_ids) + max_tokens
             <= self.max_model_len),
            levels[-1],
        )
        last = None
        for k in levels[levels.index(context_level):]:
            plan, prompt_fits, answer_fits = self._evaluate(conv, k, turn, max_tokens)
            if answer_fits:
                plan.pool_drop = k > context_level
                return plan
            last = (plan, prompt_fits)
        plan, prompt_fits = last
        if prompt_fits:
            plan.pool_drop = plan.drop > context_level
            plan.may_truncate = True
            return plan
        return TurnPlan(
            REJECTED, prompt_len=plan.prompt_len,
            reason=f"KV pool exhausted: the prompt needs {self._blocks(plan.prompt_len)} blocks "
                   f"of {self.block_size} tokens, {self.pool.num_available} are available "
                   f"of {self.pool.num_blocks}",
        )

    # ---- applying --------------------------------------------------------------------------

    def commit(self, conv: Conversation, turn: Segment, plan: TurnPlan) -> int:
        """Apply an OK plan: drop turns, reuse the prefix, allocate the prompt's blocks.

        Returns the number of prompt tokens whose K/V are already cached.
        """
        pool = self.pool
        if plan.drop:
            self.release(conv)
            conv.replace_segments([conv.segments[0], *conv.segments[1 + plan.drop:]])
            pool.dropped_turns += plan.drop
        if plan.pool_drop:
            pool.exhaustion_events += 1
        if plan.keep_kv:
            # K/V computed ahead for the header this turn was expected to start with: keep the
            # part that matches (never the prompt's last token, whose logits are needed).
            ahead, ids = conv.kv_ahead, turn.token_ids
            n = 0
            while n < min(len(ahead), len(ids) - 1) and ahead[n] == ids[n]:
                n += 1
            conv.num_kv_tokens += n
        conv.kv_ahead = []
        conv.segments.append(turn)
        conv.token_ids.extend(turn.token_ids)
        if not plan.keep_kv:
            for block in plan.hits:
                pool.acquire(block)
            conv.block_table = list(plan.hits)
            conv.block_hashes = list(plan.hit_hashes)
            conv.num_kv_tokens = len(plan.hits) * self.block_size
        cached = conv.num_kv_tokens
        pool.prefix_hits += cached
        pool.prefix_misses += plan.prompt_len - cached
        if not self.reserve(conv, plan.prompt_len):
            raise RuntimeError("KV pool changed between plan and commit")  # single-threaded
        return cached

    def reserve(self, conv: Conversation, num_tokens: int) -> bool:
        """Allocate blocks until ``conv`` can hold ``num_tokens`` tokens; False when exhausted."""
        while len(conv.block_table) * self.block_size < num_tokens:
            block = self.pool.allocate()
            if block is None:
                return False
            conv.block_table.append(block)
        return True

    def kv_written(self, conv: Conversation, num_kv_tokens: int) -> None:
        """Record that the first ``num_kv_tokens`` tokens have K/V; hash newly full blocks."""
        conv.num_kv_tokens = num_kv_tokens
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        full = num_kv_tokens // bs
        if len(conv.block_hashes) >= full:
            return
        spans = conv.image_spans()
        tokens = conv.token_ids
        while len(conv.block_hashes) < full:
            i = len(conv.block_hashes)
            parent = conv.block_hashes[-1] if i else None
            h = block_hash(parent, tokens[i * bs:(i + 1) * bs],
                           extra_keys(spans, i * bs, (i + 1) * bs))
            self.pool.register(conv.block_table[i], h)
            conv.block_hashes.append(h)

    def release(self, conv: Conversation) -> None:
        """Hand all of ``conv``'s blocks back (tail first; hashed ones stay cached)."""
        self.pool.release(conv.block_table)
        conv.clear_kv()
