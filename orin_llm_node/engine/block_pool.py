# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""KV block pool: ref counts, a free queue that doubles as the LRU of cached blocks, hash -> block.

A block is *used* while referenced, *cached* when unreferenced but still holding a hash (its
K/V can be reused by a prefix hit until the block is handed out again), *free* otherwise.
The free queue is an ``OrderedDict`` (O(1) pop from the front, O(1) removal on a hit): plain
free blocks are queued at the front so they are handed out first, cached blocks at the back,
so allocation evicts the least recently released cached block only when nothing plain is left.
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
import random


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the block pool and of every exhaustion-ladder counter."""

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
    vision_cache_hits: int
    vision_cache_misses: int


class BlockPool:
    """Fixed set of ``num_blocks`` KV blocks of ``block_size`` tokens (ids 0..num_blocks-1)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        bytes_per_block: int = 0,
        order_seed: int | None = None,
    ):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        order = list(range(num_blocks))
        if order_seed is not None:
            # Tests permute the initial queue so that block tables are never the identity.
            random.Random(order_seed).shuffle(order)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(order)
        self._num_cached = 0
        # Counters (monotonic); the engine bumps the ladder ones.
        self.prefix_hits = 0
        self.prefix_misses = 0
        self.evictions = 0
        self.exhaustion_events = 0
        self.truncated_generations = 0
        self.rejected_prompts = 0
        self.dropped_turns = 0
        self.vision_cache_hits = 0
        self.vision_cache_misses = 0

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_available(self) -> int:
        """Blocks that ``allocate`` can hand out (free + cached)."""
        return len(self._free)

    def ref_count(self, block: int) -> int:
        """Current reference count of ``block``."""
        return self._ref[block]

    def lookup(self, h: bytes) -> int | None:
        """The block holding the K/V of hash ``h``, or None (pure: changes nothing)."""
        return self._by_hash.get(h)

    def stats(self) -> PoolStats:
        """Snapshot of the counts and counters."""
        free_q = len(self._free)
        used = self.num_blocks - free_q
        queried = self.prefix_hits + self.prefix_misses
        return PoolStats(
            total_blocks=self.num_blocks,
            free_blocks=free_q - self._num_cached,
            cached_blocks=self._num_cached,
            used_blocks=used,
            block_size=self.block_size,
            bytes_per_block=self.bytes_per_block,
            usage_pct=100.0 * used / self.num_blocks,
            prefix_hits=self.prefix_hits,
            prefix_misses=self.prefix_misses,
            prefix_hit_rate=self.prefix_hits / queried if queried else 0.0,
            evictions=self.evictions,
            exhaustion_events=self.exhaustion_events,
            truncated_generations=self.truncated_generations,
            rejected_prompts=self.rejected_prompts,
            dropped_turns=self.dropped_turns,
            vision_cache_hits=self.vision_cache_hits,
            vision_cache_misses=self.vision_cache_misses,
        )

    # ---- mutations -----------------------------------------------------------------------

    def allocate(self) -> int | None:
        """Take a block (ref count 1, no hash); evicts the LRU cached block if needed.

        Returns None when every block is referenced: the caller walks the exhaustion ladder.
        """
        if not self._free:
            return None
        block, _ = self._free.popitem(last=False)
        h = self._hash[block]
        if h is not None:
            del self._by_hash[h]
            self._hash[block] = None
            self._num_cached -= 1
            self.evictions += 1
        self._ref[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """Add a reference to ``block`` (a prefix hit); revives it if it was cached."""
        if self._ref[block] == 0:
            if self._hash[block] is None:
                raise ValueError(f"block {block} is free: nothing to acquire")
            del self._free[block]
            self._num_cached -= 1
        self._ref[block] += 1

    def register(self, block: int, h: bytes) -> bool:
        """Record that referenced ``block`` now holds the full block of hash ``h``.

        Returns False (and leaves the block anonymous) when another block already holds ``h``.
        """
        if self._ref[block] <= 0:
            raise ValueError(f"block {block} is not referenced")
        if self._hash[block] is not None:
            return self._hash[block] == h
        if h in self._by_hash:
            return False
        self._hash[block] = h
        self._by_hash[h] = block
        return True

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block, last block first (a prefix outlives its tail)."""
        for block in reversed(blocks):
            ref = self._ref[block] - 1
            if ref < 0:
                raise ValueError(f"block {block} released more often than referenced")
            self._ref[block] = ref
            if ref:
                continue
            self._free[block] = None
            if self._hash[block] is None:
                self._free.move_to_end(block, last=False)
            else:
                self._num_cached += 1

    def clear_cache(self) -> None:
        """Forget every cached hash (cached blocks become plain free blocks)."""
        for block in self._free:
            h = self._hash[block]
            if h is not None:
                del self._by_hash[h]
                self._hash[block] = None
        self._num_cached = 0
