# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The engine's KV management on the tiny checkpoint (CPU, fp32).

Prefix cache across turns and conversations, cancel/timeout, context overflow, the KV
exhaustion ladder, pool invariants and streaming. Every output that the cache could corrupt
is compared with transformers' greedy ``generate`` on the same prompt (a cold run).
"""

import random

from _engine_reference import Reference, random_image
import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams

SYSTEM = 'You are a helpful assistant running on a robot. Answer briefly and precisely.'


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def make_engine(ckpt, block_size=4, **kw):
    kw.setdefault('num_kv_blocks', 2048 // block_size)
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', block_size=block_size,
                                  block_order_seed=7 * block_size, **kw))


def assert_cold(ref, res, max_tokens, ignore_eos=False):
    expected = ref.generate(res.prompt_token_ids, res.prompt_images, max_tokens, ignore_eos)
    if res.finish_reason in ('stop', 'length'):
        assert res.token_ids == expected
    else:  # cut short: a prefix of the reference answer
        assert res.token_ids == expected[:len(res.token_ids)]


def pool_invariants(eng, convs=()):
    s = eng.stats()
    assert s.free_blocks + s.cached_blocks + s.used_blocks == s.total_blocks
    held = {b for c in convs for b in c.block_table}
    assert s.used_blocks == len(held)
    return s


@pytest.mark.parametrize('block_size', [16, 4])
def test_second_turn_and_new_conversation_hit_the_cache(tiny_ckpt, ref, block_size):
    eng = make_engine(tiny_ckpt, block_size)
    conv = eng.new_conversation(SYSTEM)
    img = random_image(11, 96, 128)
    r1 = eng.chat(conv, 'What is in front of you?', [img], SamplingParams(max_tokens=12))
    assert_cold(ref, r1, 12)
    p, a = len(r1.prompt_token_ids), len(r1.token_ids)
    r2 = eng.chat(conv, 'And what colour is it?', sampling=SamplingParams(max_tokens=12))
    # The last sampled token of turn 1 has no KV yet; everything before it is reused.
    assert r2.cached_tokens >= (p + a - 1) // block_size * block_size
    assert_cold(ref, r2, 12)
    used_before = pool_invariants(eng, [conv]).used_blocks
    eng.reset(conv)
    s = pool_invariants(eng)
    assert s.used_blocks == 0 and s.cached_blocks >= used_before - 1
    # A new conversation with the same system prompt (and first image) hits those blocks.
    other = eng.new_conversation(SYSTEM)
    r3 = eng.chat(other, 'What is in front of you?', [img], SamplingParams(max_tokens=12))
    assert r3.cached_tokens >= (p - 1) // block_size * block_size
    assert r3.token_ids == r1.token_ids
    assert eng.stats().prefix_hits >= r2.cached_tokens + r3.cached_tokens
    eng.reset()
    assert pool_invariants(eng).used_blocks == 0


def test_prefix_cache_disabled_recomputes(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4, enable_prefix_cache=False)
    conv = eng.new_conversation(SYSTEM)
    eng.chat(conv, 'Hello robot.', sampling=SamplingParams(max_tokens=6))
    assert pool_invariants(eng).used_blocks == 0  # nothing kept between turns
    r2 = eng.chat(conv, 'Is the path clear?', sampling=SamplingParams(max_tokens=6))
    assert r2.cached_tokens == 0 and eng.stats().cached_blocks == 0
    assert_cold(ref, r2, 6)


def image_start(res, image_token_id):
    return res.prompt_token_ids.index(image_token_id)


def test_different_image_same_text_never_reuses_image_blocks(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4)
    img_a, img_b = random_image(21, 128, 128), random_image(22, 128, 128)
    pad = eng.model.config.image_token_id
    ra = eng.chat(eng.new_conversation(SYSTEM), 'Describe the image.', [img_a],
                  SamplingParams(max_tokens=10))
    rb = eng.chat(eng.new_conversation(SYSTEM), 'Describe the image.', [img_b],
                  SamplingParams(max_tokens=10))
    assert ra.prompt_token_ids == rb.prompt_token_ids  # identical ids, different pixels
    assert 0 < rb.cached_tokens <= image_start(rb, pad)
    assert_cold(ref, rb, 10)
    assert rb.token_ids != ra.token_ids  # the image matters to this model
    # The first image again: the hit now covers the image.
    rc = eng.chat(eng.new_conversation(SYSTEM), 'Describe the image.', [img_a],
                  SamplingParams(max_tokens=10))
    assert rc.cached_tokens > image_start(rc, pad) + ref.tokens_per_image(img_a)
    assert rc.token_ids == ra.token_ids
    eng.reset()


@pytest.mark.parametrize('block_size, vision_cache_mb', [(16, 0), (4, 0), (4, 64)])
def test_hit_ending_inside_an_image_equals_cold_run(tiny_ckpt, ref, block_size,
                                                    vision_cache_mb):
    eng = make_engine(tiny_ckpt, block_size, vision_cache_mb=vision_cache_mb)
    pad = eng.model.config.image_token_id
    img = random_image(31, 256, 256)  # 64 image tokens: several blocks
    # The first differing token follows <|vision_end|>; pick a system prompt that puts the
    # block boundary before it inside the image span (pads at s .. s+63, div at s+65).
    for n in range(block_size):
        system = SYSTEM + ' ' + '1' * n  # one token per digit (Qwen splits digits)
        conv = eng.new_conversation(system)
        turn = eng.prompts.user_turn(conv.messages(), 'What shape is it?', [img])
        s = len(conv.token_ids) + turn.media[0][0]
        if (s + 65) % block_size >= 2:
            break
    else:
        pytest.fail('no system prompt puts a block boundary inside the image')
    eng.chat(eng.new_conversation(system), 'What shape is it?', [img],
             SamplingParams(max_tokens=4))
    res = eng.chat(eng.new_conversation(system), 'Describe the scene.', [img],
                   SamplingParams(max_tokens=12))
    s = image_start(res, pad)
    assert s < res.cached_tokens < s + 64  # the hit ends inside the image span
    assert_cold(ref, res, 12)
    if vision_cache_mb:
        assert eng.stats().vision_cache_hits >= 1
    eng.reset()


def test_cancel_after_nth_token_and_timeout(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4)
    conv = eng.new_conversation(SYSTEM)
    eng.cancel()  # a cancel with nothing running does not hit the next prompt
    tokens, result = [], None
    for ev in eng.chat_stream(conv, 'Tell me about the warehouse.',
                              sampling=SamplingParams(max_tokens=60, ignore_eos=True)):
        if ev.result is not None:
            result = ev.result
            break
        tokens.append(ev.token_id)
        if len(tokens) == 5:
            eng.cancel()
    assert result.finish_reason == 'cancelled'
    assert result.token_ids == tokens and len(tokens) == 5
    assert_cold(ref, result, 60, ignore_eos=True)
    # The conversation stays usable: the cancelled answer is history, closed with <|im_end|>.
    r2 = eng.chat(conv, 'Is the path clear?', sampling=SamplingParams(max_tokens=10))
    n = len(result.prompt_token_ids)
    assert r2.prompt_token_ids[n:n + 6] == tokens + [eng.tokenizer.im_end_id]
    assert r2.finish_reason in ('stop', 'length')
    assert_cold(ref, r2, 10)
    # A deadline ends the answer with "timeout"; one passed before the prefill runs nothing
    # (test_prefill_chunks.py: a deadline during a long prefill).
    r3 = eng.chat(conv, 'Go on.', sampling=SamplingParams(max_tokens=50, ignore_eos=True,
                                                        timeout_s=1e-6))
    assert r3.finish_reason == 'timeout' and r3.token_ids == []
    eng.reset(conv)
    assert pool_invariants(eng).used_blocks == 0


def test_context_overflow_drops_old_turns_in_chunks(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4, max_model_len=200)
    conv = eng.new_conversation(SYSTEM)
    system_ids = list(conv.token_ids)
    questions = ['What is in front of you?', 'And what colour is it?', 'How far is it?',
                 'Is the path clear?', 'Turn left at the shelf.', 'What shape is it?']
    dropped = None
    for i, q in enumerate(questions):
        imgs = [random_image(40 + i, 64, 96)] if i in (0, 3) else []
        res = eng.chat(conv, q, imgs, SamplingParams(max_tokens=16, ignore_eos=True))
        assert res.finish_reason == 'length'
        assert len(res.prompt_token_ids) + 16 <= 200
        assert res.prompt_token_ids[:len(system_ids)] == system_ids  # system prompt kept
        if res.dropped_turns:
            dropped = res
            break
    assert dropped is not None, 'max_model_len never overflowed'
    assert dropped.dropped_turns >= 2  # the older half, not one turn at a time
    assert eng.stats().dropped_turns == dropped.dropped_turns
    assert_cold(ref, dropped, 16, ignore_eos=True)
    # The newest turn alone cannot fit: context_full, no exception, history unchanged.
    before = list(conv.token_ids)
    res = eng.chat(conv, 'word ' * 300, sampling=SamplingParams(max_tokens=4))
    assert res.finish_reason == 'context_full' and res.token_ids == [] and res.error
    assert conv.token_ids == before
    eng.reset()


def test_exhaustion_truncates_rejects_and_recovers(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4, num_kv_blocks=14)  # 56 tokens
    conv = eng.new_conversation('You are a robot.')
    res = eng.chat(conv, 'Describe the image.', sampling=SamplingParams(
        max_tokens=80, ignore_eos=True))
    s = eng.stats()
    assert res.finish_reason == 'kv_exhausted'
    assert len(res.prompt_token_ids) + len(res.token_ids) - 1 == 56  # every slot used
    assert s.truncated_generations == 1 and s.exhaustion_events == 1 and s.used_blocks == 14
    assert_cold(ref, res, 80, ignore_eos=True)
    # The next turn does not fit beside the full history: the ladder drops the old turn.
    r2 = eng.chat(conv, 'Is it red?', sampling=SamplingParams(max_tokens=4, ignore_eos=True))
    assert r2.finish_reason == 'length' and r2.dropped_turns == 1
    assert eng.stats().exhaustion_events == 2
    assert_cold(ref, r2, 4, ignore_eos=True)
    # A prompt larger than the whole pool is rejected with a reason, nothing raised.
    big = eng.chat(conv, 'go ' * 80, sampling=SamplingParams(max_tokens=4))
    assert big.finish_reason == 'kv_exhausted' and big.token_ids == [] and 'pool' in big.error
    assert eng.stats().rejected_prompts == 1
    eng.reset(conv)
    assert pool_invariants(eng).used_blocks == 0
    ok = eng.chat(conv, 'Hello.', sampling=SamplingParams(max_tokens=4, ignore_eos=True))
    assert ok.finish_reason == 'length'
    assert_cold(ref, ok, 4, ignore_eos=True)
    eng.reset()


def test_random_operations_keep_pool_invariants(tiny_ckpt):
    # A pool smaller than one conversation at max_model_len (30 blocks): idle conversations give
    # way first, and the rest of the ladder still runs for the active one.
    eng = make_engine(tiny_ckpt, 4, num_kv_blocks=20, max_model_len=120)
    rng = random.Random(1)
    words = 'robot red blue cube table door left right path clear camera shelf'.split()
    images = [random_image(50 + i, 64, 64 + 32 * i) for i in range(3)]
    convs = [eng.new_conversation(SYSTEM)]
    reasons = set()
    for _ in range(220):
        op = rng.random()
        conv = rng.choice(convs)
        if op < 0.55:
            text = ' '.join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            imgs = [rng.choice(images)] if rng.random() < 0.25 else []
            res = eng.chat(conv, text, imgs, SamplingParams(max_tokens=rng.randint(1, 6),
                                                            ignore_eos=rng.random() < 0.5))
            reasons.add(res.finish_reason)
        elif op < 0.65:
            for i, ev in enumerate(eng.chat_stream(conv, rng.choice(words), sampling=(
                    SamplingParams(max_tokens=8, ignore_eos=True)))):
                if i == 0:
                    eng.cancel()
                if ev.result is not None:
                    reasons.add(ev.result.finish_reason)
        elif op < 0.8:
            eng.reset(conv)
        elif op < 0.95:
            if len(convs) < 4:
                convs.append(eng.new_conversation(rng.choice([SYSTEM, None, 'Be brief.'])))
        else:
            eng.reset()
        pool_invariants(eng, convs)
        for c in convs:
            assert c.num_kv_tokens < len(c.token_ids) or not c.token_ids
            assert len(c.block_table) * 4 >= c.num_kv_tokens
    s = eng.stats()
    assert s.exhaustion_events > 0 and s.evictions > 0 and s.prefix_hits > 0
    assert s.idle_releases > 0
    assert {'cancelled', 'kv_exhausted'} <= reasons
    eng.reset()
    assert pool_invariants(eng).used_blocks == 0


def test_stream_deltas_concatenate_to_the_text(tiny_ckpt):
    eng = make_engine(tiny_ckpt, 4)
    conv = eng.new_conversation()
    params = SamplingParams(max_tokens=120, temperature=1.0, seed=3, ignore_eos=True)
    events = list(eng.chat_stream(conv, 'Ünïcödé: café, 日本語 🤖', sampling=params))
    res = events[-1].result
    deltas = [ev.delta for ev in events]
    assert ''.join(deltas) == res.text == eng.tokenizer.decode(res.token_ids)
    assert any(ord(ch) > 127 for ch in res.text)  # multi-byte characters were produced
    # Sampled byte tokens can form invalid UTF-8 (U+FFFD in the final text too); a delta never
    # cuts a valid multi-byte character, which the equality above checks: a cut character
    # would show up as U+FFFD in the deltas but not in the decode of all ids.
    assert '' in deltas[:-1]  # text held back inside a character
    # Seeded sampling is reproducible.
    eng.reset(conv)
    again = eng.chat(conv, 'Ünïcödé: café, 日本語 🤖', sampling=params)
    assert again.token_ids == res.token_ids
