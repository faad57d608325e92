# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's refusals: sender text cut short, one message per topic and kind per period."""

from orin_llm_node.refusals import REASON_CHARS, RefusalLimiter, clip, preview


def test_clip_cuts_long_text_and_says_how_long_it_was():
    assert clip('rgb8') == 'rgb8'
    cut = clip('x' * 100000)
    assert len(cut) < 80 and cut.endswith('(100000 characters)')
    assert len(clip('y' * 100000, REASON_CHARS)) < REASON_CHARS + 30
    assert preview('a\n  b ' + 'c' * 100, 10) == 'a b ccc...'


def test_one_message_per_topic_and_kind_per_period_the_rest_counted():
    limiter = RefusalLimiter(period_s=1.0)
    assert limiter.admit('image', 'encoding', 0.0) == (True, 0)
    assert limiter.admit('image', 'encoding', 0.5) == (False, 0)
    assert limiter.admit('image', 'encoding', 0.9) == (False, 0)
    assert limiter.admit('image', 'too_short', 0.9) == (True, 0)       # another kind
    assert limiter.admit('image/compressed', 'encoding', 0.9) == (True, 0)   # another topic
    assert limiter.admit('image', 'encoding', 1.0) == (True, 2)        # two held back


def test_the_limiter_stays_bounded_whatever_it_is_fed():
    limiter = RefusalLimiter(period_s=1.0, max_keys=8)
    for i in range(10000):
        limiter.admit('image', f'kind {i}', float(i))
    assert len(limiter._keys) == 8
