# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The package's own action type, ``orin_llm_node.action.Ask``, over real rclpy on loopback.

An ActionServer with trivial logic and an ActionClient in this process: a goal carrying every
field (images of both kinds included) reaches the server whole, the feedback comes in the
order it was sent with its stage constants, the result comes back whole, and cancelling one of
two goals ends that one only. It proves the generated type (``make venv``: the venv's build,
``colcon build``: the install) works end to end, not the node's action server.
"""

import json
import threading
import time

from action_msgs.msg import GoalStatus
import pytest
import rclpy
from rclpy.action import ActionClient, ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from sensor_msgs.msg import CompressedImage, Image

from orin_llm_node.action import Ask

pytestmark = pytest.mark.ros

TIMEOUT_S = 60.0
Feedback = Ask.Feedback


def _goal_record(goal):
    """Everything a goal carries, as plain JSON (what the trivial server echoes in ``info``)."""
    return {
        'prompt': goal.prompt,
        'images': [[im.height, im.width, im.encoding, im.step, list(im.data)]
                   for im in goal.images],
        'compressed_images': [[im.format, list(im.data)] for im in goal.compressed_images],
        'cameras': list(goal.cameras), 'video_s': goal.video_s,
        'response_format': goal.response_format, 'tools': goal.tools,
        'tool_results': goal.tool_results, 'max_new_tokens': goal.max_new_tokens,
        'temperature': goal.temperature, 'conversation': goal.conversation, 'tag': goal.tag,
    }


def _stages(prompt):
    """The feedback the trivial server sends for ``prompt``: every stage, then one word each."""
    words = prompt.split()
    sent = [(Feedback.STAGE_QUEUED, '', 0, -1.0, 2), (Feedback.STAGE_QUEUED, '', 0, -1.0, 1),
            (Feedback.STAGE_ENCODING_IMAGES, '', 0, -1.0, 0),
            (Feedback.STAGE_PREFILL, '', 0, -1.0, 0)]
    sent += [(Feedback.STAGE_DECODING, f'{w} ', i + 1, 12.5, 0) for i, w in enumerate(words)]
    return sent


class _EchoServer:
    """An ``ask`` server that echoes the goal; a goal whose tag is 'hold' waits to be cancelled."""

    def __init__(self, node):
        self.received = []
        # Called between the last feedback and the result: rclpy's client drops the feedback of a
        # goal whose result it already has, so a test waits here for the feedback to land.
        self.before_result = lambda goal: None
        self.server = ActionServer(
            node, Ask, 'ask', self._execute, goal_callback=self._goal,
            cancel_callback=lambda handle: CancelResponse.ACCEPT,
            callback_group=ReentrantCallbackGroup())

    def _goal(self, goal):
        return GoalResponse.REJECT if not goal.prompt else GoalResponse.ACCEPT

    def _execute(self, handle):
        goal = handle.request
        self.received.append(goal)
        if goal.tag == 'hold':
            deadline = time.monotonic() + TIMEOUT_S
            while not handle.is_cancel_requested and time.monotonic() < deadline:
                time.sleep(0.01)
            handle.canceled()
            return Ask.Result(finish_reason='cancelled', info=json.dumps({'tag': goal.tag}))
        for stage, delta, tokens, ttft_ms, ahead in _stages(goal.prompt):
            handle.publish_feedback(Feedback(stage=stage, text_delta=delta, tokens=tokens,
                                             ttft_ms=ttft_ms, queue_position=ahead))
        self.before_result(goal)
        handle.succeed()
        return Ask.Result(text=goal.prompt.upper(), json='{"ok": true}', tool_calls='[]',
                          detections='[]', finish_reason='stop',
                          info=json.dumps(_goal_record(goal)))


@pytest.fixture
def ros():
    """A server node and a client node in one context, spun by a background executor."""
    context = rclpy.context.Context()
    rclpy.init(context=context)
    server_node = rclpy.create_node('ask_echo_server', context=context)
    client_node = rclpy.create_node('ask_client', context=context)
    server = _EchoServer(server_node)
    client = ActionClient(client_node, Ask, 'ask')
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    executor.add_node(server_node)
    executor.add_node(client_node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    assert client.wait_for_server(timeout_sec=TIMEOUT_S), 'the ask server was never discovered'
    # The client sees the server; the server's feedback publisher must see the client too, or the
    # first feedback is lost (volatile).
    _wait_until(lambda: server_node.count_subscribers('/ask/_action/feedback') > 0,
                'the feedback subscription, seen from the server')
    yield server, client
    executor.shutdown()
    spinner.join(timeout=TIMEOUT_S)
    client.destroy()
    server.server.destroy()
    client_node.destroy_node()
    server_node.destroy_node()
    rclpy.try_shutdown(context=context)


def _wait(future, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not future.done():
        assert time.monotonic() < deadline, f'timed out waiting for {what}'
        time.sleep(0.01)
    return future.result()


def _wait_until(cond, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        assert time.monotonic() < deadline, f'timed out waiting for {what}'
        time.sleep(0.01)


def _full_goal():
    image = Image(height=2, width=3, encoding='rgb8', step=9, data=bytes(range(18)))
    image.header.frame_id = 'camera'
    jpeg = CompressedImage(format='jpeg', data=b'\xff\xd8\xff\xe0 not really a jpeg')
    return Ask.Goal(prompt='what is on the table', images=[image], compressed_images=[jpeg],
                    cameras=['front', 'wrist'], video_s=1.5,
                    response_format='{"type": "json_object"}', tools='[]',
                    tool_results='[{"name": "grip", "result": "ok"}]', max_new_tokens=7,
                    temperature=0.25, conversation=Ask.Goal.CONVERSATION_NEW, tag='t-1')


def test_a_goal_its_feedback_and_its_result_cross_whole(ros):
    server, client = ros
    goal = _full_goal()
    feedback = []
    expected = _stages(goal.prompt)
    server.before_result = lambda goal: _wait_until(lambda: len(feedback) >= len(expected),
                                                    'every feedback message')
    handle = _wait(client.send_goal_async(goal, feedback_callback=feedback.append), 'acceptance')
    assert handle.accepted
    result = _wait(handle.get_result_async(), 'the result')

    assert [(m.feedback.stage, m.feedback.text_delta, m.feedback.tokens, m.feedback.ttft_ms,
             m.feedback.queue_position) for m in feedback] == expected
    assert all(m.goal_id == handle.goal_id for m in feedback)
    assert len(server.received) == 1 and server.received[0] == goal
    answer = result.result
    assert answer.text == goal.prompt.upper() and answer.finish_reason == 'stop'
    assert answer.error == '' and json.loads(answer.json) == {'ok': True}
    assert json.loads(answer.info) == _goal_record(goal)
    # Defaults say "as the node's parameter", like a prompt/json key left out.
    default = Ask.Goal()
    assert (default.max_new_tokens, default.temperature, default.video_s) == (0, -1.0, 0.0)
    assert Feedback().ttft_ms < 0 and Ask.Goal.CONVERSATION_CONTINUE == 'continue'


def test_cancelling_one_goal_leaves_the_other(ros):
    server, client = ros
    held = _wait(client.send_goal_async(Ask.Goal(prompt='wait', tag='hold')), 'acceptance')
    answered = _wait(client.send_goal_async(Ask.Goal(prompt='two words', tag='go')),
                     'acceptance')
    refused = _wait(client.send_goal_async(Ask.Goal()), 'the refusal of an empty prompt')
    assert held.accepted and answered.accepted and not refused.accepted

    assert _wait(answered.get_result_async(), 'the answer').result.text == 'TWO WORDS'
    cancel = _wait(held.cancel_goal_async(), 'the cancel response')
    assert [g.goal_id for g in cancel.goals_canceling] == [held.goal_id]
    result = _wait(held.get_result_async(), 'the cancelled result')
    assert result.status == GoalStatus.STATUS_CANCELED
    assert result.result.finish_reason == 'cancelled'
    assert [g.tag for g in server.received] == ['hold', 'go']
