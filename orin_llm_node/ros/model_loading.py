# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""From the node's parameters to a warmed-up engine, and back to free memory (session thread)."""

import sys
import time

from orin_llm_node.parameters import engine_config
from orin_llm_node.ros import native_heap


def load_engine(params, log, should_stop=None):
    """Load the checkpoint and warm it up; ``log`` is the node's logger.

    ``should_stop`` (a callable) is asked between shards, tensors and warm-up steps; when it
    answers True, ``LoadInterrupted`` is raised and the partly built engine is dropped.
    """
    config = engine_config(params)
    log.info(f"loading {config.model_path} (device={params['device']}, "
             f"dtype={params['dtype']})...")
    from orin_llm_node.engine import LLMEngine
    t0 = time.monotonic()
    engine = LLMEngine(config, should_stop=should_stop)
    stats = engine.stats()
    mb = stats.total_blocks * stats.bytes_per_block / 2 ** 20
    log.info(f'loaded in {time.monotonic() - t0:.1f} s on {engine.device} '
             f'({engine.weight_format} weights, {engine.weight_bytes / 2 ** 20:.1f} MB); '
             f'KV pool: {stats.total_blocks} blocks x {stats.block_size} tokens ({mb:.1f} MB)')
    t0 = time.monotonic()
    engine.warmup(should_stop=should_stop)
    log.info(f'warm-up done in {time.monotonic() - t0:.1f} s')
    return engine


def release_memory():
    """Give freed weights back to the system (CUDA caching allocator, glibc arenas)."""
    import gc
    gc.collect()
    torch = sys.modules.get('torch')
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    native_heap.trim()
