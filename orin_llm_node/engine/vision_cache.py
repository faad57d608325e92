# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A small LRU of vision-tower outputs keyed by (image content hash, grid), bounded in bytes.

Re-prefills after dropped turns and repeated images then never re-run the vision tower.
"""

from collections import OrderedDict


def _nbytes(out) -> int:
    return sum(t.numel() * t.element_size() for t in (out.embeds, *out.deepstack))


class VisionCache:
    """LRU map ``(image_key, grid_thw) -> VisionOutput`` holding at most ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        """The cached output for ``key`` (marked most recent), or None."""
        out = self._entries.get(key)
        if out is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return out

    def put(self, key, out) -> None:
        """Insert ``out``, evicting least recent entries; outputs above the bound are skipped."""
        size = _nbytes(out)
        if size > self.max_bytes or key in self._entries:
            return
        while self.bytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= _nbytes(old)
        self._entries[key] = out
        self.bytes += size
