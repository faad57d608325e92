# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""K/V computed after an answer: the turn's closing tokens and the next user header.

A follow-up then prefills only its own text. The header is a prediction checked by the next
turn: a matching one is reused, a wrong one (here planted on purpose) is recomputed, and the
answers stay those of transformers either way.
"""

from _engine_reference import Reference, random_image

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams


def test_follow_up_reuses_the_header_and_survives_a_wrong_one(tiny_ckpt):
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device="cpu", block_size=4,
                                 num_kv_blocks=512, block_order_seed=5))
    ref = Reference(tiny_ckpt)
    sampling = SamplingParams(max_tokens=6, ignore_eos=True)
    conv = eng.new_conversation("Be brief.")
    r1 = eng.chat(conv, "What is here?", [random_image(2, 64, 96)], sampling)
    assert r1.token_ids == ref.generate(r1.prompt_token_ids, r1.prompt_images, 6, True)
    header = eng.prompts.user_header(conv)
    assert header and conv.kv_ahead == header
    assert conv.num_kv_tokens == len(conv.token_ids), "the closing tokens have K/V"

    r2 = eng.chat(conv, "And the colour?", sampling=sampling)
    history = len(r1.prompt_token_ids) + len(r1.token_ids) + 1  # + <|im_end|>
    assert r2.prompt_token_ids[history:history + len(header)] == header
    assert r2.cached_tokens == history + len(header)
    assert r2.token_ids == ref.generate(r2.prompt_token_ids, r2.prompt_images, 6, True)

    # A wrong prediction from its second id on: only the first id is kept.
    conv.kv_ahead = [header[0], *(t + 1 for t in header[1:])]
    before = conv.num_kv_tokens
    r3 = eng.chat(conv, "Is it moving?", sampling=sampling)
    assert r3.cached_tokens == before + 1
    assert r3.token_ids == ref.generate(r3.prompt_token_ids, r3.prompt_images, 6, True)


def test_nothing_is_computed_ahead_without_the_prefix_cache(tiny_ckpt):
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device="cpu", num_kv_blocks=128,
                                 enable_prefix_cache=False))
    conv = eng.new_conversation()
    eng.chat(conv, "Hello.", sampling=SamplingParams(max_tokens=3))
    assert conv.kv_ahead == [] and eng.stats().used_blocks == 0
