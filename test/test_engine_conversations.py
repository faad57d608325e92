# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Conversations that are dropped or left idle give their KV blocks way (CPU, fp32).

Through the Python API a caller may simply drop a conversation instead of calling ``reset``:
its blocks must come back to the pool, and conversations that are alive but idle must give way
to the one that needs blocks now (least recently used first), keeping their prefix cached.
"""

import gc
import math

from _engine_reference import Reference, random_image
import pytest

from orin_llm_node.engine import EngineConfig, FinishReason, LLMEngine, SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def make_engine(ckpt, num_kv_blocks):
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', block_size=4,
                                  num_kv_blocks=num_kv_blocks, block_order_seed=5))


def used_blocks(eng, live):
    s = eng.stats()
    assert s.free_blocks + s.cached_blocks + s.used_blocks == s.total_blocks
    assert s.used_blocks == len({b for c in live for b in c.block_table})
    return s.used_blocks


def test_a_thousand_dropped_conversations_never_exhaust_the_pool(tiny_ckpt):
    eng = make_engine(tiny_ckpt, 32)  # room for about three of these conversations at once
    live = []
    for i in range(1000):
        conv = eng.new_conversation('Be brief.' if i % 2 else None)
        res = eng.chat(conv, f'Where is box {i}?',
                       sampling=SamplingParams(max_tokens=1, ignore_eos=True))
        assert res.finish_reason == FinishReason.LENGTH and res.error is None, (i, res)
        assert len(conv.block_table) * 4 >= len(res.prompt_token_ids)
        if i % 250 == 0:
            live.append(conv)  # a few stay alive, idle: they give way too
        # Rebinding ``conv`` drops the previous conversation without a reset.
    del conv
    gc.collect()
    s = eng.stats()
    assert s.rejected_prompts == 0 and s.truncated_generations == 0
    assert s.exhaustion_events == 0 and s.dropped_turns == 0
    # The blocks of collected conversations go back at the engine's next call.
    eng.reset(live[0])
    used_blocks(eng, live)
    eng.reset()
    assert used_blocks(eng, []) == 0


def test_idle_conversations_give_way_least_recently_used_first(tiny_ckpt, ref):
    turns = [('Describe the image.', [random_image(61, 96, 96)]),
             ('What colour is the door?', []),
             ('Is the path to the shelf clear? Look left and right.', [])]
    # Blocks the three first turns hold together, measured on a pool large enough for them.
    probe = make_engine(tiny_ckpt, 256)
    probes = [probe.new_conversation() for _ in turns]
    for conv, (text, imgs) in zip(probes, turns, strict=True):
        probe.chat(conv, text, imgs, PARAMS)
    # One block short of holding all three: the third turn needs an idle conversation's blocks.
    eng = make_engine(tiny_ckpt, probe.stats().used_blocks - 1)
    a, b, c = (eng.new_conversation() for _ in turns)
    first = [eng.chat(conv, text, imgs, PARAMS) for conv, (text, imgs) in zip(
        (a, b), turns[:2], strict=True)]
    held_b = list(b.block_table)
    rc = eng.chat(c, *turns[2], PARAMS)
    assert rc.finish_reason == FinishReason.LENGTH
    # a, the least recently used, gave way; b kept its blocks.
    assert a.block_table == [] and b.block_table == held_b
    s = eng.stats()
    assert s.idle_releases == 1 and s.exhaustion_events == 0 and s.dropped_turns == 0
    used_blocks(eng, [a, b, c])
    # a comes back: its history is intact, its prefix still cached (c evicted one tail block),
    # and the answer equals a cold run on the whole prompt.
    ra = eng.chat(a, 'And what is on the left?', sampling=PARAMS)
    n = len(first[0].prompt_token_ids)
    assert ra.prompt_token_ids[:n] == first[0].prompt_token_ids
    assert ra.cached_tokens >= math.floor((n + len(first[0].token_ids) - 1) / 4 - 1) * 4
    expected = ref.generate(ra.prompt_token_ids, ra.prompt_images, 6, ignore_eos=True)
    assert ra.token_ids == expected
    assert eng.stats().idle_releases >= 2  # b (now least recent) gave way for it
    used_blocks(eng, [a, b, c])


def test_bad_input_raises_before_anything_changes(tiny_ckpt):
    eng = make_engine(tiny_ckpt, 64)
    conv = eng.new_conversation('Be brief.')
    before = list(conv.token_ids)
    with pytest.raises(ValueError, match='lone surrogate'):
        eng.chat(conv, 'bad \ud800 text')
    with pytest.raises(ValueError, match='bare array'):
        eng.chat(conv, 'What is it?', images=random_image(1, 32, 32))
    with pytest.raises(ValueError, match='uint8'):
        eng.chat(conv, 'What is it?', images=[random_image(1, 32, 32).astype(float)])
    assert conv.token_ids == before and eng.stats().used_blocks == 0
    assert eng.chat(conv, 'Hello.', sampling=PARAMS).finish_reason == FinishReason.LENGTH
