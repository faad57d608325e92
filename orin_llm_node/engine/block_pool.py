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
import random


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
            raise ValueError('num_blocks and block_size must be positive')
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
        self.evictions = 0  # cached blocks handed out again (their hash forgotten)

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_available(self) -> int:
        """Blocks that ``allocate`` can hand out (free + cached)."""
        return len(self._free)

    @property
    def num_free(self) -> int:
        """Unreferenced blocks holding no hash."""
        return len(self._free) - self._num_cached

    @property
    def num_cached(self) -> int:
        """Unreferenced blocks still holding a hash (evictable, reusable by a prefix hit)."""
        return self._num_cached

    @property
    def num_used(self) -> int:
        """Referenced blocks."""
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        """Current reference count of ``block``."""
        return self._ref[block]

    def lookup(self, h: bytes) -> int | None:
        """The block holding the K/V of hash ``h``, or None (pure: changes nothing)."""
        return self._by_hash.get(h)

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
                raise ValueError(f'block {block} is free: nothing to acquire')
            del self._free[block]
            self._num_cached -= 1
        self._ref[block] += 1

    def register(self, block: int, h: bytes) -> bool:
        """Record that referenced ``block`` now holds the full block of hash ``h``.

        Returns False (and leaves the block anonymous) when another block already holds ``h``.
        """
        if self._ref[block] <= 0:
            raise ValueError(f'block {block} is not referenced')
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
                raise ValueError(f'block {block} released more often than referenced')
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
