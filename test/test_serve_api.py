# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""orin_llm_serve over real HTTP (httpx against the uvicorn process): what it refuses and how.

Refusals have the OpenAI error shape and the right status; requests are served one at a time
in order with a bounded queue (429 beyond it); a client that goes away mid-stream frees the
engine at once; the server listens on 127.0.0.1 only unless told otherwise.
"""

import concurrent.futures
import time

import psutil
import pytest
from serve_support import Server

LONG = {'max_tokens': 15000, 'ignore_eos': True}

# The off-board extras (requirements/openai.txt, serve.txt) are optional on a robot.
httpx = pytest.importorskip('httpx')
pytest.importorskip('fastapi')


@pytest.fixture(scope='module')
def server(tiny_ckpt, tmp_path_factory):
    srv = Server(tiny_ckpt, tmp_path_factory.mktemp('serve') / 'serve.log',
                 '--max-model-len', '16384', '--max-queue', '1').start()
    yield srv
    srv.stop()


def _post(server, body, **kw):
    return httpx.post(f'{server.url}/chat/completions', json=body, timeout=60, trust_env=False,
                      **kw)


def _chat(content='Hello', **extra):
    return {'model': 'default', 'messages': [{'role': 'user', 'content': content}],
            'max_tokens': 4, **extra}


def _wait_idle(server, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        health = httpx.get(server.url.replace('/v1', '/health'), trust_env=False).json()
        if not health['busy'] and health['queue_depth'] == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize('body,status,says', [
    (_chat() | {'model': 'other'}, 404, "'other' does not exist"),
    (_chat() | {'tools': [{'type': 'function', 'function': {'name': 'f'}}]}, 400,
     'tools is not supported'),
    (_chat() | {'stop': ['\n']}, 400, 'stop is not supported'),
    (_chat() | {'n': 2}, 400, 'n is not supported'),
    (_chat() | {'temperature': 'hot'}, 400, 'temperature must be a number'),
    (_chat() | {'top_p': 0}, 400, 'top_p must be in'),
    (_chat() | {'max_tokens': 0}, 400, 'max_tokens'),
    (_chat() | {'seed': -1}, 400, 'seed'),
    (_chat([{'type': 'image_url', 'image_url': {'url': 'http://example.com/a.png'}}]), 400,
     'data:image'),
    (_chat([{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,AAAA'}}]), 400,
     'cannot be decoded'),
    (_chat([{'type': 'input_audio'}]), 400, "'input_audio' is not supported"),
    ({'model': 'default', 'messages': [{'role': 'assistant', 'content': 'hi'}]}, 400,
     'expected a user message'),
    ({'model': 'default', 'messages': []}, 400, 'non-empty list'),
    (_chat() | {'response_format': {'type': 'json_schema', 'json_schema': {'schema': 3}}},
     400, 'JSON Schema object'),
    (_chat() | {'response_format': {'type': 'json_schema', 'json_schema': {
        'schema': {'type': 'object', 'properties': {'a': {'type': 'nonsense'}}}}}}, 400, ''),
], ids=['model', 'tools', 'stop', 'n', 'temperature', 'top_p', 'max_tokens', 'seed', 'url',
        'bad-image', 'audio', 'roles', 'empty', 'schema-shape', 'schema-invalid'])
def test_refusals_have_the_openai_shape(server, body, status, says):
    response = _post(server, body)
    assert response.status_code == status, response.text
    error = response.json()['error']
    assert says in error['message'] and error['code'] == status
    assert '\n' not in error['message']


def test_not_json_and_too_deep(server):
    response = httpx.post(f'{server.url}/chat/completions', content=b'{"model": ', timeout=30,
                          trust_env=False)
    assert response.status_code == 400 and 'not valid JSON' in response.json()['error']['message']
    deep = '{"a": ' * 200 + '1' + '}' * 200
    response = httpx.post(f'{server.url}/chat/completions', content=deep.encode(), timeout=30,
                          trust_env=False)
    assert response.status_code == 400


def test_a_prompt_longer_than_the_context_is_refused_not_streamed(tiny_ckpt, tmp_path):
    srv = Server(tiny_ckpt, tmp_path / 'serve.log', '--max-model-len', '64').start()
    try:
        for stream in (False, True):
            response = _post(srv, _chat('word ' * 200, stream=stream))
            assert response.status_code == 400
            assert response.json()['error']['message'].startswith('context_full: ')
    finally:
        srv.stop()


def test_one_at_a_time_a_bounded_queue_and_429_beyond_it(server):
    # --max-queue 1: one answer runs, one waits, the third is refused at once.
    assert _wait_idle(server, 30)
    with concurrent.futures.ThreadPoolExecutor(2) as pool, \
            httpx.Client(trust_env=False, timeout=120) as client:
        with client.stream('POST', f'{server.url}/chat/completions',
                           json=_chat(stream=True, **LONG)) as running:
            assert running.status_code == 200
            lines = running.iter_lines()    # kept: a dropped iterator closes the response
            next(lines)
            waiting = pool.submit(_post, server, _chat())
            deadline = time.monotonic() + 30
            while httpx.get(server.url.replace('/v1', '/health'),
                            trust_env=False).json()['queue_depth'] < 1:
                assert time.monotonic() < deadline and not waiting.done()
                time.sleep(0.05)
            refused = _post(server, _chat())
            assert refused.status_code == 429
            assert refused.json()['error']['type'] == 'rate_limit_exceeded'
            assert refused.headers['retry-after'] == '1'
            assert not waiting.done()          # still behind the running answer
        # The client left mid-stream: its answer is cancelled and the waiting one runs.
        answered = waiting.result(timeout=30)
    assert answered.status_code == 200
    assert answered.json()['choices'][0]['finish_reason'] == 'length'
    assert _wait_idle(server, 10)


def test_a_client_that_goes_away_frees_the_engine(server):
    assert _wait_idle(server, 30)
    with httpx.Client(trust_env=False, timeout=60) as client:
        with client.stream('POST', f'{server.url}/chat/completions',
                           json=_chat(stream=True, **LONG)) as response:
            lines = response.iter_lines()
            while 'content' not in next(lines):
                pass
    # 15,000 tokens would take the tiny model far longer than this (over 10 s on any CPU).
    assert _wait_idle(server, 3)


def test_listens_on_loopback_only_by_default(server):
    # Read from the server's own sockets: no traffic to any other address of this machine.
    listening = [c.laddr for c in psutil.Process(server.proc.pid).net_connections('tcp')
                 if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [('127.0.0.1', server.port)]
