# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node with ``backend: openai`` on a server that misbehaves, over real loopback DDS.

A node process (rclpy, the session, the backend's httpx client) and a scripted stdlib server
in this process (_fake_openai.py).  Lone surrogates in the answer, the model name, an HTTP
error or a mid-stream error never end the process, the session thread or the diagnostics: an
``ask`` goal gets its result and its feedback (U+FFFD where the server's text could not be
encoded), a topic prompt its ``response/info``, and the node answers the next goal, prompt and
diagnostics period as before; NaN counts in ``usage`` leave the answer answered.  Configure
gives up on a ``GET /models`` that drips, within its timeouts.
"""

import json
import time

import pytest

rclpy = pytest.importorskip('rclpy')
pytest.importorskip('httpx')

from _fake_openai import MODEL, FakeServer, answer, chunk, drip, sse  # noqa: E402
from _ros_harness import (  # noqa: E402
    EVENT_TIMEOUT,
    START_TIMEOUT,
    JsonProbe,
    start_node,
    stop,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from rclpy.action import ActionClient  # noqa: E402

from orin_llm_node.action import Ask  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_oa_hostile'
TIMEOUT = 60.0
BAD_MODEL = 'served \udfff model'


def _params(url, *more):
    return ('backend:=openai', f'base_url:={url}', f'model:={MODEL}', 'backend_retries:=0',
            'backend_connect_timeout_s:=2.0', 'max_new_tokens:=16', *more)


class Client(JsonProbe):
    """A JsonProbe with an ask client: goals, their feedback, their results."""

    def __init__(self):
        super().__init__(NS, timeout=TIMEOUT)
        self.asker = ActionClient(self.node, Ask, f'{NS}/ask')

    def goal(self, goal):
        """Send ``goal``; (the result's status, the result, the feedback messages)."""
        feedback = []
        sent = self.asker.send_goal_async(goal, feedback_callback=lambda m: feedback.append(
            m.feedback))
        self.spin_until(sent.done, EVENT_TIMEOUT, 'the goal response')
        handle = sent.result()
        assert handle.accepted
        result = handle.get_result_async()
        self.spin_until(result.done, TIMEOUT, 'the result')
        self.spin_for(0.3)          # feedback travels apart from the result
        return result.result().status, result.result().result, feedback

    def close(self):
        self.asker.destroy()
        super().close()


@pytest.fixture
def server():
    with FakeServer() as srv:
        yield srv


def _connect(proc):
    c = Client()
    try:
        c.spin_until(lambda: c.ready or proc.poll() is not None, START_TIMEOUT, 'ready')
        assert proc.poll() is None, 'node died:\n' + proc.log_path.read_text()[-3000:]
        assert c.asker.wait_for_server(timeout_sec=EVENT_TIMEOUT)
        c.spin_until(lambda: c.node.count_publishers(f'{NS}/ask/_action/feedback')
                     and c.pub_json.get_subscription_count() > 0, EVENT_TIMEOUT,
                     'the feedback publisher and prompt/json')
        assert c.hello(period_s=1.0)
    except BaseException:
        c.close()
        raise
    return c


def _backend_status(client):
    return client.diag.get('orin_llm: backend', (None, '', {}))


def _bad_answer():
    # The text holds half of an emoji's escape pair, the model name a lone surrogate.
    return 200, [sse({**chunk('cup \ud83d'), 'model': BAD_MODEL},
                     {**chunk(' on \ud800 shelf', finish='stop'), 'model': BAD_MODEL},
                     {'choices': [], 'model': BAD_MODEL, 'usage': {
                         'prompt_tokens': 9, 'completion_tokens': 2}})]


def test_lone_surrogates_from_the_server_end_no_goal_prompt_or_diagnostics(
        server, tiny_ckpt, tmp_path):
    node = start_node(tiny_ckpt, NS, tmp_path, *_params(server.url))
    client = None
    try:
        client = _connect(node)
        # A goal whose answer and model name hold lone surrogates: result and feedback.
        server.reply = _bad_answer()
        status, result, feedback = client.goal(Ask.Goal(prompt='What is there?', tag='g1'))
        assert status == GoalStatus.STATUS_SUCCEEDED, result
        assert result.text == 'cup \ufffd on \ufffd shelf' and result.error == ''
        info = json.loads(result.info)
        assert info['model'] == 'served \ufffd model' and info['tag'] == 'g1'
        assert ''.join(fb.text_delta for fb in feedback) == result.text
        # A JSON answer whose string is half an escape pair: the result's json is valid.
        server.reply = (200, [sse(chunk('{"label": "cup \\ud83d"}', finish='stop'))])
        status, result, _ = client.goal(Ask.Goal(prompt='As JSON.',
                                                 response_format='{"type": "json_object"}'))
        assert status == GoalStatus.STATUS_SUCCEEDED, result
        assert json.loads(result.json) == {'label': 'cup \ufffd'}
        # An HTTP error and a mid-stream error whose messages hold them: the goal aborts with
        # the reason.
        server.reply = (400, [json.dumps({'error': {'message': 'no \ud800 way'}}).encode()])
        status, result, _ = client.goal(Ask.Goal(prompt='Again?'))
        assert status == GoalStatus.STATUS_ABORTED and 'no \ufffd way' in result.error, result
        server.reply = (200, [sse(chunk('x'), {'error': {'message': 'broke \udc00'}},
                                  done=False)])
        status, result, _ = client.goal(Ask.Goal(prompt='Again?'))
        assert status == GoalStatus.STATUS_ABORTED and 'broke \ufffd' in result.error, result

        # A topic prompt: its response/info, its answer, and the next prompts answered.
        server.reply = _bad_answer()
        info = client.send({'prompt': 'And on the topic?'})
        assert info['text'] == 'cup \ufffd on \ufffd shelf' and info['error'] is None, info
        client.spin_until(lambda: 'cup \ufffd on \ufffd shelf' in client.responses,
                          EVENT_TIMEOUT, 'the answer on response')
        # /diagnostics go on, the server's model name in valid text.
        client.diag.clear()
        client.spin_until(lambda: _backend_status(client)[2].get('server_model')
                          == 'served \ufffd model', EVENT_TIMEOUT, 'the backend status')
        # NaN and Infinity counts: the answer is answered, its counts unknown.
        server.reply = answer('Fine.', usage='{"choices": [], "usage": {"prompt_tokens": NaN, '
                                             '"completion_tokens": Infinity}}')
        info = client.send({'prompt': 'Counted?'})
        assert info['error'] is None and info['text'] == 'Fine.', info
        assert info['generated_tokens'] is None and info['prompt_tokens'] is None
        server.reply = answer('Still here.')
        info = client.send({'prompt': 'Still there?'})
        assert info['text'] == 'Still here.' and info['error'] is None, info
        # The history went out valid with every request.
        assert 'cup \ufffd on \ufffd shelf' in [m['content'] for m in server.requests[-1][
            'messages'] if m['role'] == 'assistant']
        status, result, _ = client.goal(Ask.Goal(prompt='And a goal?'))
        assert status == GoalStatus.STATUS_SUCCEEDED and result.text == 'Still here.'
        assert node.poll() is None
    finally:
        if client is not None:
            client.close()
        stop(node)


def test_configure_gives_up_on_a_models_list_that_drips(server, tiny_ckpt, tmp_path):
    server.models = (200, drip(b' ', 0.5))
    node = start_node(tiny_ckpt, NS, tmp_path, *_params(
        server.url, 'backend_connect_timeout_s:=1.0', 'backend_read_timeout_s:=3.0'))
    try:
        t0 = time.monotonic()
        # Loading the node takes its seconds; the check itself gives up after 4 s.
        assert node.wait(START_TIMEOUT) == 1
        took = time.monotonic() - t0
    finally:
        stop(node)
    log = node.log_path.read_text()
    fatal = [line for line in log.splitlines() if 'failed to load' in line]
    assert len(fatal) == 1 and 'did not answer GET /models within 4 s' in fatal[0], log[-3000:]
    assert took < START_TIMEOUT
