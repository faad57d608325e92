# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``LLMEngine.warmup``: the vision tower's per-grid inputs are ready before the first frame."""

from _engine_reference import random_image
import numpy as np

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams


def test_warmup_covers_the_frame_sizes_and_changes_no_answer(tiny_ckpt):
    cfg = dict(model_path=tiny_ckpt, device="cpu", num_kv_blocks=256, block_order_seed=1,
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
        answers.append(eng.chat(conv, "What is here?", [frame],
                                SamplingParams(max_tokens=8, ignore_eos=True)).token_ids)
    assert answers[0] == answers[1]
    assert len(tower._grids) == 2, "the frame's grid was prepared by the warm-up"


def test_warmup_defaults_to_common_camera_sizes(tiny_ckpt):
    from orin_llm_node.engine.llm_engine import COMMON_FRAME_SIZES

    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device="cpu", num_kv_blocks=64))
    eng.warmup()
    processor = eng.prompts.image_processor
    grids = {processor.preprocess(np.zeros((h, w, 3), np.uint8)).grid_thw
             for h, w in COMMON_FRAME_SIZES}
    assert set(eng.model.visual._grids) == {(g,) for g in grids}
