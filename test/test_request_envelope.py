# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ``prompt/json`` envelope's one table of keys: what it takes, what it refuses and why.

(The node's refusals over real rclpy: test_structured_node.py.)
"""

import json

import pytest

from orin_llm_node.parameters import MAX_PROMPT_CHARS
from orin_llm_node.ros.request_envelope import (
    KEYS,
    MAX_TAG_SCAN_CHARS,
    EnvelopeError,
    parse_envelope,
    stamp_ns,
)

SCHEMA = {'type': 'object', 'properties': {'colour': {'enum': ['red', 'blue']}},
          'required': ['colour'], 'additionalProperties': False}


def test_a_full_envelope_is_taken_as_it_is():
    env = {'prompt': 'What colour?', 'response_format': {'type': 'json_schema',
                                                          'schema': SCHEMA},
           'max_new_tokens': 64, 'temperature': 0.0, 'conversation': 'new', 'tag': 't-1',
           'video_s': 4}
    assert parse_envelope(json.dumps(env)) == env
    assert parse_envelope('{"prompt": "hi"}') == {'prompt': 'hi'}
    # The table lists every key the README documents (the tool and grounding keys, which
    # do not go with response_format: test_tool_requests.py; image_stamp, not with video_s).
    assert set(KEYS) == set(env) | {'tools', 'tool_choice', 'tool_results', 'detect',
                                    'image_stamp'}


def test_image_stamp_is_a_header_stamp_for_single_frames():
    env = {'prompt': 'x', 'image_stamp': {'sec': 1_700_000_000, 'nanosec': 999_999_999}}
    assert parse_envelope(json.dumps(env)) == env
    assert stamp_ns(env) == 1_700_000_000_999_999_999 and stamp_ns({'prompt': 'x'}) is None
    for bad in ({'sec': 1}, {'sec': 1, 'nanosec': 10**9}, {'sec': -1, 'nanosec': 0},
                {'sec': 1.5, 'nanosec': 0}, {'sec': True, 'nanosec': 0}, 17,
                {'sec': 1, 'nanosec': 0, 'x': 1}):
        with pytest.raises(EnvelopeError, match='image_stamp must be a header stamp'):
            parse_envelope(json.dumps({'prompt': 'x', 'image_stamp': bad}))
    with pytest.raises(EnvelopeError, match='image_stamp pairs single frames'):
        parse_envelope(json.dumps({**env, 'video_s': 2}))


@pytest.mark.parametrize(('text', 'reason', 'tag'), [
    ('not json', 'not JSON', None),
    ('["prompt"]', 'must be a JSON object, got list', None),
    ('{"tag": "a"}', "'prompt' is required", 'a'),
    ('{"prompt": "  ", "tag": "b"}', 'prompt must not be empty', 'b'),
    ('{"prompt": 3}', 'prompt must be a string', None),
    ('{"prompt": "x", "max_tokens": 5, "tag": "c"}', "unknown key(s) 'max_tokens'", 'c'),
    ('{"prompt": "x", "max_new_tokens": 0}', 'max_new_tokens must be a positive integer',
     None),
    ('{"prompt": "x", "max_new_tokens": true}', 'max_new_tokens must be a positive integer',
     None),
    ('{"prompt": "x", "max_new_tokens": 2.5}', 'max_new_tokens must be a positive integer',
     None),
    ('{"prompt": "x", "temperature": -1}', 'temperature must be >= 0', None),
    ('{"prompt": "x", "temperature": "hot"}', 'temperature must be a number', None),
    ('{"prompt": "x", "conversation": "old"}', "conversation must be one of 'new'", None),
    ('{"prompt": "x", "tag": 7}', 'tag must be a string', None),
    ('{"prompt": "x", "video_s": -1}', 'video_s must be >= 0', None),
    ('{"prompt": "x", "video_s": "4"}', 'video_s must be a number', None),
    ('{"prompt": "x", "response_format": "json"}', 'response_format must be an object', None),
    ('{"prompt": "x", "response_format": {"type": "yaml"}}', 'response_format.type must be',
     None),
    ('{"prompt": "x", "response_format": {"type": "json_schema"}}', "needs 'schema'", None),
    ('{"prompt": "x", "response_format": {"type": "regex", "pattern": ""}}',
     'pattern must be a non-empty string', None),
    ('{"prompt": "x", "response_format": {"type": "json_object", "schema": {}}}',
     'takes no key schema', None),
])
def test_refusals_name_the_reason_and_keep_the_tag(text, reason, tag):
    with pytest.raises(EnvelopeError, match=None) as err:
        parse_envelope(text)
    assert reason in str(err.value)
    assert err.value.tag == tag


DEEP = '[' * 2000 + ']' * 2000                  # 4 KB: json.loads raises RecursionError


def _nested_schema(levels):
    return '{"type": "array", "items": ' * levels + '{"type": "string"}' + '}' * levels


@pytest.mark.parametrize('text', [
    DEEP,
    '{"prompt": "x", "tag": "d1", "video_s": ' + DEEP + '}',
    '{"prompt": "x", "tag": ' + DEEP + '}',
    '{"prompt": "x", "tag": "d2", "response_format": {"type": "json_schema", "schema": '
    + _nested_schema(3000) + '}}',
    '{"prompt": "x", "tag": "d3", "response_format": {"type": "json_schema", "schema": '
    + _nested_schema(130) + '}}',
], ids=['bare', 'video_s', 'tag', 'schema 3000', 'schema 130'])
def test_json_nested_too_deep_is_refused_wherever_it_is(text):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(text)
    assert str(err.value) == 'nested more than 128 levels deep'
    assert err.value.tag is None    # nothing of such a text is read, its tag included


def test_a_schema_as_deep_as_the_library_takes_is_accepted():
    schema = json.loads(_nested_schema(60))
    env = {'prompt': 'x', 'response_format': {'type': 'json_schema', 'schema': schema}}
    assert parse_envelope(json.dumps(env)) == env


@pytest.mark.parametrize(('value', 'reason'), [
    ('1e-300', 'temperature must be 0 (greedy) or a finite number in [1.175494e-38'),
    ('1e39', 'temperature must be 0 (greedy) or a finite number in [1.175494e-38'),
    ('Infinity', 'temperature must be a finite number'),
    ('-Infinity', 'temperature must be a finite number'),
    ('NaN', 'temperature must be a finite number'),
])
def test_a_temperature_the_sampler_cannot_take_is_refused(value, reason):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope('{"prompt": "x", "tag": "t", "temperature": ' + value + '}')
    assert str(err.value).startswith(reason) and err.value.tag == 't'


def test_boundaries_that_are_taken():
    from orin_llm_node.engine.config import MAX_TEMPERATURE, MIN_TEMPERATURE

    for env in ({'prompt': 'x', 'max_new_tokens': 1}, {'prompt': 'x', 'temperature': 0},
                {'prompt': 'x', 'temperature': MIN_TEMPERATURE},
                {'prompt': 'x', 'temperature': MAX_TEMPERATURE}, {'prompt': 'x', 'video_s': 0},
                {'prompt': 'x' * 99_000}):
        assert parse_envelope(json.dumps(env)) == env


@pytest.mark.parametrize(('text', 'reason'), [
    ('{"prompt": "x", "max_new_tokens": Infinity}', 'max_new_tokens must be a positive integer'),
    ('{"prompt": "x", "max_new_tokens": 1e400}', 'max_new_tokens must be a positive integer'),
    ('{"prompt": "x", "video_s": Infinity}', 'video_s must be a finite number'),
    ('{"prompt": "x", "video_s": NaN}', 'video_s must be a finite number'),
    ('{"prompt": "\\ud800"}', 'prompt must be valid Unicode'),
    ('{"prompt": "x", "max_new_tokens": ' + '9' * 5000 + '}', 'not JSON: Exceeds the limit'),
])
def test_non_finite_huge_and_unpublishable_values_are_refused(text, reason):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(text)
    assert str(err.value).startswith(reason), err.value


def test_a_tag_that_cannot_be_published_is_not_echoed():
    with pytest.raises(EnvelopeError) as err:
        parse_envelope('{"prompt": "x", "tag": "\\udc80"}')
    assert err.value.tag is None and 'tag must be valid Unicode' in str(err.value)


def test_a_request_longer_than_the_limit_is_refused_with_its_tag():
    text = json.dumps({'prompt': 'x' * 100_001, 'tag': 'big-1'})
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(text)
    assert str(err.value) == f'request of {len(text)} characters rejected (limit 100000)'
    assert err.value.tag == 'big-1'
    # Beyond the scan bound, or not JSON at all: refused, no tag.
    for text in (json.dumps({'prompt': 'x' * MAX_TAG_SCAN_CHARS, 'tag': 'huge'}),
                 '{"tag": "t", "prompt": "' + 'x' * 100_001):
        with pytest.raises(EnvelopeError) as err:
            parse_envelope(text)
        assert err.value.tag is None and 'rejected (limit 100000)' in str(err.value)


def test_the_length_limit_is_exactly_the_documented_one():
    head = '{"prompt": "'
    exact = head + 'x' * (MAX_PROMPT_CHARS - len(head) - 2) + '"}'
    assert len(exact) == MAX_PROMPT_CHARS == 100_000
    assert parse_envelope(exact)['prompt'].startswith('xxx')
    over = head + 'x' * (MAX_PROMPT_CHARS - len(head) - 1) + '"}'
    with pytest.raises(EnvelopeError, match=r'^request of 100001 characters rejected'):
        parse_envelope(over)


@pytest.mark.parametrize('value', ['new', 'continue'])
def test_conversation_takes_new_and_continue(value):
    assert parse_envelope(json.dumps({'prompt': 'x', 'conversation': value}))[
        'conversation'] == value


@pytest.mark.parametrize('value', ['continu', 'cont', 'Continue', 'continue ', ' new', 'ne',
                                   'new continue', 'continuenew', '', ['continue'], None, 1])
def test_conversation_takes_nothing_else(value):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(json.dumps({'prompt': 'x', 'conversation': value, 'tag': 'c'}))
    assert str(err.value) == "conversation must be one of 'new', 'continue'"
    assert err.value.tag == 'c'


@pytest.mark.parametrize(('envelope', 'key'), [
    ('{"detect": "\\ud800"}', 'detect'),
    ('{"detect": ["cup", "\\udfff"]}', 'detect'),
    ('{"tool_results": [{"id": "call_1", "content": "done \\udc00"}]}', 'tool_results'),
    ('{"prompt": "x", "tools": [{"name": "f", "description": "\\ud83d"}]}', 'tools'),
])
def test_text_that_is_not_valid_unicode_is_refused_in_every_key(envelope, key):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(envelope[:-1] + ', "tag": "u"}')
    assert str(err.value) == f'{key} must be valid Unicode (it holds a lone surrogate)'
    assert err.value.tag == 'u'


def test_the_error_text_is_the_reason_alone():
    err = EnvelopeError('prompt is required', 'tag-1')
    assert str(err) == 'prompt is required' and err.args == ('prompt is required',)
    assert err.tag == 'tag-1' and isinstance(err, ValueError)
    # A library's multi-line reason becomes one line; a lone surrogate is escaped.
    assert str(EnvelopeError('bad regex:\n   (\n   ^\n')) == 'bad regex: ( ^'
    assert str(EnvelopeError('tag \udc80')) == 'tag \\udc80'
    with pytest.raises(EnvelopeError) as caught:
        parse_envelope('{"tag": "x"}')
    assert str(caught.value) == "'prompt' is required"


def test_a_grammar_the_library_rejects_is_refused_with_its_reason():
    pytest.importorskip('llguidance')
    with pytest.raises(EnvelopeError) as err:
        parse_envelope('{"prompt": "x", "tag": "g", "response_format": {"type": "regex", '
                       '"pattern": "("}}')
    assert str(err.value).startswith('response_format rejected:') and err.value.tag == 'g'
    assert 'unclosed group' in str(err.value) and '\n' not in str(err.value)
    bad_schema = {'type': 'json_schema', 'schema': {'type': 'object', 'properties': {
        'x': {'type': 'string', 'pattern': '(unclosed'}}}}
    with pytest.raises(EnvelopeError, match='response_format rejected'):
        parse_envelope(json.dumps({'prompt': 'x', 'response_format': bad_schema}))
