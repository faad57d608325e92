# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Prefix-cache keys: chained hashes of full KV blocks, with the images and clips they overlap.

Block ``i`` of a sequence is keyed by H(key of block ``i-1``, its token ids, extra keys), so a
key names the whole prefix up to the block's end. The extra keys name every image or video clip
overlapping the block: two different images (or clips) with identical placeholder ids never share
a block. A clip's span runs from its first video pad to its last, the timestamp text between its
temporal groups included, so a block inside it names it even where it holds no pad.
"""

from collections.abc import Iterator, Sequence
import hashlib

import numpy as np


def block_hash(parent: bytes | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> bytes:
    """Chained hash of one full block: H(parent hash, token ids, extra keys).

    ``extra_keys`` names every image overlapping the block as (image content hash, offset of
    the image's first token relative to the block's first token).
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b'\0' * 16)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    for key, offset in extra_keys:
        h.update(key)
        h.update(int(offset).to_bytes(8, 'little', signed=True))
    return h.digest()


def extra_keys(spans, start: int, end: int) -> tuple:
    """(image key, image start - block start) of every image overlapping tokens [start, end).

    ``spans``: (first pad index, image or clip) pairs; each has ``key`` and ``num_tokens`` (the
    length of its span).
    """
    return tuple(
        (img.key, s - start) for s, img in spans if s < end and s + img.num_tokens > start
    )


def chained_hashes(token_ids: Sequence[int], spans, block_size: int, first: int,
                   parent: bytes | None) -> Iterator[bytes]:
    """Hashes of the full blocks ``first, first + 1, ...`` of ``token_ids``, lazily.

    ``parent`` is the hash of block ``first - 1`` (None for the first block); a caller that
    stops consuming stops the hashing (a prefix lookup ends at its first miss).
    """
    for i in range(first, len(token_ids) // block_size):
        start, end = i * block_size, (i + 1) * block_size
        parent = block_hash(parent, token_ids[start:end], extra_keys(spans, start, end))
        yield parent
