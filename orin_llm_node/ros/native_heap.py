# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The C heap (glibc malloc) under the node: how many arenas it opens, and freed pages back.

glibc gives each thread that allocates its own malloc arena (up to 8 per core), and a freed
block stays in its arena's heap until the top of that heap is free.  The node's executor runs
on several threads, and a camera frame is decoded on whichever one is free (100 MB for a
5792x5792 PNG, with Pillow's and OpenCV's buffers around it): measured with
bench/image_memory.py, each thread's arena kept what it once held and the node settled 0.8 GB
above its ready size after 30 such frames (50 MB with both measures below).  So the node opens
few arenas and hands freed pages back after each large decode.  On another C library both
calls do nothing.
"""

import ctypes

# mallopt's parameter number for the arena limit (glibc's malloc.h).
_M_ARENA_MAX = -8


def _libc():
    try:
        libc = ctypes.CDLL('libc.so.6')
        return libc if hasattr(libc, 'mallopt') and hasattr(libc, 'malloc_trim') else None
    except OSError:
        return None


_LIBC = _libc()


def limit_arenas(count):
    """Let glibc open at most ``count`` malloc arenas; True if it took the limit.

    Call it before the threads start: an arena once opened stays.
    """
    return bool(_LIBC is not None and _LIBC.mallopt(_M_ARENA_MAX, int(count)))


def trim():
    """Give the free pages of every arena back to the system (after a large free)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
