# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node with ``backend: openai`` on orin_llm_serve, over real loopback DDS and HTTP.

Every part is real: node processes (rclpy, the session), the backend's httpx client, the
server's FastAPI/uvicorn stack in its own process. A node on the server answers what a node on
its own engine answers -- the same text and token counts, with an image, a follow-up and a
JSON answer -- on the tiny and the demo checkpoints. Every way the server fails (killed
mid-answer, away, restarted, frozen, an HTTP 400) gives each prompt one ``response/info``
with ``finish_reason: error`` and a one-line reason, and the node answers again afterwards;
configure refuses a server that does not answer or does not serve the model.
"""

from pathlib import Path
import time

import pytest

rclpy = pytest.importorskip('rclpy')
pytest.importorskip('httpx')
pytest.importorskip('fastapi')

from _ros_harness import START_TIMEOUT, JsonProbe, start_node, stop  # noqa: E402
from serve_support import Server, free_port  # noqa: E402

from orin_llm_node.testing import shapes  # noqa: E402

pytestmark = pytest.mark.ros

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
TIMEOUT = 90.0
SCHEMA = {
    'type': 'object',
    'properties': {'colour': {'type': 'string', 'enum': list(shapes.COLOURS)},
                   'shape': {'type': 'string', 'enum': list(shapes.SHAPES)}},
    'required': ['colour', 'shape'], 'additionalProperties': False,
}
# What a node's answer is compared on: everything but the latency.
COMPARED = ('text', 'finish_reason', 'error', 'generated_tokens', 'prompt_tokens',
            'cached_tokens', 'valid', 'json')


class NodeProbe(JsonProbe):
    """A JsonProbe that also reads the node's ``backend`` diagnostics status."""

    def __init__(self, ns):
        super().__init__(ns, timeout=TIMEOUT)

    def backend_status(self):
        return self.diag.get('orin_llm: backend', (None, '', {}))


def _connect(proc, ns):
    """A NodeProbe on ``ns`` once the node is ready and its topics are matched both ways."""
    p = NodeProbe(ns)
    try:
        p.spin_until(lambda: p.ready or proc.poll() is not None, START_TIMEOUT, 'ready')
        assert proc.poll() is None, 'node died:\n' + proc.log_path.read_text()[-3000:]
        p.spin_until(lambda: p.pub_json.get_subscription_count() > 0
                     and p.pub_image.get_subscription_count() > 0
                     and p.node.count_publishers(f'{ns}/response/info') > 0,
                     30.0, "the node's subscriptions and publishers")
        assert p.hello(period_s=1.0), 'response/info never matched'
    except BaseException:
        p.close()
        raise
    return p


def _openai_params(url, model, *more):
    return ('backend:=openai', f'base_url:={url}', f'model:={model}', *more)


def _conversation(probe):
    """The same prompts for either node: an image, a follow-up, a JSON answer, a new one."""
    scene = shapes.simple_scene('circle', 'red', height=160, width=200)
    probe.send_image(probe.image(scene.image, stamp_ns=time.time_ns()))
    out = [probe.send({'prompt': 'What is in front of you?'}),
           probe.send({'prompt': 'And what colour is it?'}),
           probe.send({'prompt': 'Report the shape as JSON.', 'max_new_tokens': 40,
                       'response_format': {'type': 'json_schema', 'schema': SCHEMA}}),
           probe.send({'prompt': 'Any JSON object, please.', 'max_new_tokens': 24,
                       'response_format': {'type': 'json_object'}}),
           probe.send({'prompt': 'Hello again.', 'conversation': 'new'})]
    return out


@pytest.mark.parametrize('which', ['tiny', 'demo'])
def test_openai_backend_answers_as_the_local_engine(which, make_ckpt, tmp_path):
    ckpt = make_ckpt('default') if which == 'tiny' else DEMO
    server = Server(ckpt, tmp_path / 'serve.log', '--max-model-len', '8192').start()
    params = ('max_new_tokens:=12', 'image_max_age_s:=600.0')
    local = start_node(ckpt, '/llm_oa_local', tmp_path, *params)
    (tmp_path / 'remote').mkdir()
    remote = start_node(ckpt, '/llm_oa_remote', tmp_path / 'remote', *params,
                        *_openai_params(server.url, ckpt.name, 'return_token_ids:=true'))
    probes = []
    try:
        probes.append(_connect(local, '/llm_oa_local'))
        want = _conversation(probes[-1])
        probes.append(_connect(remote, '/llm_oa_remote'))
        got = _conversation(probes[-1])
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert w['error'] is None, w
            assert {k: g.get(k) for k in COMPARED} == {k: w.get(k) for k in COMPARED}, (which, i)
            assert (w['backend'], w['model']) == ('local', None)
            assert (g['backend'], g['model']) == ('openai', ckpt.name)
            assert g['weight_format'] is None and g['ttft_ms'] > 0
            assert (g['image'] is None) == (w['image'] is None)   # the same frame, if any
        assert want[0]['image'] is not None and want[0]['generated_tokens'] > 0
        assert want[1]['cached_tokens'] > 0     # the follow-up reused the first turn's KV
        if which == 'demo':                     # the trained checkpoint answers the schema
            assert want[2]['valid'] is True and want[2]['json']['shape'] == 'circle'
        # What streamed is what was answered, on both nodes.
        for probe, answers in zip(probes, (want, got), strict=True):
            texts = [a['text'] for a in answers]
            # ``response`` follows ``response/info``: the last may still be on its way.
            n = len(texts)
            probe.spin_until(lambda p=probe, n=n: len(p.responses) >= n, 20.0,
                             'the answers on response')
            assert probe.responses == texts
        # The status after the last answer (published within a diagnostics period).
        remote_probe = probes[-1]
        remote_probe.spin_until(
            lambda: remote_probe.backend_status()[2].get('requests') == str(len(got)),
            30.0, 'every answer counted in the backend status')
        level, _, values = remote_probe.backend_status()
        assert level == 0 and values['reachable'] == 'true'
        assert values['server_model'] == ckpt.name and values['errors'] == '0'
        assert float(values['last_ttft_ms']) > 0
    finally:
        for p in probes:
            p.close()
        stop(local)
        stop(remote)
        server.stop()


def _one_failure(info, *words):
    assert info['finish_reason'] == 'error' and info['backend'] == 'openai'
    assert info['error'] and '\n' not in info['error'] and len(info['error']) <= 240
    assert info['text'] is None and info['generated_tokens'] is None
    for word in words:
        assert word in info['error'], info['error']


def _alive(probe, proc):
    info = probe.send({'prompt': 'Still there?'})
    assert info['finish_reason'] == 'length' and info['error'] is None, info
    assert proc.poll() is None
    # Its last deltas travel apart from its response/info: all in before the next answer's.
    probe.spin_until(lambda: ''.join(probe.deltas).endswith(info['text']), 20.0,
                     'the answer streamed')


def test_every_server_failure_is_one_info_per_prompt_and_the_node_lives_on(tiny_ckpt,
                                                                           tmp_path):
    port = free_port()
    srv = Server(tiny_ckpt, tmp_path / 'serve.log', '--max-model-len', '8192',
                 port=port).start()
    node = start_node(tiny_ckpt, '/llm_oa_fail', tmp_path, 'max_new_tokens:=6',
                      *_openai_params(srv.url, tiny_ckpt.name, 'backend_read_timeout_s:=4.0',
                                      'backend_connect_timeout_s:=2.0', 'backend_retries:=1',
                                      'backend_retry_backoff_s:=0.2'))
    probe = None
    try:
        probe = _connect(node, '/llm_oa_fail')
        _alive(probe, node)

        # Killed mid-answer: the error at once (not the read timeout).
        probe.deltas.clear()
        tag = probe.publish({'prompt': 'Tell me everything.', 'max_new_tokens': 4000})
        probe.spin_until(lambda: probe.deltas, TIMEOUT, 'the first streamed text')
        srv.kill()
        killed = time.monotonic()
        info = probe.wait_info(tag)
        assert time.monotonic() - killed < 15
        _one_failure(info)
        assert 'mid-answer' in info['error'] or 'before it was complete' in info['error']

        # Away: every prompt queued meanwhile gets its own error, none is lost.
        tags = [probe.publish({'prompt': f'Anyone there {i}?'}) for i in range(3)]
        for t in tags:
            _one_failure(probe.wait_info(t), 'unreachable')
        probe.spin_until(lambda: probe.backend_status()[0] == 1, 30.0, 'backend WARN')
        assert probe.backend_status()[2]['reachable'] == 'false'

        # Restarted on the same port: answered again, the status back to OK.
        srv = Server(tiny_ckpt, tmp_path / 'serve.log', '--max-model-len', '8192',
                     port=port).start()
        _alive(probe, node)
        probe.spin_until(lambda: probe.backend_status()[0] == 0, 30.0, 'backend OK')

        # Frozen (connected, silent): the error after the read timeout, never a hang.
        srv.freeze()
        try:
            t0 = time.monotonic()
            _one_failure(probe.send({'prompt': 'Hello?'}), 'read_timeout_s')
            assert 3.0 < time.monotonic() - t0 < 40
        finally:
            srv.thaw()
        _alive(probe, node)

        # The server refuses (a prompt beyond its context: HTTP 400), its reason said.
        _one_failure(probe.send({'prompt': 'word ' * 12000}), 'HTTP 400')
        _alive(probe, node)

        # Exactly one info per prompt the whole time.
        counts = {}
        for i in probe.infos:
            counts[i.get('tag')] = counts.get(i.get('tag'), 0) + 1
        assert all(n == 1 for t, n in counts.items() if t != 'hello'), counts
        probe.spin_until(lambda: probe.backend_status()[2].get('errors') == '6', 20.0,
                         'six failed answers counted in the backend status')
    finally:
        if probe is not None:
            probe.close()
        stop(node)
        srv.stop()


@pytest.mark.parametrize('case', ['never started', 'wrong model'])
def test_configure_refuses_a_server_that_cannot_answer(case, tiny_server, tiny_ckpt, tmp_path):
    url = f'http://127.0.0.1:{free_port()}/v1' if case == 'never started' else tiny_server.url
    model = tiny_ckpt.name if case == 'never started' else 'no-such-model'
    node = start_node(tiny_ckpt, '/llm_oa_refused', tmp_path,
                      *_openai_params(url, model, 'backend_connect_timeout_s:=2.0'))
    try:
        assert node.wait(START_TIMEOUT) == 1
    finally:
        stop(node)
    log = node.log_path.read_text()
    fatal = [line for line in log.splitlines() if 'failed to load' in line]
    assert len(fatal) == 1, log[-3000:]
    assert ('did not answer' if case == 'never started' else
            "does not serve model 'no-such-model'") in fatal[0]
