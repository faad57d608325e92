# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The pieces of ``LLMEngine.warmup``: the vision grids to prepare, and a throw-away turn.

Both run the device paths a first prompt would otherwise pay for (the vision tower's per-grid
inputs, a prefill with image rows, the first decode step, which captures the decode graph)
and leave nothing behind that a prompt could see: no vision- or prefix-cache entry, no
counter moved, no conversation.
"""

import logging

import numpy as np
import torch

from .sampler import NonFiniteLogits

__all__ = ['COMMON_FRAME_SIZES', 'throwaway_turn', 'vision_grids']

log = logging.getLogger(__name__)

#: Camera frame sizes (height, width) ``warmup`` prepares when given none: VGA, the 16:9
#: sizes of common depth/colour cameras, and a square crop.
COMMON_FRAME_SIZES = ((480, 640), (480, 848), (720, 1280), (1080, 1920), (448, 448))


def vision_grids(image_processor, video_processor, image_sizes, video_sizes) -> dict:
    """Patch grid -> the frame size (height, width) at model size that gives it.

    ``image_sizes``: ``(height, width)`` of camera frames, resized as a real frame would be;
    ``video_sizes``: ``(frames, height, width)`` of clips after sampling, sized as a real clip
    (their grids map to None: no still frame gives them). Only sizes are computed: no frame is
    built, resized or patched.
    """
    p = image_processor.patch_size
    grids = {}
    for h, w in (image_processor.target_size(int(h), int(w)) for h, w in image_sizes):
        grids.setdefault((1, h // p, w // p), (h, w))
    for n, height, width in video_sizes:
        h, w = video_processor.target_size(int(n), int(height), int(width))
        grids.setdefault((-(-int(n) // video_processor.temporal_patch_size),
                          h // video_processor.patch_size, w // video_processor.patch_size),
                         None)
    return grids


def throwaway_turn(runner, prompts, pool, sampler, frame_size, max_model_len: int,
                   chunk_tokens: int) -> bool:
    """One short turn on the device: ``Hi`` with a grey frame of ``frame_size``, two tokens.

    As the first prompt would run it (vision tower, prefill with the image rows, the first
    token's pick and one decode step, which captures the decode graph where graphs are on),
    but outside the engine's books: on plain free blocks of ``pool`` given back unhashed,
    without the vision cache and without a conversation. ``frame_size`` None: text only. A
    frame of a size the vision tower was warmed for adds no grid. Returns False (and runs
    nothing) when the turn does not fit ``max_model_len`` or the pool's free blocks.
    """
    frames = [] if frame_size is None else [np.full((*frame_size, 3), 127, np.uint8)]
    turn = prompts.user_turn([], ['Hi'], frames)
    tokens = turn.token_ids
    # The prompt and the decode step's token; plain free blocks only, so no cached block
    # is evicted (allocation hands those out first).
    needed = -(-(len(tokens) + 1) // pool.block_size)
    if len(tokens) + 1 > max_model_len or needed > pool.num_free:
        log.info('warm-up: no throw-away turn (%d tokens, %d free KV blocks)', len(tokens),
                 pool.num_free)
        return False
    table = [pool.allocate() for _ in range(needed)]
    try:
        positions, next_pos = prompts.positions(tokens, turn.media)
        visual = None
        for _, ref in turn.media:
            visual = runner.encode_image(turn.pixel_values[ref.key], ref.grid_thw)
        for _, chunk_logits in runner.prefill_chunks(tokens, positions, table, 0, visual,
                                                     chunk_tokens):
            logits = chunk_logits  # the last chunk's: the first answer token's
        try:
            token = sampler(logits)
            runner.decode_sample(token, next_pos, table, len(tokens) + 1, sampler)
        except NonFiniteLogits as exc:  # random or broken weights: the device work ran
            log.warning('warm-up turn: %s', exc)
        if runner.device.type == 'cuda':
            torch.cuda.synchronize(runner.device)
    finally:
        pool.release(table)
    return True
