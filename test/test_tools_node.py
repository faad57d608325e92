# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Tool calls and grounding boxes over real loopback DDS.

A node process on a random tiny checkpoint with two cameras of different sizes (``front``
scaled down to the model's size, ``wrist`` scaled up): ``detect`` gives ``response/info``
``detections`` in each camera frame's own pixels with its frame_id and stamp; tool calls come
back in ``response/info`` with the request's tag and their results go back in the next turn
(through the prefix cache); bad tool and grounding requests are refused with the reason; the
``tools`` parameter is refused and kept like ``response_format``; the node serves on;
``orin_llm_chat --tools/--tool-results/--detect`` prints calls and boxes as JSON lines.
"""

from fractions import Fraction
import json
import subprocess
import sys

import numpy as np
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import (  # noqa: E402
    RELIABLE,
    START_TIMEOUT,
    JsonProbe,
    ros_env,
    start_node,
    stop,
)
from rcl_interfaces.srv import GetParameters  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/tools_test'
# (height, width): the tiny checkpoint sees 64x64 .. 256x256 pixels, so front is scaled down
# and wrist up, each by its own factors.
CAMERAS = {'front': (300, 400), 'wrist': (40, 50)}
LABELS = ['red cup', 'gripper']
POINT = {'name': 'point_at', 'description': 'Point the arm at a shape.',
         'parameters': {'type': 'object',
                        'properties': {'colour': {'enum': ['red', 'blue']},
                                       'shape': {'enum': ['circle', 'square']}},
                        'required': ['colour', 'shape'], 'additionalProperties': False}}
TOOLS = [POINT, {'name': 'stop', 'description': 'Stop the arm.'}]


@pytest.fixture(scope='module')
def node(tiny_ckpt, tmp_path_factory):
    proc = start_node(tiny_ckpt, NS, tmp_path_factory.mktemp('tools'),
                      f'image_topics:=[{", ".join(CAMERAS)}]', 'max_new_tokens:=64',
                      'conversation_mode:=chat')
    yield proc
    stop(proc)


class Robot:
    """The probe (a JsonProbe) and one reliable Image publisher per camera."""

    def __init__(self, probe):
        self.probe = probe
        self.pubs = {name: probe.node.create_publisher(Image, f'{NS}/{name}', RELIABLE)
                     for name in CAMERAS}
        self.get_client = probe.node.create_client(GetParameters, f'{NS}/orin_llm/get_parameters')
        self.sent = {}                  # camera -> (frame_id, stamp_ns)

    def frames(self, k):
        """One frame per camera, stamped now, with a fresh frame_id."""
        now = self.probe.node.get_clock().now().nanoseconds
        for i, (name, (h, w)) in enumerate(CAMERAS.items()):
            rgb = np.random.default_rng(100 * k + i).integers(0, 256, (h, w, 3), np.uint8)
            msg = self.probe.image(rgb, stamp_ns=now)
            msg.header.frame_id = f'{name}_{k}'
            self.sent[name] = (msg.header.frame_id, now)
            self.pubs[name].publish(msg)
        self.probe.spin_for(0.5)

    def ask(self, envelope):
        """Publish an envelope with a fresh tag; the ``response/info`` carrying it."""
        return self.probe.send(envelope)

    def parameter(self, name):
        request = GetParameters.Request(names=[name])
        return self.probe.call(self.get_client, request).values[0].string_value


@pytest.fixture(scope='module')
def robot(node):
    p = JsonProbe(NS, tag_prefix='tools_', timeout=120.0)
    try:
        p.spin_until(lambda: p.ready or node.poll() is not None, START_TIMEOUT, 'ready')
        assert node.poll() is None, 'node died:\n' + node.log_path.read_text()[-3000:]
        r = Robot(p)
        p.spin_until(lambda: p.pub_json.get_subscription_count() > 0 and all(
            pub.get_subscription_count() > 0 for pub in r.pubs.values()), 20.0,
            'the cameras and prompt/json subscribed')
        r.frames(0)
        p.hello()
        yield r
    finally:
        p.close()


def camera_pixels(bbox_2d, size):
    """The box in a ``(height, width)`` frame's pixels, exactly (sorted corners, clamped)."""
    h, w = size
    x1, y1, x2, y2 = (min(max(v, 0), 1000) for v in bbox_2d)
    xs = sorted((Fraction(x1 * w, 1000), Fraction(x2 * w, 1000)))
    ys = sorted((Fraction(y1 * h, 1000), Fraction(y2 * h, 1000)))
    return [float(xs[0]), float(ys[0]), float(xs[1]), float(ys[1])]


def test_detections_are_in_each_cameras_own_pixels(robot):
    boxes = {name: 0 for name in CAMERAS}
    for k in range(1, 13):              # random weights at temperature 1: some answers are []
        robot.frames(k)
        info = robot.ask({'detect': LABELS, 'temperature': 1.0, 'max_new_tokens': 160})
        assert info['error'] is None and info['finish_reason'] in ('stop', 'length'), info
        assert info['prompt'].startswith('Locate every instance') and 'tool_calls' not in info
        assert sorted(info['json']) == sorted(CAMERAS), info
        for det in info['detections']:
            name = det['camera']
            frame_id, stamp_ns = robot.sent[name]
            assert det['frame_id'] == frame_id
            assert det['stamp'] == {'sec': stamp_ns // 10**9, 'nanosec': stamp_ns % 10**9}
            assert det['label'] in LABELS
            assert det['bbox'] == camera_pixels(det['bbox_2d'], CAMERAS[name]), det
            x1, y1, x2, y2 = det['bbox']
            h, w = CAMERAS[name]
            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h
            boxes[name] += 1
        for name, answer in info['json'].items():   # each camera's answer, box for box
            if answer is not None:
                assert [b['bbox_2d'] for b in answer] == [
                    d['bbox_2d'] for d in info['detections'] if d['camera'] == name]
        if all(boxes.values()):
            break
    assert all(boxes.values()), boxes


def test_tool_calls_come_back_with_the_tag_and_results_go_back_through_the_cache(robot):
    robot.frames(20)
    info = robot.ask({'prompt': 'Point at the red circle.', 'conversation': 'new',
                      'tools': TOOLS, 'tool_choice': {'name': 'point_at'}})
    assert info['finish_reason'] == 'tool_calls' and info['tag'].startswith('tools_'), info
    call = info['tool_calls'][0]
    assert call['name'] == 'point_at' and call['id'].startswith('call_')
    assert call['arguments']['colour'] in ('red', 'blue')
    # A result naming another tool than its call, and one for no call: refused with the
    # reason; the conversation is left as it was.
    wrong = robot.ask({'tools': TOOLS, 'tool_results': [
        {'id': call['id'], 'name': 'stop', 'content': 'done'}]})
    assert wrong['finish_reason'] == 'error' and wrong['text'] is None
    assert f"names 'stop', but call '{call['id']}' called 'point_at'" in wrong['error']
    unknown = robot.ask({'tools': TOOLS, 'tool_results': [{'id': 'call_0', 'content': 'x'}]})
    assert 'which is not a call of the last answer' in unknown['error'], unknown
    answer = robot.ask({'tools': TOOLS, 'tool_choice': 'none', 'tool_results': [
        {'id': call['id'], 'name': 'point_at', 'content': 'pointed at it'}]})
    assert answer['error'] is None and answer['finish_reason'] in ('stop', 'length'), answer
    assert answer['prompt'] == '' and 'tool_calls' not in answer
    # The turn before is reused: only the tool response and the new answer are prefilled.
    assert answer['cached_tokens'] >= info['prompt_tokens'] // 16 * 16 > 0, (info, answer)


@pytest.mark.parametrize(('envelope', 'reason'), [
    ({'prompt': 'x', 'tools': TOOLS, 'tool_choice': {'name': 'jump'}},
     "tool_choice names 'jump', which is not among the tools"),
    ({'prompt': 'x', 'tools': [{'name': 'bad', 'parameters': {
        'type': 'object', 'properties': {'x': {'type': 'string', 'pattern': '(unclosed'}}}}]},
     "tools rejected: the parameters of tool 'bad'"),
    ({'tools': TOOLS, 'tool_results': [{'id': 'call_1', 'name': 'jump', 'content': 'ok'}]},
     "tool_results[0] names 'jump', which is not a declared tool"),
    ({'detect': ['cup'], 'response_format': {'type': 'json_object'}}, 'cannot be combined'),
    ({'detect': ['cup'], 'tools': TOOLS}, 'cannot be combined'),
])
def test_bad_tool_and_detect_requests_are_refused_with_the_reason(robot, envelope, reason):
    n_err = len(robot.probe.errors)
    info = robot.ask(envelope)
    assert info['finish_reason'] == 'refused' and info['text'] is None
    assert reason in info['error'], info
    robot.probe.spin_until(lambda: any(reason in e for e in robot.probe.errors[n_err:]), 10.0,
                           f'{reason!r} on error')


def test_the_tools_parameter_is_refused_and_kept_and_applies_to_plain_prompts(robot):
    probe = robot.probe
    probe.set_params(tools='')
    robot.frames(30)
    bare = robot.ask({'prompt': 'Is the path clear?', 'conversation': 'new'})
    results = probe.set_params(tools=json.dumps(TOOLS))
    assert results[0].successful, results[0].reason
    try:
        for bad, reason in (
                ('[{"name": "two words"}]', 'tools[0].name must be 1-64'),
                (json.dumps([{'name': 'f', 'parameters': {'type': 'object', 'properties': {
                    'x': {'type': 'string', 'pattern': '(unclosed'}}}}]),
                 "the parameters of tool 'f'"),
                ('[{', 'not JSON')):
            refused = probe.set_params(tools=bad)[0]
            assert not refused.successful and reason in refused.reason, refused.reason
            assert robot.parameter('tools') == json.dumps(TOOLS)   # the old value stays
        with_tools = robot.ask({'prompt': 'Is the path clear?', 'conversation': 'new'})
        assert with_tools['error'] is None, with_tools
        # The tools are rendered into the conversation's system turn.
        assert with_tools['prompt_tokens'] > bare['prompt_tokens'] + 50, (bare, with_tools)
        both = probe.set_params(response_format='{"type": "json_object"}')[0]
        assert not both.successful and 'cannot be combined' in both.reason, both.reason
    finally:
        assert probe.set_params(tools='')[0].successful
    alive = robot.ask({'prompt': 'Are you still there?', 'conversation': 'new'})
    assert alive['error'] is None and alive['text'] is not None


def chat(*args):
    cmd = [sys.executable, '-m', 'orin_llm_node.cli.chat', '-n', NS, '--timeout', '120']
    return subprocess.run(cmd + list(args), env=ros_env(), capture_output=True, text=True,
                          timeout=180)


def test_chat_client_prints_calls_answers_them_and_prints_boxes(robot, tmp_path):
    tools, results = tmp_path / 'tools.json', tmp_path / 'results.json'
    tools.write_text(json.dumps(TOOLS))
    results.write_text(json.dumps({'point_at': {'pointed': True}, 'stop': 'stopped'}))
    robot.frames(40)
    out = chat('--tools', str(tools), '--tool-choice', 'point_at', '--tool-results',
               str(results), 'Point at the red circle.')
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    call = json.loads(lines[0])
    assert call['name'] == 'point_at' and set(call) == {'id', 'name', 'arguments'}
    assert 'finish_reason=tool_calls' in out.stderr, out.stderr
    # The follow-up turn answered the results: its text (or calls) after the first calls.
    assert len(lines) >= 2 and out.stderr.count('[request ') == 2, out
    robot.frames(41)
    out = chat('--detect', 'red cup, gripper')
    assert out.returncode == 0, out.stderr[-2000:]
    for line in out.stdout.splitlines():
        det = json.loads(line)
        assert det['camera'] in CAMERAS and det['label'] in LABELS
        assert det['bbox'] == camera_pixels(det['bbox_2d'], CAMERAS[det['camera']])
    assert 'detection(s)' in out.stderr
    for bad, reason in ((['--tool-results', str(results), 'Hi'], 'need --tools'),
                        (['--tools', str(tools), '--json', 'Hi'], '--tools excludes'),
                        (['--tools', str(tools)], 'the question is required')):
        out = chat(*bad)
        assert out.returncode == 2 and reason in out.stderr, out.stderr


def test_without_vision_msgs_the_detections_topic_is_off_said_once(node, robot):
    try:
        import vision_msgs.msg  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip('vision_msgs is installed: the detections topic is on')
    for k in (60, 61):
        robot.frames(k)
        assert robot.ask({'detect': LABELS})['error'] is None
    assert node.log_path.read_text().count('the detections topic is off') == 1
    assert not robot.probe.node.get_publishers_info_by_topic(f'{NS}/detections')


def test_detection2darray_on_detections_where_vision_msgs_is_installed(robot):
    msgs = pytest.importorskip('vision_msgs.msg', reason='vision_msgs is not installed')
    got = []
    robot.probe.node.create_subscription(msgs.Detection2DArray, f'{NS}/detections',
                                         got.append, RELIABLE)
    boxes = 0
    for k in range(50, 62):
        robot.frames(k)
        n_got = len(got)
        info = robot.ask({'detect': LABELS, 'temperature': 1.0, 'max_new_tokens': 160})
        assert info['error'] is None, info
        robot.probe.spin_until(lambda n=n_got: len(got) >= n + len(CAMERAS), 20.0,
                               'one Detection2DArray per camera')
        for msg in got[n_got:]:
            name = next(n for n, (frame_id, _) in robot.sent.items()
                        if frame_id == msg.header.frame_id)
            stamp_ns = robot.sent[name][1]
            assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == divmod(stamp_ns, 10**9)
            mine = [d for d in info['detections'] if d['camera'] == name]
            assert len(msg.detections) == len(mine)
            for det, entry in zip(msg.detections, mine, strict=True):
                x1, y1, x2, y2 = entry['bbox']
                assert det.bbox.center.position.x == pytest.approx((x1 + x2) / 2)
                assert det.bbox.center.position.y == pytest.approx((y1 + y2) / 2)
                assert det.bbox.size_x == pytest.approx(x2 - x1)
                assert det.bbox.size_y == pytest.approx(y2 - y1)
                assert det.results[0].hypothesis.class_id == entry['label']
                boxes += 1
        if boxes:
            break
    assert boxes
