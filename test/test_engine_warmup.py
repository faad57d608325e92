# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``LLMEngine.warmup``: the vision grids and a first turn's device work, before any frame."""

from _engine_reference import random_image
from cpu_graphs import CpuGraphCapture
import kernel_emulator
import numpy as np
import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.cuda_graph import CudaGraphDecode


def test_warmup_covers_the_frame_sizes_and_changes_no_answer(tiny_ckpt):
    cfg = dict(model_path=tiny_ckpt, device='cpu', num_kv_blocks=256, block_order_seed=1,
               image_max_pixels=128 * 160)
    warm, cold = LLMEngine(EngineConfig(**cfg)), LLMEngine(EngineConfig(**cfg))
    tower = warm.model.visual
    assert not tower._grids
    # Two camera sizes; 480x640 and 240x320 resize to the same capped grid.
    seconds = warm.warmup([(480, 640), (240, 320), (96, 96)])
    assert seconds > 0
    assert len(tower._grids) == 2
    stats = warm.stats()
    assert stats.used_blocks == 0 and stats.cached_blocks == 0
    assert stats.vision_cache_hits == stats.vision_cache_misses == 0
    frame = random_image(3, 480, 640)
    answers = []
    for eng in (warm, cold):
        conv = eng.new_conversation()
        answers.append(eng.chat(conv, 'What is here?', [frame],
                                SamplingParams(max_tokens=8, ignore_eos=True)).token_ids)
    assert answers[0] == answers[1]
    assert len(tower._grids) == 2, "the frame's grid was prepared by the warm-up"


def test_warmup_defaults_to_common_camera_sizes(tiny_ckpt):
    from orin_llm_node.engine.llm_engine import COMMON_FRAME_SIZES

    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', num_kv_blocks=64))
    eng.warmup()
    processor = eng.prompts.image_processor
    grids = {processor.preprocess(np.zeros((h, w, 3), np.uint8)).grid_thw
             for h, w in COMMON_FRAME_SIZES}
    assert set(eng.model.visual._grids) == {(g,) for g in grids}


@pytest.mark.skipif(not kernel_emulator.compiler_available(), reason='g++ builds the emulator')
def test_warmup_runs_a_throwaway_turn_that_leaves_no_trace(tiny_ckpt):
    """The warm-up's turn captures the decode graph and leaves no trace.

    The capture (a CPU stand-in here) is what the first prompt would otherwise pay for; no
    counter, cache entry or free block of the engine moves.
    """
    cfg = EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32', num_kv_blocks=64,
                       max_model_len=512, block_order_seed=2, attention_backend='cuda',
                       image_max_pixels=128 * 160)

    def build(dtype, head_dim, device):
        return kernel_emulator.emulated_launch('float32', head_dim)

    warm, cold = (LLMEngine(cfg, kernel_launcher=build) for _ in range(2))
    for eng in (warm, cold):
        eng.runner.decode_graph = CudaGraphDecode(eng.runner)
        eng.runner.decode_graph.capturer = CpuGraphCapture()
    before, free = warm.stats(), list(warm.pool._free)
    warm.warmup([(480, 640), (96, 96)])
    assert warm.runner.decode_graph.captures == 1, 'the warm-up turn ran no decode step'
    assert warm.stats() == before and list(warm.pool._free) == free
    assert len(warm.model.visual._grids) == 2  # its frame is one of the warmed sizes
    frame = random_image(5, 96, 96)
    answers = []
    for eng in (warm, cold):
        answers.append(eng.chat(eng.new_conversation(), 'What is here?', [frame],
                                SamplingParams(max_tokens=8, ignore_eos=True)).token_ids)
    assert answers[0] == answers[1]
    assert warm.runner.decode_graph.captures == 1  # the first prompt captured nothing


def test_warmup_skips_the_turn_when_it_does_not_fit(tiny_ckpt):
    """One KV block of 4 tokens holds no turn: the warm-up goes on without it."""
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', num_kv_blocks=1,
                                 block_size=4, max_model_len=64))
    before = eng.stats()
    assert eng.warmup([(96, 96)]) > 0  # the grids and graphs, without the turn
    assert eng.stats() == before
