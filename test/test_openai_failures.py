# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-API backend when its server fails: one ``error`` result per prompt, on time.

Real servers on loopback (orin_llm_serve in a subprocess) and the real client: a server never
started, one that serves another model, one that wants another key, one killed mid-answer and
restarted, one frozen (SIGSTOP: connected, silent). Every prompt ends with exactly one result,
``finish_reason == "error"`` and a one-line reason (or ``timeout`` at ``timeout_s``), well
within the configured timeouts; the failed turn leaves no trace; the backend answers again
once the server is back.
"""

import threading
import time

import pytest
from serve_support import Server, free_port

from orin_llm_node.backends import BackendUnavailable, OpenAIBackend, OpenAIConfig
from orin_llm_node.engine import SamplingParams

KEY_ENV = 'SERVE_TEST_KEY'
LONG = SamplingParams(max_tokens=6000, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4)


def _backend(url, model='default', **kw):
    kw.setdefault('connect_timeout_s', 2.0)
    kw.setdefault('retry_backoff_s', 0.1)
    return OpenAIBackend(OpenAIConfig(url, model, **kw))


def _one_error(result, *words):
    assert result.finish_reason == 'error'
    assert result.error and '\n' not in result.error and len(result.error) <= 240
    for word in words:
        assert word in result.error, result.error
    assert result.token_ids is None


def test_a_server_that_was_never_started(tiny_ckpt):
    backend = _backend(f'http://127.0.0.1:{free_port()}/v1', retries=2)
    with pytest.raises(BackendUnavailable, match='did not answer'):
        backend.check()
    conv = backend.new_conversation()
    t0 = time.monotonic()
    results = [e.result for e in backend.chat_stream(conv, 'Hello?', sampling=SHORT)]
    assert time.monotonic() - t0 < 20
    assert results[:-1] == [None] * (len(results) - 1)      # one result, no text
    _one_error(results[-1], 'unreachable')
    assert conv.num_turns == 0
    stats = backend.stats()
    assert (stats.reachable, stats.requests, stats.errors, stats.retries) == (False, 1, 1, 2)
    assert stats.last_error == results[-1].error


def test_a_server_that_serves_another_model(tiny_server):
    backend = _backend(tiny_server.url, model='no-such-model')
    with pytest.raises(BackendUnavailable, match="does not serve model 'no-such-model'"):
        backend.check()
    result = backend.chat(backend.new_conversation(), 'Hello?', sampling=SHORT)
    _one_error(result, 'HTTP 404')
    assert backend.stats().reachable is True     # it answered: it is up, but not for us


def test_the_api_key_comes_from_the_named_variable_and_is_never_said(tiny_ckpt, tmp_path,
                                                                    monkeypatch):
    srv = Server(tiny_ckpt, tmp_path / 'serve.log', '--api-key-env', KEY_ENV,
                 env={KEY_ENV: 'right-key-123'}).start()
    try:
        monkeypatch.setenv('ROBOT_KEY', 'wrong-key-456')
        wrong = _backend(srv.url, api_key_env='ROBOT_KEY')
        with pytest.raises(BackendUnavailable, match='HTTP 401') as refused:
            wrong.check()
        result = wrong.chat(wrong.new_conversation(), 'Hello?', sampling=SHORT)
        _one_error(result, 'HTTP 401')
        for text in (str(refused.value), result.error, repr(wrong.config)):
            assert 'wrong-key-456' not in text and 'right-key-123' not in text
        monkeypatch.setenv('ROBOT_KEY', 'right-key-123')
        right = _backend(srv.url, api_key_env='ROBOT_KEY')
        assert right.check() == ['default']
        assert right.chat(right.new_conversation(), 'Hello?', sampling=SHORT).error is None
        monkeypatch.delenv('ROBOT_KEY')
        with pytest.raises(ValueError, match='ROBOT_KEY, which is not set'):
            _backend(srv.url, api_key_env='ROBOT_KEY')
    finally:
        srv.stop()


def _first_delta_then(backend, conv, sampling, action):
    # Run a long answer; call ``action`` once its first text arrived; return (result, the
    # seconds from the action to the result).
    acted, result = None, None
    for event in backend.chat_stream(conv, 'Tell me everything.', sampling=sampling):
        if acted is None and event.delta:
            action()
            acted = time.monotonic()
        result = event.result or result
    assert acted is not None, 'no text arrived before the answer ended'
    return result, time.monotonic() - acted


def test_a_server_killed_mid_answer_then_restarted(tiny_ckpt, tmp_path):
    port = free_port()
    srv = Server(tiny_ckpt, tmp_path / 'serve.log', '--max-model-len', '8192',
                 port=port).start()
    backend = _backend(srv.url, read_timeout_s=30.0)
    conv = backend.new_conversation('You are a robot.')
    try:
        assert backend.chat(conv, 'First question.', sampling=SHORT).error is None
        result, after = _first_delta_then(backend, conv, LONG, srv.kill)
        _one_error(result)
        assert 'mid-answer' in result.error or 'before it was complete' in result.error
        assert after < 10             # not the 30 s read timeout: the connection went away
        assert conv.num_turns == 1    # the failed turn left no trace
        down = backend.chat(conv, 'Anyone there?', sampling=SHORT)
        _one_error(down, 'unreachable')
        srv = Server(tiny_ckpt, tmp_path / 'serve.log', port=port).start()
        back = backend.chat(conv, 'Second question.', sampling=SHORT)
        assert back.error is None and back.finish_reason == 'length'
        assert conv.num_turns == 2
        stats = backend.stats()
        assert stats.reachable and stats.consecutive_errors == 0 and stats.errors == 2
    finally:
        srv.stop()


def test_a_frozen_server_ends_the_answer_at_the_read_timeout(tiny_server):
    backend = _backend(tiny_server.url, read_timeout_s=2.0, retries=2)
    conv = backend.new_conversation()
    tiny_server.freeze()
    try:
        t0 = time.monotonic()
        result = backend.chat(conv, 'Hello?', sampling=SHORT)
        took = time.monotonic() - t0
        _one_error(result, 'read_timeout_s')
        assert 1.5 < took < 15        # never retried: the server may be working on it
        # timeout_s shorter than the read timeout ends the answer first, as the engine's does.
        t0 = time.monotonic()
        late = backend.chat(conv, 'Hello?', sampling=SamplingParams(max_tokens=4, timeout_s=0.5))
        assert late.finish_reason == 'timeout' and late.error is None
        assert time.monotonic() - t0 < 1.5
        assert conv.num_turns == 1     # a timed-out answer is kept, as the engine keeps it
    finally:
        tiny_server.thaw()
    assert backend.chat(conv, 'Hello again.', sampling=SHORT).error is None


def test_request_timeout_bounds_a_whole_answer(tiny_server):
    backend = _backend(tiny_server.url, request_timeout_s=1.0)
    t0 = time.monotonic()
    result = backend.chat(backend.new_conversation(), 'Talk.', sampling=LONG)
    _one_error(result, 'request_timeout_s')
    assert time.monotonic() - t0 < 3


def test_cancel_ends_the_answer_and_keeps_its_text(tiny_server):
    backend = _backend(tiny_server.url)
    conv = backend.new_conversation()
    result, after = _first_delta_then(
        backend, conv, LONG, lambda: threading.Thread(target=backend.cancel).start())
    assert result.finish_reason == 'cancelled' and result.error is None
    assert after < 2 and result.text
    assert conv.messages()[-1] == {'role': 'assistant', 'content': result.text}


def test_reset_forgets_one_or_every_conversation(tiny_server):
    backend = _backend(tiny_server.url)
    a, b = backend.new_conversation('You are a robot.'), backend.new_conversation()
    for conv in (a, b, a):
        assert backend.chat(conv, 'Hello?', sampling=SHORT).error is None
    assert (a.num_turns, b.num_turns) == (2, 1)
    backend.reset(b)
    assert (a.num_turns, b.num_turns) == (2, 0)
    backend.reset()
    assert a.num_turns == 0 and a.messages() == [{'role': 'system',
                                                   'content': 'You are a robot.'}]
