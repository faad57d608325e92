# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""3-D M-RoPE position ids for Qwen3-VL prompts, computed turn by turn.

Follows transformers' ``Qwen3VLModel.get_rope_index``: a text run gets ``start + arange(n)`` on
all three axes (T, H, W); an image whose merged grid is ``(t, h, w)`` gets ``T = start + frame``,
``H = start + row``, ``W = start + col`` in row-major token order, and the next start moves on by
``max(h, w)``. A video is split into one ``(1, h, w)`` grid per temporal group (its groups are
separated by timestamp text), as the reference splits ``video_grid_thw``. Because every run
only depends on the running start, computing a conversation turn by turn (passing the previous
``next_start``) gives exactly the positions of the whole sequence.
"""

from collections.abc import Sequence

import numpy as np

__all__ = ['rope_delta', 'rope_positions']


def _image_positions(start: int, grid: Sequence[int], merge_size: int) -> np.ndarray:
    t, h, w = (int(x) for x in grid)
    gh, gw = h // merge_size, w // merge_size
    tt, hh, ww = np.meshgrid(
        np.arange(t, dtype=np.int64), np.arange(gh, dtype=np.int64),
        np.arange(gw, dtype=np.int64), indexing='ij',
    )
    return np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + start


def rope_positions(
    input_ids: Sequence[int],
    image_grids: Sequence[Sequence[int]],
    image_token_id: int | Sequence[int],
    merge_size: int,
    start: int = 0,
) -> tuple[np.ndarray, int]:
    """
    Return the M-RoPE positions of ``input_ids`` and the start of whatever follows.

    ``input_ids`` holds already expanded image pads (``t*h*w / merge_size**2`` copies of
    ``image_token_id`` per image); ``image_grids`` lists the patch grids ``(t, h, w)`` of the
    images in the order their pads appear. ``image_token_id`` may list several pad ids (image
    and video pads: each video temporal group is then one ``(1, h, w)`` grid). ``start`` is the
    ``next_start`` of the previous turn (0 for the first). Returns ``(positions, next_start)``
    with ``positions`` int64 of shape ``[3, len(input_ids)]``. Raises ``ValueError`` when the
    pads do not match the grids.
    """
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    n = ids.shape[0]
    positions = np.empty((3, n), dtype=np.int64)
    is_image = np.isin(ids, np.asarray(image_token_id, dtype=np.int64).reshape(-1))
    # Boundaries of the runs of equal modality: [0, b1, b2, ..., n].
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(is_image)) + 1, [n])) if n else [0]
    grids = list(image_grids)
    next_grid = 0
    pos = int(start)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        lo, hi = int(lo), int(hi)
        if not is_image[lo]:
            positions[:, lo:hi] = np.arange(pos, pos + hi - lo, dtype=np.int64)
            pos += hi - lo
            continue
        # One run may hold several images when nothing separates their pads.
        while lo < hi:
            if next_grid >= len(grids):
                raise ValueError(
                    f'more image pad tokens than image grids: {len(grids)} grid(s) given'
                )
            grid = grids[next_grid]
            t, h, w = (int(x) for x in grid)
            if h % merge_size or w % merge_size:
                raise ValueError(
                    f'image grid {tuple(grid)} is not divisible by merge size {merge_size}'
                )
            count = t * h * w // (merge_size * merge_size)
            if lo + count > hi:
                raise ValueError(
                    f'image {next_grid} with grid {tuple(grid)} needs {count} pad tokens, '
                    f'only {hi - lo} found'
                )
            positions[:, lo:lo + count] = _image_positions(pos, grid, merge_size)
            pos += max(h, w) // merge_size
            lo += count
            next_grid += 1
    if next_grid != len(grids):
        raise ValueError(
            f'{len(grids)} image grid(s) given but the pads cover only {next_grid}'
        )
    return positions, pos


def rope_delta(positions: np.ndarray, seq_len: int | None = None) -> int:
    """
    Return ``max(positions) + 1 - seq_len``, the M-RoPE offset of decode tokens.

    ``positions`` are the ``[3, N]`` positions of the whole sequence so far (or of any suffix
    holding its maximum, e.g. the last turn); ``seq_len`` defaults to ``N``. A token generated
    at sequence index ``i`` then gets position ``i + rope_delta`` on all three axes.
    """
    positions = np.asarray(positions)
    if seq_len is None:
        seq_len = positions.shape[-1]
    if positions.size == 0:
        return -int(seq_len)
    return int(positions.max()) + 1 - int(seq_len)
