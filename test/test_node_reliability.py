# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Every goal and call answered, limits where the README puts them, pairing a client can rely on.

One plain node process on the tiny checkpoint, over real loopback DDS, and this test's rclpy
clients (with request QoS as deep as the node's, contract.request_qos, so that what is checked
is the node's side): 25 ask goals sent at once and 300 reset/cancel calls during an answer all
answered; a goal of tool results alone answered; the envelope's and the prompt's length limits
exactly at 100,000 characters, a refusal over it echoing the tag; a detect label that is not
valid Unicode refused with its tag; a ``tools`` or ``system_prompt`` change that leaves no room
for a turn refused; JSON-text parameters that arrive unquoted refused with how to quote them,
and the README's ``ros2 param set`` lines taken as ros2cli sends them; ``/diagnostics`` naming
the lifecycle state and feedback naming its stage; an image and a ``prompt/json`` request with
its ``image_stamp`` published back to back paired 40 times in 40.
"""

import json
import re
import shlex
import time

import numpy as np
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import (  # noqa: E402
    ANSWER_TIMEOUT,
    EVENT_TIMEOUT,
    REPO,
    START_TIMEOUT,
    JsonProbe,
    node_command,
    start_node,
    stop,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Time  # noqa: E402
from rcl_interfaces.msg import Parameter  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.action import ActionClient  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from orin_llm_node.action import Ask  # noqa: E402
from orin_llm_node.ros import contract  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_reliable'
MAX_MODEL_LEN = 4096
# An answer that runs to its length: a grammar with no end within max_new_tokens.
ENDLESS = json.dumps({'type': 'regex', 'pattern': '[a-z ]{5000}'})
POINT = {'name': 'point_at', 'description': 'Point the arm at a shape.',
         'parameters': {'type': 'object', 'properties': {'colour': {'enum': ['red', 'blue']}},
                        'required': ['colour'], 'additionalProperties': False}}


@pytest.fixture(scope='module')
def node(tiny_ckpt, tmp_path_factory):
    proc = start_node(tiny_ckpt, NS, tmp_path_factory.mktemp('reliable'), 'max_new_tokens:=4',
                      f'max_model_len:={MAX_MODEL_LEN}', 'queue_size:=4')
    yield proc
    stop(proc)


class Client(JsonProbe):
    """A JsonProbe whose ask, reset and cancel clients are as deep as the node's services."""

    def __init__(self):
        super().__init__(NS, tag_prefix='rel_', timeout=ANSWER_TIMEOUT)
        deep = contract.request_qos()
        self.asker = ActionClient(self.node, Ask, f'{NS}/ask', goal_service_qos_profile=deep,
                                  result_service_qos_profile=deep,
                                  cancel_service_qos_profile=deep)
        self.deep_reset = self.node.create_client(Trigger, f'{NS}/reset', qos_profile=deep)
        self.deep_cancel = self.node.create_client(Trigger, f'{NS}/cancel', qos_profile=deep)

    def goal(self, goal, timeout=ANSWER_TIMEOUT):
        """Send ``goal``; (status, result, feedback)."""
        feedback = []
        sent = self.asker.send_goal_async(goal, feedback_callback=lambda m: feedback.append(
            m.feedback))
        self.spin_until(sent.done, EVENT_TIMEOUT, 'the goal response')
        result = sent.result().get_result_async()
        self.spin_until(result.done, timeout, 'the result')
        self.spin_for(0.3)          # feedback travels apart from the result
        return result.result().status, result.result().result, feedback

    def next_info(self, publish, timeout=ANSWER_TIMEOUT):
        """The first ``response/info`` after ``publish()`` (requests are answered in order)."""
        n = len(self.infos)
        publish()
        self.spin_until(lambda: len(self.infos) > n, timeout, 'a response/info')
        return self.infos[n]

    def close(self):
        self.asker.destroy()
        super().close()


@pytest.fixture(scope='module')
def client(node):
    c = Client()
    try:
        c.spin_until(lambda: c.ready or node.poll() is not None, START_TIMEOUT, 'ready')
        assert node.poll() is None, 'node died:\n' + node.log_path.read_text()[-3000:]
        assert c.asker.wait_for_server(timeout_sec=EVENT_TIMEOUT)
        for srv in (c.deep_reset, c.deep_cancel):
            assert srv.wait_for_service(timeout_sec=EVENT_TIMEOUT)
        c.spin_until(lambda: c.node.count_publishers(f'{NS}/ask/_action/feedback')
                     and c.pub_json.get_subscription_count() > 0
                     and c.pub_image.get_subscription_count() > 0, EVENT_TIMEOUT,
                     'the feedback publisher, prompt/json and image')
        assert c.hello(period_s=1.0)
        yield c
    finally:
        c.close()


def _alive(client):
    info = client.send({'prompt': 'Still there?', 'conversation': 'new'})
    assert info['error'] is None and info['finish_reason'] == 'length', info


def test_diagnostics_name_the_lifecycle_state_and_feedback_names_its_stage(client):
    client.spin_until(lambda: client.generation()[2].get('state') is not None, EVENT_TIMEOUT,
                      'the generation status')
    assert client.generation()[2]['state'] == 'active'
    status, result, feedback = client.goal(Ask.Goal(prompt='Hello?'))
    assert status == GoalStatus.STATUS_SUCCEEDED, result
    names = {Ask.Feedback.STAGE_QUEUED: 'queued', Ask.Feedback.STAGE_PREFILL: 'prefill',
             Ask.Feedback.STAGE_DECODING: 'decoding',
             Ask.Feedback.STAGE_ENCODING_IMAGES: 'encoding_images'}
    assert [fb.stage_name for fb in feedback] == [names[fb.stage] for fb in feedback]
    assert {'queued', 'prefill', 'decoding'} <= {fb.stage_name for fb in feedback}


def test_twenty_five_goals_at_once_each_get_their_result(client):
    busy = client.asker.send_goal_async(Ask.Goal(prompt='Talk.', max_new_tokens=300,
                                                 response_format=ENDLESS))
    client.spin_until(busy.done, EVENT_TIMEOUT, 'the first goal response')
    sent = [client.asker.send_goal_async(Ask.Goal(prompt=f'Question {i}?', tag=f'g{i}'))
            for i in range(25)]
    client.spin_until(lambda: all(f.done() for f in sent), 60.0, 'every goal response')
    handles = [f.result() for f in sent]
    assert all(h.accepted for h in handles)
    results = [h.get_result_async() for h in [busy.result(), *handles]]
    client.spin_until(lambda: all(f.done() for f in results), 120.0, 'every result')
    outcomes = [(f.result().status, f.result().result) for f in results[1:]]
    answered = [r for s, r in outcomes if s == GoalStatus.STATUS_SUCCEEDED]
    refused = [r for s, r in outcomes if s == GoalStatus.STATUS_ABORTED]
    assert len(answered) + len(refused) == 25 and answered, outcomes
    assert all('queue full (queue_size 4)' in r.error for r in refused), refused
    assert results[0].result().status == GoalStatus.STATUS_SUCCEEDED


def test_three_hundred_reset_and_cancel_calls_during_an_answer_are_all_answered(client):
    busy = client.asker.send_goal_async(Ask.Goal(prompt='Talk.', max_new_tokens=300,
                                                 response_format=ENDLESS))
    client.spin_until(busy.done, EVENT_TIMEOUT, 'the goal response')
    calls = [(client.deep_reset if i % 2 else client.deep_cancel).call_async(Trigger.Request())
             for i in range(300)]
    client.spin_until(lambda: all(f.done() for f in calls), 120.0, 'every call answered')
    replies = [f.result() for f in calls]
    assert all(r is not None for r in replies)
    assert {r.message for r in replies[1::2]} <= {
        'conversation reset', 'conversation reset (generation in progress cancelled)'}
    result = busy.result().get_result_async()
    client.spin_until(result.done, ANSWER_TIMEOUT, 'the cancelled goal')
    _alive(client)


def test_a_goal_of_tool_results_alone_is_answered(client):
    tools = [POINT]
    called = client.send({'prompt': 'Point at the red one.', 'conversation': 'new',
                          'tools': tools, 'tool_choice': {'name': 'point_at'},
                          'max_new_tokens': 64})
    assert called['finish_reason'] == 'tool_calls', called
    call = called['tool_calls'][0]
    status, result, _ = client.goal(Ask.Goal(
        tools=json.dumps(tools), tool_results=json.dumps([{'id': call['id'],
                                                           'content': 'pointed'}])))
    assert status == GoalStatus.STATUS_SUCCEEDED, result
    info = json.loads(result.info)
    assert info['prompt'] == '' and info['error'] is None and info['image'] is None, info
    # A goal with neither is still refused, with the envelope's reason.
    status, result, _ = client.goal(Ask.Goal())
    assert status == GoalStatus.STATUS_ABORTED and "'prompt' is required" in result.error


def test_an_envelope_over_the_limit_is_refused_with_its_tag(client):
    info = client.send({'prompt': 'x' * 100_001})
    assert info['finish_reason'] == 'refused' and info['tag'].startswith('rel_')
    assert 'characters rejected (limit 100000)' in info['error'], info


def test_a_prompt_of_exactly_the_limit_is_taken_and_one_more_is_refused(client):
    from std_msgs.msg import String
    words = ('x ' * 50_000)
    assert len(words) == 100_000
    taken = client.next_info(lambda: client.pub_prompt.publish(String(data=words)))
    assert taken['prompt'] == words and 'characters rejected' not in (taken['error'] or '')
    over = client.next_info(lambda: client.pub_prompt.publish(String(data=words + 'y')))
    assert over['finish_reason'] == 'refused'
    assert over['error'] == 'prompt of 100001 characters rejected (limit 100000)', over
    head = '{"prompt": "'
    exact = head + 'y' * (100_000 - len(head) - 2) + '"}'
    envelope = client.next_info(lambda: client.pub_json.publish(String(data=exact)))
    assert 'characters rejected' not in (envelope['error'] or ''), envelope
    _alive(client)


def test_a_detect_label_that_is_not_valid_unicode_is_refused_with_its_tag(client):
    for detect in ('\ud800', ['cup', '\udfff']):
        info = client.send({'detect': detect})
        assert info['finish_reason'] == 'refused', info
        assert info['error'] == ('prompt/json refused: detect must be valid Unicode (it holds '
                                 'a lone surrogate)')
    _alive(client)


def _set(client, **values):
    return client.set_params(**values)[0]


def test_tools_or_a_system_prompt_that_leave_no_room_for_a_turn_are_refused(client):
    long_tool = [{'name': 'f', 'description': 'word ' * 6000}]
    refused = _set(client, tools=json.dumps(long_tool))
    assert not refused.successful
    assert f'no room for an answer within max_model_len {MAX_MODEL_LEN}' in refused.reason, \
        refused.reason
    # With tools set, a system prompt is judged with them beside it (and the other way round).
    # (3 tokens a word on the tiny checkpoint: 1500 + 3000 tokens, more than 4096 together.)
    part = [{'name': 'f', 'description': 'word ' * 500}]
    assert _set(client, tools=json.dumps(part)).successful
    try:
        long_prompt = 'word ' * 1000
        refused = _set(client, system_prompt=long_prompt)
        assert not refused.successful and 'the system prompt and the tools take' in \
            refused.reason, refused.reason
    finally:
        assert _set(client, tools='').successful
    assert _set(client, system_prompt=long_prompt).successful       # alone it fits
    assert _set(client, system_prompt='You are a test robot.').successful
    _alive(client)


def test_json_text_that_arrives_unquoted_is_refused_with_how_to_quote_it(client):
    for name, value in (('response_format', '{type: json_object}'),
                        ('response_format', 'json_object'), ('tools', '{"name": "f"}')):
        refused = _set(client, **{name: value})
        assert not refused.successful, (name, value)
        assert 'ros2 param set <node>' in refused.reason and "\"'" in refused.reason, \
            refused.reason
    refused = _set(client, response_format='{type: json_object}')
    assert '''response_format "'{\\"type\\": \\"json_object\\"}'"''' in refused.reason


def _readme_files():
    # The files the README writes with `cat > NAME <<'EOF'` ... EOF.
    readme = (REPO / 'README.md').read_text()
    return dict(re.findall(r"^cat > (\S+) <<'EOF'\n(.*?)^EOF$", readme, re.M | re.S))


def test_the_readme_param_set_lines_are_taken_as_ros2cli_sends_them(client):
    # ros2 param set reads its value with this very function (ros2cli from Jazzy on; Humble's
    # own copy in ros2param.api reads YAML the same way), then sends it.
    from rclpy.parameter import get_parameter_value
    files = _readme_files()
    lines = [line.split('#')[0] for line in (REPO / 'README.md').read_text().splitlines()
             if line.startswith('ros2 param set ')]
    assert any(' response_format ' in line for line in lines)
    defaults = {'temperature': 0.0, 'video_window_s': 0.0, 'response_format': '', 'tools': ''}
    for line in lines:
        for name, text in files.items():
            line = line.replace(f'"$(cat {name})"', shlex.quote(text))
        words = shlex.split(line)
        assert words[:3] == ['ros2', 'param', 'set'] and len(words) == 6, line
        name = words[4]
        request = SetParameters.Request(parameters=[Parameter(
            name=name, value=get_parameter_value(string_value=words[5]))])
        try:
            result = client.call(client.param_client, request).results[0]
            assert result.successful, (line, result.reason)
        finally:
            assert _set(client, **{name: defaults[name]}).successful


def _frame(k):
    rng = np.random.default_rng(k)
    return rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)


def test_an_image_and_its_prompt_published_back_to_back_are_paired(client):
    from std_msgs.msg import String
    base = time.time_ns()
    paired = []
    for k in range(40):
        stamp_ns = base + k * 1_000_000
        msg = client.image(_frame(k), stamp_ns=stamp_ns)
        msg.header.frame_id = f'frame_{k}'
        stamp = {'sec': stamp_ns // 10**9, 'nanosec': stamp_ns % 10**9}
        client.sent += 1
        tag = f'pair_{k}'
        envelope = {'prompt': 'What is this?', 'tag': tag, 'image_stamp': stamp}
        client.pub_image.publish(msg)           # back to back: no spin, no wait between
        client.pub_json.publish(String(data=json.dumps(envelope)))
        info = client.wait_info(tag)
        assert info['error'] is None, info
        paired.append((info['image'] or {}).get('frame_id'))
        assert Time(**info['image']['stamp']) == msg.header.stamp, info
    assert paired == [f'frame_{k}' for k in range(40)]


def test_a_params_file_mapping_for_a_json_parameter_is_refused_with_how_to_quote_it(
        tiny_ckpt, tmp_path):
    params = tmp_path / 'mapping.yaml'
    params.write_text('/**:\n  ros__parameters:\n    response_format: {type: json_object}\n')
    proc = start_node(tiny_ckpt, '/llm_mapping', tmp_path, command=[
        *node_command(), '--ros-args', '--params-file', str(params)])
    try:
        assert proc.wait(START_TIMEOUT) == 2
    finally:
        stop(proc)
    log = proc.log_path.read_text()
    assert "parameter 'response_format' was given as a YAML mapping (as " \
           "'response_format.type')" in log, log[-2000:]
    assert """in a params file, response_format: '{"type": "json_object"}'""" in log
