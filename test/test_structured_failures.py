# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Constrained answers that cannot be valid, through LLMEngine with the real llguidance.

The rule held: ``finish_reason == "stop"`` on a constrained answer means ``valid``; anything
else is refused before the turn (``ValueError``, one sentence) or ends with ``finish_reason
"error"`` and the reason. A failed turn -- a grammar's dead end mid-answer, or any exception
-- leaves the conversation and the KV pool as they were before it (prefix cache aside).

* grammars that match no text, and grammars that spell a control token, are refused up front;
* a grammar that forces a control token's text without spelling it, or a schema whose
  ``$ref`` leads nowhere after a few tokens, ends the answer with ``error`` (no -inf logits,
  no ``RuntimeError``) and rolls the turn back;
* the library's limits and dumps become one short sentence;
* a number beyond a float's range is ``None`` in ``parsed`` (strict JSON), on random weights.
"""

import json
import math
from pathlib import Path

from _structured_cases import DEAD_AFTER_KEY, FORCED_VISION, SELF_REF, TOO_BIG
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.structured import parse_answer

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'


def regex(pattern):
    return {'type': 'regex', 'pattern': pattern}


def schema(s):
    return {'type': 'json_schema', 'schema': s}


@pytest.fixture(scope='module')
def demo():
    torch.set_num_threads(2)
    return LLMEngine(EngineConfig(model_path=DEMO, device='cpu', dtype='float32',
                                  enable_cuda_graph=False, block_order_seed=3))


def pool_is_whole(engine):
    s = engine.stats()
    return s.free_blocks + s.cached_blocks + s.used_blocks == s.total_blocks


def history(engine, turns=('What shape is it?', 'And what colour is it?')):
    """A conversation with ``turns`` answered (greedy, unconstrained)."""
    conv = engine.new_conversation('You are a robot.')
    for text in turns:
        engine.chat(conv, text, sampling=SamplingParams(max_tokens=6))
    return conv


def assert_as_before(engine, conv, before, turns, held):
    """``conv`` is back to ``before`` with its blocks in the pool, and answers as a twin would.

    ``held``: used blocks before the failed turn (``conv``'s own); after it ``conv`` holds none,
    the pool's counts add up, and the next turn is token for token that of a conversation that
    never saw the failed turn (its KV reused from the cache where hashed).
    """
    assert conv.token_ids == before and conv.num_turns == len(turns)
    s = engine.stats()
    assert held > 0 and s.used_blocks == 0 and pool_is_whole(engine)
    follow = SamplingParams(max_tokens=6)
    res = engine.chat(conv, 'Is it big?', sampling=follow)
    assert res.cached_tokens > 0  # the restored history's full blocks were still cached
    twin = history(engine, turns)
    ref = engine.chat(twin, 'Is it big?', sampling=follow)
    assert res.prompt_token_ids == ref.prompt_token_ids and res.token_ids == ref.token_ids
    engine.reset()


@pytest.mark.parametrize('fmt,sentence', [
    (schema(SELF_REF), 'the schema admits no JSON value at all'),
    (regex(r'[^\s\S]'), 'the regex matches no text at all'),
    (regex(r'ok[^\s\S]'), 'the regex matches no text at all'),
], ids=['self-ref', 'empty-class', 'empty-after-text'])
def test_a_grammar_that_matches_no_text_is_refused_before_the_turn(demo, fmt, sentence):
    conv = history(demo)
    before = list(conv.token_ids)
    with pytest.raises(ValueError, match='response_format rejected') as info:
        demo.chat(conv, 'Anything?', sampling=SamplingParams(response_format=fmt))
    assert sentence in str(info.value) and len(str(info.value)) < 300
    assert conv.token_ids == before
    demo.reset()


@pytest.mark.parametrize('fmt,token', [
    (regex(r'<\|im_end\|>ok'), '<|im_end|>'),
    (schema({'enum': ['<|im_end|>']}), '<|im_end|>'),
    (regex(r'<\|image_pad\|>'), '<|image_pad|>'),
    (regex(r'look: <[|]vision_start[|]>'), '<|vision_start|>'),
    (schema({'type': 'object', 'properties': {'<|im_start|>': {'type': 'integer'}}}),
     '<|im_start|>'),
], ids=['regex-im_end', 'enum-im_end', 'regex-image_pad', 'class-vision_start', 'key-im_start'])
def test_a_grammar_that_spells_a_control_token_is_refused_before_the_turn(demo, fmt, token):
    conv = history(demo)
    before, used = list(conv.token_ids), demo.stats().used_blocks
    with pytest.raises(ValueError, match='spells the control token') as info:
        demo.chat(conv, 'Anything?', sampling=SamplingParams(response_format=fmt))
    assert repr(token) in str(info.value)
    assert conv.token_ids == before and demo.stats().used_blocks == used
    demo.reset()


def test_control_text_in_annotations_and_free_strings_is_not_refused(demo):
    fmt = schema({'type': 'object', 'description': 'ends at <|im_end|>',
                  'properties': {'note': {'type': 'string', 'maxLength': 8}},
                  'required': ['note']})
    conv = demo.new_conversation()
    res = demo.chat(conv, 'Note?', sampling=SamplingParams(max_tokens=24, response_format=fmt))
    assert res.finish_reason in ('stop', 'length')
    assert res.valid is (res.finish_reason == 'stop')
    demo.reset()


@pytest.mark.parametrize('fmt,sentence', [
    (regex('(left|right'), 'the regex does not parse: unclosed group'),
    (schema({'type': 'object', 'properties': {'x': {'type': 'string', 'pattern': '(a'}}}),
     'a regular expression in the schema does not parse: unclosed group'),
    (schema(json.loads('{"type": "array", "items": ' * 300 + '{}' + '}' * 300)),
     'the schema nests too deeply for the constrained decoder'),
    (schema({'$ref': '#/$defs/missing'}),
     "the library refused the schema: Pointer '/$defs/missing' does not exist"),
], ids=['regex', 'schema-pattern', 'deep', 'missing-ref'])
def test_the_library_refusals_are_one_short_line(demo, fmt, sentence, logged):
    """The library's multi-line messages become one sentence; its detail goes to the log."""
    records = logged('orin_llm_node.engine.structured')
    conv = demo.new_conversation()
    with pytest.raises(ValueError) as info:
        demo.chat(conv, 'Anything?', sampling=SamplingParams(response_format=fmt))
    said = str(info.value)
    assert said.startswith(f'response_format rejected: {sentence}') and len(said) < 200
    if 'levels deep' not in said:  # refused before the library saw it: nothing to log
        assert any('llguidance on a response_format' in r.getMessage() for r in records)


@pytest.mark.parametrize('fmt,sentence,generated', [
    (regex(FORCED_VISION),
     "the regex allows no token after the answer's first token: what it asks for next is "
     'spelt only by a control token', 1),
    (schema(DEAD_AFTER_KEY),
     "the schema admits no JSON value after the answer's first 5 tokens", 5),
    (regex(TOO_BIG), 'the regex is too big', 1),
], ids=['forced-vision-token', 'ref-dead-end', 'too-big'])
def test_a_dead_end_mid_answer_is_an_error_and_leaves_no_trace(demo, fmt, sentence, generated):
    turns = ('What shape is it?', 'And what colour is it?')
    conv = history(demo, turns)
    before, held = list(conv.token_ids), demo.stats().used_blocks
    res = demo.chat(conv, 'Report it.', sampling=SamplingParams(max_tokens=32,
                                                                 response_format=fmt))
    assert res.finish_reason == 'error' and res.valid is False and res.parsed is None
    assert sentence in res.error and len(res.error) < 300 and '<state>' not in res.error
    assert len(res.token_ids) == generated
    assert_as_before(demo, conv, before, turns, held)


def test_an_exception_mid_answer_rolls_the_turn_back(demo):
    turns = ('What shape is it?', 'And what colour is it?')
    conv = history(demo, turns)
    before, held = list(conv.token_ids), demo.stats().used_blocks
    stream = demo.chat_stream(conv, 'Describe the scene in detail.',
                              sampling=SamplingParams(max_tokens=16, ignore_eos=True))
    for _ in range(3):
        next(stream)
    assert conv.token_ids != before  # the turn is open, three tokens in
    with pytest.raises(RuntimeError, match='the consumer failed'):
        stream.throw(RuntimeError('the consumer failed'))
    assert_as_before(demo, conv, before, turns, held)


def test_a_turn_that_dropped_old_turns_gets_them_back_when_it_fails(tiny_ckpt):
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32',
                                 max_model_len=96, block_order_seed=1))
    conv = eng.new_conversation()
    for text in ('first question here', 'second question here', 'third question here'):
        eng.chat(conv, text, sampling=SamplingParams(max_tokens=8, ignore_eos=True))
    before, turns = list(conv.token_ids), conv.num_turns
    stream = eng.chat_stream(conv, 'a fourth, longer question that needs the room',
                             sampling=SamplingParams(max_tokens=24, ignore_eos=True))
    next(stream)
    assert conv.num_turns < turns + 1  # the turn dropped old turns to fit
    with pytest.raises(KeyboardInterrupt):
        stream.throw(KeyboardInterrupt())
    assert conv.token_ids == before and conv.num_turns == turns
    assert eng.stats().used_blocks == 0 and pool_is_whole(eng)


def test_numbers_beyond_a_float_are_null_in_parsed(make_ckpt):
    """Random weights sampled at temperature 1 write exponents like ``E0662`` now and then."""
    eng = LLMEngine(EngineConfig(model_path=make_ckpt('numbers', seed=0), device='cpu',
                                 dtype='float32', block_order_seed=0))
    fmt = schema({'type': 'array', 'items': {'type': 'number'}, 'minItems': 1,
                  'maxItems': 2})
    beyond = 0
    for seed in range(200):
        conv = eng.new_conversation()
        res = eng.chat(conv, 'Numbers?', sampling=SamplingParams(
            max_tokens=48, temperature=1.0, seed=seed, response_format=fmt))
        eng.reset(conv)
        assert res.valid is (res.finish_reason == 'stop'), res
        if not res.valid:
            continue
        loose = json.loads(res.text)  # Python's own reading: inf where a float overflows
        assert res.parsed == [None if math.isinf(x) else x for x in loose], res.text
        json.dumps(res.parsed, allow_nan=False)  # strict JSON carries it
        beyond += any(math.isinf(x) for x in loose)
        if beyond >= 2:
            break
    assert beyond >= 2, 'no answer overflowed a float in 200 sampled answers'


def test_parse_answer_keeps_every_value_strict():
    text = '{"a": 0.78E2140025988, "b": -1e999, "c": 1e-999, "d": %s, "e": 12}' % ('9' * 5000)
    assert parse_answer({'type': 'json_object'}, text) == {
        'a': None, 'b': None, 'c': 0.0, 'd': None, 'e': 12}
    with pytest.raises(ValueError, match='nests deeper'):
        parse_answer({'type': 'json_object'}, '[' * 5000 + ']' * 5000)
    assert parse_answer({'type': 'regex', 'pattern': '.*'}, '1e999') is None
