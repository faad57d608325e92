# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The sampling draw: Gumbel-max, and rows that leave nothing to pick.

On CUDA ``torch.multinomial`` over a row with a NaN or with every token masked is a
device-side assert that kills the CUDA context; the CPU raises an ordinary error, which the
engine let escape. Now such a row is refused before any draw and the answer ends with
``finish_reason == "error"`` and a reason. The draw keeps softmax's distribution, the top-k /
top-p filters and seeded reproducibility; greedy keeps its tokens. The engine tests run a real
checkpoint (safetensors) whose ``lm_head`` gives one token a NaN logit at every step.
"""

import math

import numpy as np
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.sampler import NonFiniteLogits, Sampler

CPU = torch.device('cpu')
NAN, INF = float('nan'), float('inf')


def sampler(**kw):
    return Sampler(SamplingParams(**kw), CPU)


@pytest.mark.parametrize('params', [{}, {'temperature': 0.7, 'seed': 1},
                                    {'temperature': 1.0, 'top_k': 2, 'seed': 2},
                                    {'temperature': 1.0, 'top_p': 0.5, 'seed': 3}],
                         ids=['greedy', 'temperature', 'top_k', 'top_p'])
@pytest.mark.parametrize('row, word', [
    ([0.1, NAN, 2.0, -1.0], 'NaN'),
    ([NAN] * 4, 'NaN'),
    ([0.1, INF, 2.0, -1.0], '+inf'),
    ([-INF] * 4, 'masked'),
], ids=['one_nan', 'all_nan', 'pos_inf', 'all_masked'])
def test_a_row_with_nothing_to_pick_is_refused_with_the_reason(params, row, word):
    with pytest.raises(NonFiniteLogits, match=word.replace('+', r'\+')):
        sampler(**params)(torch.tensor(row))


def test_every_token_banned_is_refused_and_a_banned_nan_is_not_drawn():
    s = Sampler(SamplingParams(temperature=1.0, seed=0), CPU, banned_ids=[0, 1, 2, 3])
    with pytest.raises(NonFiniteLogits, match='masked'):
        s(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    # A NaN on a banned id is masked away before the pick: the others are drawn.
    s = Sampler(SamplingParams(temperature=1.0, seed=0), CPU, banned_ids=[1])
    assert {s(torch.tensor([0.1, NAN, 0.3, 0.4])) for _ in range(100)} == {0, 2, 3}


def test_a_refused_row_leaves_the_generator_untouched():
    a, b = sampler(temperature=1.0, seed=9), sampler(temperature=1.0, seed=9)
    logits = torch.randn(64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteLogits):
        a(torch.full((64,), NAN))
    assert [a(logits) for _ in range(20)] == [b(logits) for _ in range(20)]


def _frequencies(s, logits, n):
    return np.bincount([s(logits) for _ in range(n)], minlength=logits.numel()) / n


def _softmax(x):
    return torch.softmax(torch.as_tensor(x, dtype=torch.float64), 0).numpy()


N = 20000
#: 5 binomial standard deviations at the largest p(1 - p) = 1/4 (0.018 at N draws).
TOL = 5 * math.sqrt(0.25 / N)


@pytest.mark.parametrize('temperature', [0.5, 1.0, 2.0])
def test_the_draw_follows_the_softmax(temperature):
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    freq = _frequencies(sampler(temperature=temperature, seed=11), logits, N)
    want = _softmax(logits.double() / temperature)
    assert np.abs(freq - want).max() < TOL, (freq, want)


def test_top_k_and_top_p_keep_their_tokens_and_renormalise():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0])
    freq = _frequencies(sampler(temperature=1.0, top_k=3, seed=12), logits, N)
    want = np.concatenate([_softmax(logits[:3]), [0.0, 0.0]])
    assert freq[3:].sum() == 0 and np.abs(freq - want).max() < TOL, (freq, want)
    # top_p 0.8: the first two tokens hold 0.46 + 0.28 = 0.74 < 0.8, the third is needed too.
    probs = _softmax(logits)
    assert probs[:2].sum() < 0.8 <= probs[:3].sum()
    freq = _frequencies(sampler(temperature=1.0, top_p=0.8, seed=13), logits, N)
    assert freq[3:].sum() == 0 and np.abs(freq - want).max() < TOL, (freq, want)


def test_a_seed_reproduces_the_draws_and_greedy_is_the_argmax():
    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(300, generator=g) for _ in range(40)]
    a, b = sampler(temperature=0.9, seed=21), sampler(temperature=0.9, seed=21)
    draws = [a(r) for r in rows]
    assert draws == [b(r) for r in rows]
    assert draws != [sampler(temperature=0.9, seed=22)(r) for r in rows]
    greedy = sampler()
    assert [greedy(r) for r in rows] == [int(torch.argmax(r)) for r in rows]


@pytest.fixture(scope='module')
def engine(poisoned_ckpt):
    eng = LLMEngine(EngineConfig(model_path=poisoned_ckpt, device='cpu', block_size=4,
                                 num_kv_blocks=256, block_order_seed=3))
    yield eng
    eng.reset()


@pytest.mark.parametrize('params', [{'temperature': 0.8, 'seed': 4},
                                    {'temperature': 1.0, 'top_p': 0.9, 'top_k': 20}, {}],
                         ids=['temperature', 'top_p_top_k', 'greedy'])
def test_a_nan_logit_ends_the_answer_with_error_and_the_engine_goes_on(engine, params):
    conv = engine.new_conversation('You are a robot.')
    for text in ('What is in front of you?', 'And now?'):
        events = list(engine.chat_stream(conv, text,
                                         sampling=SamplingParams(max_tokens=8, **params)))
        res = events[-1].result
        assert res.finish_reason == 'error' and res.token_ids == [] and res.text == ''
        assert 'NaN' in res.error and 'no token to pick' in res.error
        # The turn is closed as any other: the history stays a valid conversation.
        assert conv.token_ids[-1] == engine.tokenizer.im_end_id
    stats = engine.stats()
    assert stats.free_blocks + stats.cached_blocks + stats.used_blocks == stats.total_blocks
    engine.reset(conv)
    assert engine.stats().used_blocks == 0
