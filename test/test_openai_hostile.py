# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-API backend against a server that misbehaves: real HTTP on loopback.

A scripted stdlib server (_fake_openai.py) and the backend's real httpx client.  Whatever the
server sends, the answer ends with one result within bounds: lone surrogates anywhere become
U+FFFD (every string of the result and the history is valid Unicode, so the node can publish
it and send it again), a stream line or an answer that grows without end is cut, a server that
ignores ``max_tokens`` is stopped there, a NaN count is unknown, one choice is the answer and
nothing after its finish is; ``check()`` refuses a ``GET /models`` that drips or never ends.
"""

import itertools
import json
from pathlib import Path
import time

from _fake_openai import MODEL, FakeServer, answer, chunk, drip, flood, paced, sse
import pytest

pytest.importorskip('httpx')

from orin_llm_node.backends import BackendUnavailable, OpenAIBackend, OpenAIConfig  # noqa: E402
from orin_llm_node.backends.openai_backend import MAX_TOKEN_CHARS  # noqa: E402
from orin_llm_node.backends.openai_wire import MAX_LINE_BYTES  # noqa: E402
from orin_llm_node.engine import SamplingParams  # noqa: E402

SHORT = SamplingParams(max_tokens=32)


@pytest.fixture
def server():
    with FakeServer() as srv:
        yield srv


def _backend(url, **kw):
    kw.setdefault('connect_timeout_s', 2.0)
    kw.setdefault('read_timeout_s', 10.0)
    kw.setdefault('retries', 0)
    return OpenAIBackend(OpenAIConfig(url, MODEL, **kw))


def _valid(*texts):
    for text in texts:
        text.encode('utf-8')        # raises for a lone surrogate


def _rss_mb():
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
    raise AssertionError('no VmRSS')


def test_lone_surrogates_from_the_server_become_replacement_characters(server):
    backend = _backend(server.url)
    conv = backend.new_conversation('You are a robot.')
    # The answer text itself, and the server's model name.
    bad = 'bad \udfff model'
    server.reply = (200, [sse({**chunk('cup \ud83d'), 'model': bad},
                              {**chunk(' and \ud800 more', finish='stop'), 'model': bad})])
    events = list(backend.chat_stream(conv, 'What is there?', sampling=SHORT))
    result = events[-1].result
    assert result.error is None and result.text == 'cup \ufffd and \ufffd more'
    assert ''.join(e.delta for e in events) == result.text
    assert result.model == 'bad \ufffd model' and backend.server_model == 'bad \ufffd model'
    _valid(json.dumps(conv.messages(), ensure_ascii=False))
    # A JSON answer whose string holds half of an emoji's escape pair.
    server.reply = (200, [sse(chunk('{"label": "cup \\ud83d"}', finish='stop'))])
    fmt = SamplingParams(max_tokens=32, response_format={'type': 'json_object'})
    result = backend.chat(conv, 'As JSON.', sampling=fmt)
    assert result.valid and result.parsed == {'label': 'cup \ufffd'}
    # An HTTP error's message and a mid-stream error's.
    server.reply = (400, [json.dumps({'error': {'message': 'no \ud800 way'}}).encode()])
    result = backend.chat(conv, 'Again?', sampling=SHORT)
    assert result.finish_reason == 'error' and 'no \ufffd way' in result.error
    server.reply = (200, [sse(chunk('x'), {'error': {'message': 'broke \udc00'}}, done=False)])
    result = backend.chat(conv, 'Again?', sampling=SHORT)
    assert result.finish_reason == 'error' and 'broke \ufffd' in result.error
    _valid(backend.stats().last_error)
    # The history (sent whole with every prompt) went out and comes back valid.
    server.reply = answer('Fine.')
    assert backend.chat(conv, 'Still there?', sampling=SHORT).text == 'Fine.'
    assert server.requests[-1]['messages'][2]['content'] == 'cup \ufffd and \ufffd more'


def test_the_models_list_with_a_lone_surrogate_is_refused_in_valid_text(server):
    server.models = (200, [b'{"data": [{"id": "other \\ud800"}]}'])
    with pytest.raises(BackendUnavailable) as refused:
        _backend(server.url).check()
    assert 'other \ufffd' in str(refused.value)
    _valid(str(refused.value))


def test_a_stream_line_that_never_ends_is_cut_without_holding_it(server):
    backend = _backend(server.url, request_timeout_s=60.0)
    server.reply = (200, itertools.chain(
        [b'data: {"choices": [{"index": 0, "delta": {"content": "'], flood()))
    before = _rss_mb()
    t0 = time.monotonic()
    result = backend.chat(backend.new_conversation(), 'Talk.', sampling=SHORT)
    assert time.monotonic() - t0 < 30
    assert result.finish_reason == 'error' and 'longer than' in result.error, result.error
    # The line is dropped once past the bound: its few MB, not the whole flood.
    assert _rss_mb() - before < 20 * MAX_LINE_BYTES / 2**20


def test_one_huge_chunk_is_cut_at_the_answer_bound(server):
    backend = _backend(server.url)
    conv = backend.new_conversation()
    server.reply = (200, [sse(chunk('y' * 2_000_000), chunk(finish='stop'))])
    events = list(backend.chat_stream(conv, 'Talk.', sampling=SHORT))
    result = events[-1].result
    assert result.finish_reason == 'length' and result.error is None
    assert len(result.text) == SHORT.max_tokens * MAX_TOKEN_CHARS
    assert ''.join(e.delta for e in events) == result.text
    assert conv.messages()[-1]['content'] == result.text       # kept as cut, not whole


def test_a_server_that_ignores_max_tokens_is_stopped_there(server):
    backend = _backend(server.url)
    server.reply = (200, paced(sse(chunk(f'w{i} '), done=False) for i in range(20_000)))
    events = list(backend.chat_stream(backend.new_conversation(), 'Talk.', sampling=SHORT))
    result = events[-1].result
    assert result.finish_reason == 'length' and result.error is None
    assert [e.delta for e in events if e.delta] == [f'w{i} ' for i in range(SHORT.max_tokens)]
    time.sleep(0.5)
    assert server.written < 20_000      # the client went away: the server stopped writing
    # With token ids, they are what is counted.
    server.reply = (200, [sse(*(chunk(f'v{i}', token_ids=[i, i]) for i in range(40)))])
    backend = _backend(server.url, return_token_ids=True)
    result = backend.chat(backend.new_conversation(), 'Talk.', sampling=SHORT)
    assert result.finish_reason == 'length' and len(result.token_ids) == SHORT.max_tokens


@pytest.mark.parametrize('usage', [
    '{"choices": [], "usage": {"prompt_tokens": NaN, "completion_tokens": Infinity}}',
    '{"choices": [], "usage": {"prompt_tokens": -Infinity, "completion_tokens": -3, '
    '"prompt_tokens_details": {"cached_tokens": "many"}}}',
    '{"choices": [], "usage": {"prompt_tokens": true, "completion_tokens": 2.5}}'],
    ids=['nan-infinity', 'negative-string', 'bool-fraction'])
def test_counts_that_are_not_counts_are_unknown(server, usage):
    backend = _backend(server.url)
    conv = backend.new_conversation()
    server.reply = (200, [sse(chunk('Hi.'), chunk(finish='stop'), usage)])
    result = backend.chat(conv, 'Hello?', sampling=SHORT)
    assert result.error is None and result.text == 'Hi.' and result.finish_reason == 'stop'
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (
        None, None, None)
    assert conv.num_turns == 1


def test_only_the_first_choice_is_the_answer(server):
    backend = _backend(server.url)
    server.reply = (200, [sse(chunk('one '), chunk('TWO ', index=1), chunk('more'),
                              chunk('OTHER', index=1, finish='stop'), chunk(finish='stop'))])
    result = backend.chat(backend.new_conversation(), 'Hello?', sampling=SHORT)
    assert result.text == 'one more' and result.finish_reason == 'stop'


def test_text_after_the_finish_reason_is_not_the_answers(server):
    backend = _backend(server.url)
    server.reply = (200, [sse(chunk('Done'), chunk('.', finish='stop'), chunk(' Extra text.'),
                              chunk(' And more.', finish='length'))])
    events = list(backend.chat_stream(backend.new_conversation(), 'Hello?', sampling=SHORT))
    result = events[-1].result
    assert result.text == 'Done.' and result.finish_reason == 'stop'
    assert [e.delta for e in events if e.delta] == ['Done', '.']


def test_a_models_answer_that_drips_is_refused_within_the_timeouts(server):
    server.models = (200, drip(b' ', 0.5))
    backend = _backend(server.url, connect_timeout_s=1.0, read_timeout_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r'did not answer GET /models within 3 s'):
        backend.check()
    assert time.monotonic() - t0 < 10        # connect + read timeouts: 3 s
    assert backend.stats().reachable is True     # it answered, too slowly


def test_a_models_answer_that_never_ends_is_refused_at_its_bound(server):
    server.models = (200, flood())
    before = _rss_mb()
    with pytest.raises(BackendUnavailable, match='more than 1048576 bytes'):
        _backend(server.url, read_timeout_s=30.0).check()
    assert _rss_mb() - before < 50
