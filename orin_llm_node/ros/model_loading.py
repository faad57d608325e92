# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""From the node's parameters to a warmed-up engine, and back to free memory (session thread)."""

import sys
import time

from orin_llm_node.parameters import engine_config, resolve_model_path


def load_engine(params, log, should_stop=None):
    """Load the checkpoint and warm it up; ``log`` is the node's logger.

    ``should_stop`` (a callable) is asked between shards, tensors and warm-up steps; when it
    answers True, ``LoadInterrupted`` is raised and the partly built engine is dropped.
    """
    path = resolve_model_path(params['model_path'])
    log.info(f"loading {path} (device={params['device']}, dtype={params['dtype']})...")
    from orin_llm_node.engine import LLMEngine
    t0 = time.monotonic()
    engine = LLMEngine(engine_config(params, path), should_stop=should_stop)
    stats = engine.stats()
    mb = stats.total_blocks * stats.bytes_per_block / 2 ** 20
    log.info(f'loaded in {time.monotonic() - t0:.1f} s on {engine.device} '
             f'({engine.weight_format} weights, {engine.weight_bytes / 2 ** 20:.1f} MB); '
             f'KV pool: {stats.total_blocks} blocks x {stats.block_size} tokens ({mb:.1f} MB)')
    t0 = time.monotonic()
    warm_up(engine, should_stop)
    log.info(f'warm-up done in {time.monotonic() - t0:.1f} s')
    return engine


def warm_up(engine, should_stop=None):
    """Run every code path once (vision tower, prefill, decode, graph capture where enabled).

    First ``LLMEngine.warmup``: the vision tower's per-grid inputs for common camera frame
    sizes (resized within ``image_max_pixels``) and the bucketed prefill graphs (CUDA), so that
    neither a new frame size nor the first follow-up question pays for them. Then one turn
    with no system prompt and a throw-away image, so it leaves nothing in the prefix cache
    that a real prompt could hit.  ``should_stop`` as in :func:`load_engine`.
    """
    import numpy as np

    from orin_llm_node.engine import SamplingParams
    from orin_llm_node.models.loader import check_stop
    engine.warmup(should_stop=should_stop)
    check_stop(should_stop, 'warming up')
    conv = engine.new_conversation(system_prompt=None)
    grey = np.full((64, 64, 3), 127, np.uint8)
    engine.chat(conv, 'Hi', images=[grey], sampling=SamplingParams(max_tokens=2))
    engine.reset(conv)


def release_memory():
    """Give freed weights back to the system (CUDA caching allocator, glibc arenas)."""
    import gc
    gc.collect()
    torch = sys.modules.get('torch')
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        import ctypes
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass                            # not glibc: the allocator keeps what it keeps
