# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The KV cache manager's admission at its exact boundaries, and its last fallback.

Over the real manager, pool and conversation (no model: the turns are plain token ids, and
an answer is generated as the engine does it -- append a token, make room for it, record its
K/V; the last token of an answer never gets K/V). An answer that ends exactly at
``max_model_len``, or that fills the pool to its last slot, keeps every old turn; one token
more drops the older half. When even dropping every old turn leaves too little room, the
answer still runs and is cut where the pool ends (engine: compared with transformers), and a
prompt that alone exceeds the pool is refused with the history untouched.
"""

from _engine_reference import Reference
import pytest

from orin_llm_node.engine import EngineConfig, FinishReason, LLMEngine, SamplingParams
from orin_llm_node.engine.block_pool import BlockPool
from orin_llm_node.engine.conversation import Conversation
from orin_llm_node.engine.kv_manager import KVBlocks, KVCacheManager
from orin_llm_node.processing import PromptPiece

BS = 4
END = 2  # stands for <|im_end|>: closes each turn, never gets K/V


def piece(n, first=100):
    return PromptPiece([{'role': 'user', 'content': f'{n} tokens'}], list(range(first, first + n)))


def setup(num_blocks, max_model_len, system=8):
    pool = BlockPool(num_blocks, BS, order_seed=11)
    manager = KVCacheManager(pool, max_model_len)
    conv = Conversation(piece(system, first=10), KVBlocks())
    manager.track(conv)
    return manager, conv


def answer(manager, conv, turn_len, max_tokens):
    """Admit a turn and generate as ``LLMEngine._generate`` does; ``(plan, tokens, finish)``."""
    plan = manager.admit(conv, piece(turn_len, first=200 + turn_len), max_tokens)
    if plan.refused:
        return plan, 0, plan.refused
    manager.kv_written(conv, len(conv.token_ids))      # the prefill
    generated, finish = 0, FinishReason.LENGTH
    while True:
        conv.append_token(300 + generated)
        generated += 1
        if generated >= max_tokens:
            break
        if len(conv.token_ids) >= manager.max_model_len:
            finish = FinishReason.CONTEXT_FULL
            break
        context = len(conv.token_ids)
        if not manager.extend(conv, context):
            finish = FinishReason.KV_EXHAUSTED
            break
        manager.kv_written(conv, context)            # the decode step
    conv.close_turn('', END)
    manager.finish(conv)
    return plan, generated, finish


def invariants(manager, conv):
    pool = manager.pool
    assert pool.num_free + pool.num_cached + pool.num_used == pool.num_blocks
    assert pool.num_used == len(conv.block_table)
    assert len(conv.block_table) * BS >= conv.num_kv_tokens


def test_an_answer_ending_exactly_at_max_model_len_keeps_the_history():
    manager, conv = setup(256, max_model_len=64)
    answer(manager, conv, 10, 6)
    history, turn = len(conv.token_ids), piece(9)
    fits = 64 - history - len(turn.token_ids)
    assert manager.plan(conv, turn, fits).drop == 0
    assert manager.plan(conv, turn, fits + 1).drop == 1
    before = list(conv.token_ids)
    plan, generated, finish = answer(manager, conv, 9, fits)
    assert (plan.drop, generated, finish) == (0, fits, FinishReason.LENGTH)
    assert conv.token_ids[:len(before)] == before and len(conv.token_ids) == 64 + 1  # + END
    assert manager.stats().dropped_turns == 0
    invariants(manager, conv)


def test_an_answer_filling_the_pool_to_its_last_slot_keeps_the_history():
    manager, conv = setup(16, max_model_len=4096)
    answer(manager, conv, 10, 6)
    pool = manager.pool
    assert len(conv.block_table) + pool.num_available == pool.num_blocks
    prompt = len(conv.token_ids) + 9
    fits = pool.num_blocks * BS - prompt + 1   # the last token needs no K/V
    plan = manager.plan(conv, piece(9), fits)
    assert plan.drop == 0 and not plan.pool_drop and not plan.refused
    over = manager.plan(conv, piece(9), fits + 1)
    assert over.drop == 1 and over.pool_drop
    plan, generated, finish = answer(manager, conv, 9, fits)
    assert (plan.drop, generated, finish) == (0, fits, FinishReason.LENGTH)
    assert pool.num_used == pool.num_blocks and conv.num_kv_tokens == pool.num_blocks * BS
    s = manager.stats()
    assert s.dropped_turns == s.truncated_generations == s.exhaustion_events == 0
    invariants(manager, conv)


@pytest.mark.parametrize('spare', [5, 0], ids=['room_to_spare', 'prompt_fills_the_pool'])
def test_when_dropping_every_turn_is_not_enough_the_answer_is_cut_at_the_pool(spare):
    manager, conv = setup(16, max_model_len=4096)
    for _ in range(3):
        answer(manager, conv, 7, 4)
    system = conv.turn_lengths()[0]
    turn = 16 * BS - system - spare           # the prompt alone, every old turn dropped
    plan, generated, finish = answer(manager, conv, turn, 1000)
    assert plan.drop == 3 and plan.pool_drop and not plan.refused
    assert finish == FinishReason.KV_EXHAUSTED and generated == spare + 1
    assert conv.num_turns == 1 and conv.num_kv_tokens == 16 * BS
    s = manager.stats()
    assert (s.dropped_turns, s.truncated_generations, s.exhaustion_events) == (3, 1, 2)
    invariants(manager, conv)


def test_a_prompt_larger_than_the_pool_is_refused_and_the_history_kept():
    manager, conv = setup(16, max_model_len=4096)
    answer(manager, conv, 7, 4)
    before, turns = list(conv.token_ids), conv.num_turns
    turn = 16 * BS - conv.turn_lengths()[0] + 1
    plan, generated, finish = answer(manager, conv, turn, 10)
    assert finish == FinishReason.KV_EXHAUSTED and generated == 0
    assert 'KV pool exhausted' in plan.reason and '17 blocks' in plan.reason
    assert conv.token_ids == before and conv.num_turns == turns
    assert manager.stats().rejected_prompts == 1
    invariants(manager, conv)


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def test_the_engine_cuts_the_answer_after_dropping_every_turn(tiny_ckpt, ref):
    """The same fallback through the engine: the tokens are the reference's, up to the cut."""
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', block_size=BS,
                                 num_kv_blocks=24, block_order_seed=9))
    conv = eng.new_conversation('You are a robot.')
    for text in ('Where is the cup?', 'And the door?'):
        res = eng.chat(conv, text, sampling=SamplingParams(max_tokens=4, ignore_eos=True))
        assert res.finish_reason == 'length'
    res = eng.chat(conv, 'Describe the whole room, slowly.',
                   sampling=SamplingParams(max_tokens=200, ignore_eos=True))
    assert res.dropped_turns == 2 and res.finish_reason == 'kv_exhausted'
    assert len(res.prompt_token_ids) + len(res.token_ids) - 1 == 24 * BS  # every slot used
    expected = ref.generate(res.prompt_token_ids, res.prompt_images, 200, True)
    assert res.token_ids == expected[:len(res.token_ids)]
    s = eng.stats()
    assert (s.dropped_turns, s.truncated_generations) == (2, 1)
    eng.reset()
    assert eng.stats().used_blocks == 0
