# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""orin_llm_serve over real HTTP (httpx against the uvicorn process): what it refuses and how.

Refusals have the OpenAI error shape and the right status; requests are served one at a time
in order with a bounded queue (429 beyond it); a client that goes away frees the engine at
once, streamed or not, running or queued; the server listens on 127.0.0.1 only unless told
otherwise, answers only for its own host names and only to application/json. Floods are
refused within bounds: a body past its limit as it arrives, too many pixels from the headers,
a text that cannot fit before it is tokenized, a long history at a cost linear in it (the
server's memory is read from /proc, sampled every 10 ms, with margins of hundreds of MB
against what the missing bound cost; its CPU time, not the wall clock, for the history).
"""

import base64
import concurrent.futures
import io
import json
import signal
import socket
import threading
import time

from PIL import Image
import psutil
import pytest
from serve_support import HealthWatch, RssPeak, Server

LONG = {'max_tokens': 15000, 'ignore_eos': True}

# The off-board extras (requirements/openai.txt, serve.txt) are optional on a robot.
httpx = pytest.importorskip('httpx')
pytest.importorskip('fastapi')


@pytest.fixture(scope='module')
def server(tiny_ckpt, tmp_path_factory):
    srv = Server(tiny_ckpt, tmp_path_factory.mktemp('serve') / 'serve.log',
                 '--max-model-len', '16384', '--max-queue', '1',
                 '--allowed-hosts', 'robot.local,Other.Example.').start()
    yield srv
    srv.stop()


def _post(server, body, timeout=60, **kw):
    return httpx.post(f'{server.url}/chat/completions', json=body, timeout=timeout,
                      trust_env=False, **kw)


def _chat(content='Hello', **extra):
    return {'model': 'default', 'messages': [{'role': 'user', 'content': content}],
            'max_tokens': 4, **extra}


def _health_until(server, condition, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition(httpx.get(server.url.replace('/v1', '/health'), trust_env=False).json()):
            return True
        time.sleep(0.05)
    return False


def _wait_idle(server, within_s):
    return _health_until(server, lambda h: not h['busy'] and h['queue_depth'] == 0, within_s)


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


JSON = {'Content-Type': 'application/json'}


def json_text(body) -> bytes:
    return json.dumps(body).encode()


def test_not_json_and_too_deep(server):
    response = httpx.post(f'{server.url}/chat/completions', content=b'{"model": ', timeout=30,
                          trust_env=False, headers=JSON)
    assert response.status_code == 400 and 'not valid JSON' in response.json()['error']['message']
    deep = '{"a": ' * 200 + '1' + '}' * 200
    response = httpx.post(f'{server.url}/chat/completions', content=deep.encode(), timeout=30,
                          trust_env=False, headers=JSON)
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


# ---- who may ask: Host, Content-Type, CORS ------------------------------------------------

@pytest.mark.parametrize('host,status', [
    ('127.0.0.1:{port}', 200), ('localhost:{port}', 200), ('LOCALHOST', 200),
    ('[::1]:{port}', 200), ('robot.local:{port}', 200), ('other.example', 200),
    ('evil.example:{port}', 400), ('127.0.0.1.evil.example', 400), ('192.168.1.7:{port}', 400),
], ids=['address', 'localhost', 'case', 'ipv6', 'allowed', 'allowed-dot', 'rebinding',
        'suffix', 'other-address'])
def test_only_the_servers_own_host_names_are_answered(server, host, status):
    # A page of evil.example whose name DNS rebinding points at 127.0.0.1 sends its own name.
    headers = {'Host': host.format(port=server.port)}
    for method, path, body in (('GET', '/health', None), ('GET', '/v1/models', None),
                               ('POST', '/v1/chat/completions', _chat())):
        response = httpx.request(method, server.url.replace('/v1', '') + path, json=body,
                                 headers=headers, timeout=60, trust_env=False)
        assert response.status_code == status, (path, response.text)
        if status == 400:
            assert 'is not one this server answers for' in response.json()['error']['message']


@pytest.mark.parametrize('content_type', [None, 'text/plain', 'application/x-www-form-urlencoded',
                                          'multipart/form-data; boundary=x'])
def test_a_chat_request_must_be_json(server, content_type):
    # What a web page may send anywhere without a CORS preflight: all refused, never parsed.
    headers = {} if content_type is None else {'Content-Type': content_type}
    response = httpx.post(f'{server.url}/chat/completions', content=json_text(_chat()),
                          headers=headers, timeout=30, trust_env=False)
    assert response.status_code == 415, response.text
    assert 'must be application/json' in response.json()['error']['message']
    ok = httpx.post(f'{server.url}/chat/completions', content=json_text(_chat()), timeout=60,
                    headers={'Content-Type': 'application/json; charset=utf-8'}, trust_env=False)
    assert ok.status_code == 200, ok.text


def test_no_cors_header_lets_another_origin_read_an_answer(server):
    origin = {'Origin': 'http://evil.example'}
    preflight = httpx.options(f'{server.url}/chat/completions', trust_env=False, timeout=30,
                              headers={**origin, 'Access-Control-Request-Method': 'POST',
                                       'Access-Control-Request-Headers': 'content-type'})
    answered = _post(server, _chat(), headers=origin)
    assert answered.status_code == 200
    for response in (preflight, answered):
        assert not [h for h in response.headers if h.lower().startswith('access-control-')]


# ---- floods: bounded as they arrive ---------------------------------------------------------

LIMIT = 32 * 2**20  # max_request_bytes


def _head(path='/v1/chat/completions', **fields):
    lines = [f'POST {path} HTTP/1.1', 'Host: 127.0.0.1', 'Content-Type: application/json',
             *(f'{k.replace("_", "-")}: {v}' for k, v in fields.items())]
    return ('\r\n'.join(lines) + '\r\n\r\n').encode()


def _status_line(sock) -> bytes:
    reply = b''
    while b'\r\n' not in reply:
        data = sock.recv(65536)
        if not data:
            break
        reply += data
    return reply.split(b'\r\n', 1)[0]


def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(server):
    piece = b' ' * 2**20
    chunk = b'%x\r\n%s\r\n' % (len(piece), piece)
    sent, stop = [0], threading.Event()
    with socket.create_connection(('127.0.0.1', server.port), timeout=120) as sock, \
            RssPeak(server.proc.pid) as rss:
        sock.sendall(_head(Transfer_Encoding='chunked'))

        def send():  # 256 MiB unless refused: the server must not wait for (or keep) it all
            try:
                while not stop.is_set() and sent[0] < 256 * 2**20:
                    sock.sendall(chunk)
                    sent[0] += len(piece)
            except OSError:
                pass

        sender = threading.Thread(target=send)
        sender.start()
        status = _status_line(sock)
        at = sent[0]
        stop.set()
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(60)
    assert status.startswith(b'HTTP/1.1 413'), status
    assert at < 3 * LIMIT, f'refused after {at} bytes'
    assert rss.growth_mb < 200, f'{rss.growth_mb:.0f} MB'


def test_a_declared_length_past_the_limit_is_refused_before_any_body(server):
    with socket.create_connection(('127.0.0.1', server.port), timeout=30) as sock:
        sock.sendall(_head(Content_Length=10**12))
        assert _status_line(sock).startswith(b'HTTP/1.1 413')


@pytest.fixture(scope='module')
def huge_png_url():
    """A solid 6320x6320 PNG (just under 40 Mpx, 120 MB of RGB) in a data: URL of 175 kB."""
    out = io.BytesIO()
    Image.new('RGB', (6320, 6320), (200, 30, 30)).save(out, 'PNG')
    return 'data:image/png;base64,' + base64.b64encode(out.getvalue()).decode()


def test_the_pixels_of_a_request_are_capped_together_without_decoding_them(server,
                                                                          huge_png_url):
    # Twelve such images (2 MB of body, 1.4 GB decoded): each within the per-image cap.
    image = {'type': 'image_url', 'image_url': {'url': huge_png_url}}
    body = _chat([image] * 12 + [{'type': 'text', 'text': 'What is this?'}])
    with RssPeak(server.proc.pid) as rss, HealthWatch(server) as health:
        response = _post(server, body, timeout=300)
    assert response.status_code == 400, response.text[:300]
    error = response.json()['error']
    assert 'messages[0].content[1]: the images of the request hold more than' in error['message']
    assert rss.growth_mb < 300, f'{rss.growth_mb:.0f} MB'        # none decoded
    assert health.slowest_s < 5, f'/health took {health.slowest_s:.1f} s'


def test_a_text_that_cannot_fit_is_refused_before_it_is_tokenized(server):
    text = 'word ' * 6_000_000  # 30 MB: far more than 16384 tokens, whatever the tokenizer
    with RssPeak(server.proc.pid) as rss, HealthWatch(server) as health:
        response = _post(server, _chat(text), timeout=300)
    assert response.status_code == 400
    message = response.json()['error']['message']
    assert message.startswith("context_full: the message's text takes at least"), message
    assert health.slowest_s < 5, f'/health took {health.slowest_s:.1f} s'
    # The body, its text and the parsed JSON, for the time of the request: some 100 MB.
    assert rss.growth_mb < 600, f'{rss.growth_mb:.0f} MB'
    assert rss.kept_mb < 200, f'{rss.kept_mb:.0f} MB kept'


def _cpu_s(server) -> float:
    times = psutil.Process(server.proc.pid).cpu_times()
    return times.user + times.system


def test_a_history_of_n_exchanges_costs_time_linear_in_n(server):
    # A history the server does not hold is written into a new conversation; its new message
    # (about 40,000 tokens of the tiny tokenizer, under the text floor of 16384 tokens) is then
    # refused by the engine: everything but the prefill, measured in the server's CPU time.
    last = 'word ' * 20_000

    def cost(n, tag):
        messages = []
        for i in range(n):
            messages += [{'role': 'user', 'content': f'{tag} question {i}: where is it?'},
                         {'role': 'assistant', 'content': f'{tag} answer {i}: over there.'}]
        messages.append({'role': 'user', 'content': last})
        before = _cpu_s(server)
        response = _post(server, {'model': 'default', 'messages': messages, 'max_tokens': 1},
                         timeout=600)
        spent = _cpu_s(server) - before
        assert response.status_code == 400, response.text[:300]
        assert response.json()['error']['message'].startswith('context_full: the prompt alone')
        return spent

    assert _wait_idle(server, 30)
    small, large = cost(100, 'a'), cost(800, 'b')
    # Linear: about 8 times (less, with what every request costs); quadratic: about 64.
    assert large < 20 * small, f'{small:.2f} s for 100 exchanges, {large:.2f} s for 800'


# ---- clients that leave -----------------------------------------------------------------------

def test_non_streamed_requests_whose_clients_left_are_dropped(server):
    # --max-queue 1: one runs, one waits; both clients give up after 2 s.
    assert _wait_idle(server, 30)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        left = []
        for wait_for in ('busy', 'queue_depth'):
            left.append(pool.submit(_post, server, _chat(**LONG), timeout=2))
            assert _health_until(server, lambda h, k=wait_for: h[k], 30)  # taken, then queued
        for future in left:
            with pytest.raises(httpx.TimeoutException):
                future.result(60)
    # 15,000 tokens each would keep the tiny model busy for far longer than this.
    assert _wait_idle(server, 5)


# ---- stopping ---------------------------------------------------------------------------------

@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['SIGTERM', 'SIGINT'])
def test_a_signal_stops_the_server_cleanly_mid_answer(tiny_ckpt, tmp_path, signum):
    srv = Server(tiny_ckpt, tmp_path / 'serve.log').start()
    try:
        with httpx.Client(trust_env=False, timeout=120) as client, \
                client.stream('POST', f'{srv.url}/chat/completions',
                              json=_chat(stream=True, **LONG)) as running:
            lines = running.iter_lines()
            next(lines)
            srv.proc.send_signal(signum)
            with pytest.raises(httpx.HTTPError):  # cut after the grace, not run to its end
                for _ in lines:
                    pass
        # Exit 0: main returned, after stopping the engine's thread (Python's default SIGTERM
        # action would have killed it with the thread answering: -15).
        assert srv.proc.wait(60) == 0, srv.log()
    finally:
        srv.stop()


def test_the_default_host_names_follow_the_bound_address():
    from orin_llm_node.serve.main import allowed_hosts
    this = {socket.gethostname(), socket.getfqdn()}
    assert allowed_hosts('127.0.0.1') == {'127.0.0.1', 'localhost', '::1'}
    assert allowed_hosts('127.0.0.1', 'robot.local, gpu-box') == {
        '127.0.0.1', 'localhost', '::1', 'robot.local', 'gpu-box'}
    assert allowed_hosts('192.168.1.7') == {'127.0.0.1', 'localhost', '::1', '192.168.1.7',
                                            *this}
    assert allowed_hosts('0.0.0.0') == {'127.0.0.1', 'localhost', '::1', 'ip', *this}
