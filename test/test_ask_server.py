# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's ``ask`` action over real loopback DDS: a node process, an rclpy ActionClient.

One plain node serves the module on a checkpoint made slow enough to act in each stage (40 text
layers: a 256-token answer takes seconds; 24 vision blocks: a large image takes a while to
encode; a prompt longer than one prefill chunk).  The tests run in file order and each starts
from a fresh conversation (the ``reset`` service).  What a goal gets is compared with what the
prompt topic gets for the same question and frame, never with hard-coded text.
Budget: ~1-2 min on 2 busy cores.
"""

import json
import signal
import subprocess
import sys
import time

from child_processes import spawn
import numpy as np
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import (  # noqa: E402
    ANSWER_TIMEOUT,
    EVENT_TIMEOUT,
    REPO,
    connect,
    ros_env,
    start_node,
    stop,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from rclpy.action import ActionClient  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from orin_llm_node.action import Ask  # noqa: E402
from orin_llm_node.ros.cameras.ros_image import rgb_to_image  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/ask_test'
MANAGED_NS = '/ask_test_managed'
MAX_NEW = 6
LONG = 256                          # tokens: seconds of decoding on the slow checkpoint
LONGER = 1000                       # tokens: what a client kills or interrupts
Feedback = Ask.Feedback
STAGES = [Feedback.STAGE_QUEUED, Feedback.STAGE_ENCODING_IMAGES, Feedback.STAGE_PREFILL,
          Feedback.STAGE_DECODING]
# A grammar with no end within LONG tokens: the answer runs to its length, whatever the
# random weights would make of the end-of-text token.
ENDLESS = json.dumps({'type': 'regex', 'pattern': '[a-z ]{5000}'})
# Longer than one prefill chunk (2048 tokens): the engine checks cancel between chunks.
LONG_PROMPT = ' '.join(['the red box is on the left shelf near the door'] * 180) + ' Where?'


def _long(prompt, **fields):
    """A goal whose answer runs to LONG tokens."""
    return Ask.Goal(prompt=prompt, max_new_tokens=LONG, response_format=ENDLESS, **fields)


@pytest.fixture(scope='module')
def slow_ckpt(make_ckpt):
    from orin_llm_node.testing.tiny_checkpoint import write_preprocessor_config
    path = make_ckpt('ask_slow', text_config={'num_hidden_layers': 40},
                     vision_config={'depth': 24})
    write_preprocessor_config(path, max_pixels=1920 * 1088)
    return path


@pytest.fixture(scope='module')
def node(slow_ckpt, tmp_path_factory):
    proc = start_node(slow_ckpt, NS, tmp_path_factory.mktemp('ask_node'),
                      f'max_new_tokens:={MAX_NEW}', 'queue_size:=2')
    yield proc
    stop(proc)


class Asker:
    """The test's ask client on the probe's node: goals, their feedback, their results."""

    def __init__(self, probe, ns):
        self.probe = probe
        self.client = ActionClient(probe.node, Ask, f'{ns}/ask')
        assert self.client.wait_for_server(timeout_sec=EVENT_TIMEOUT)
        # The server's feedback publisher must see us too, or the first feedback is lost.
        probe.spin_until(lambda: probe.node.count_publishers(f'{ns}/ask/_action/feedback'),
                         EVENT_TIMEOUT, 'the feedback publisher')
        probe.spin_for(0.5)

    def send(self, goal, on_feedback=None):
        """Send ``goal``; its handle, with ``feedback`` [(t, Feedback)] filled as it comes."""
        feedback = []

        def got(msg):
            feedback.append((time.monotonic(), msg.feedback))
            if on_feedback is not None:
                on_feedback(msg.feedback)

        future = self.client.send_goal_async(goal, feedback_callback=got)
        self.probe.spin_until(future.done, EVENT_TIMEOUT, 'the goal response')
        handle = future.result()
        assert handle.accepted        # every goal is accepted, a refusal aborts it
        handle.feedback = feedback
        return handle

    def result(self, handle, timeout=ANSWER_TIMEOUT):
        future = handle.get_result_async()
        self.probe.spin_until(future.done, timeout, 'the result')
        return future.result()

    def cancel(self, handle):
        future = handle.cancel_goal_async()
        self.probe.spin_until(future.done, EVENT_TIMEOUT, 'the cancel response')
        return future.result()


@pytest.fixture(scope='module')
def probe(node):
    p = connect(node, NS)
    p.asker = Asker(p, NS)
    yield p
    p.asker.client.destroy()        # before its node: a client collected after it crashes
    p.close()


def _stages(handle):
    """The stages the feedback went through, each once, in order."""
    seen = []
    for _, fb in handle.feedback:
        if not seen or seen[-1] != fb.stage:
            seen.append(fb.stage)
    return seen


def _text(handle):
    return ''.join(fb.text_delta for _, fb in handle.feedback)


def _info_for(probe, request_id):
    probe.spin_until(lambda: any(i['request_id'] == request_id for i in probe.infos),
                     EVENT_TIMEOUT, f'response/info of request {request_id}')
    return next(i for i in probe.infos if i['request_id'] == request_id)


def _frame():
    rng = np.random.default_rng(7)
    return rng.integers(0, 255, (720, 960, 3), dtype=np.uint8)


def test_a_goal_goes_through_its_stages_and_answers_as_the_prompt_topic(probe):
    asker, rgb = probe.asker, _frame()
    probe.reset()
    # The goal first: an image seen before would come from the cache, with no encoding stage.
    handle = asker.send(Ask.Goal(prompt='What is on the shelf?',
                                 images=[rgb_to_image(rgb, Image)], tag='t1'))
    result = asker.result(handle)
    answer = result.result
    probe.reset()
    probe.send_image(probe.image(rgb))
    topic = probe.ask_info('What is on the shelf?')
    assert topic['image'] is not None and topic['text']
    # Feedback and result travel apart: the last text may land after the result.
    probe.spin_until(lambda: _text(handle) == answer.text, EVENT_TIMEOUT, 'the whole text')

    assert result.status == GoalStatus.STATUS_SUCCEEDED
    assert answer.text == topic['text'] and answer.finish_reason == topic['finish_reason']
    assert answer.error == '' and answer.json == ''
    assert json.loads(answer.tool_calls) == [] and json.loads(answer.detections) == []
    assert _stages(handle) == STAGES
    decoding = [fb for _, fb in handle.feedback if fb.stage == Feedback.STAGE_DECODING]
    before = [fb for _, fb in handle.feedback if fb.stage != Feedback.STAGE_DECODING]
    assert all(fb.ttft_ms < 0 and fb.tokens == 0 and not fb.text_delta for fb in before)
    assert all(fb.ttft_ms > 0 and fb.queue_position == 0 for fb in decoding)
    info = json.loads(answer.info)
    assert decoding[-1].tokens == info['generated_tokens'] == topic['generated_tokens']
    assert info['tag'] == 't1' and info['prompt'] == 'What is on the shelf?'
    # The goal's request answers on the topics too, under its own request id.
    assert _info_for(probe, info['request_id'])['text'] == answer.text


def test_text_feedback_is_coalesced(probe):
    asker = probe.asker
    probe.reset()
    handle = asker.send(_long('Tell me about the room.'))
    result = asker.result(handle)
    probe.spin_until(lambda: _text(handle) == result.result.text, EVENT_TIMEOUT, 'every delta')
    info = json.loads(result.result.info)
    assert info['generated_tokens'] == LONG and result.result.finish_reason == 'length'
    texts = [(t, fb) for t, fb in handle.feedback if fb.text_delta]
    # At most one text message per 50 ms (the node's side; fewer messages than tokens as long
    # as a token takes less): counted over the span they arrived in, with a margin for
    # delivery jitter -- what is checked is "coalesced", not the exact rate.
    span = texts[-1][0] - texts[0][0]
    assert len(texts) <= span / 0.05 + 3, (len(texts), span)
    assert [fb.tokens for _, fb in texts] == sorted(fb.tokens for _, fb in texts)


def test_cancelling_a_queued_goal_leaves_the_answer_in_progress(probe):
    asker = probe.asker
    probe.reset()
    first = asker.send(_long('Describe everything.'))
    second = asker.send(Ask.Goal(prompt='And the door?', tag='queued'))
    # Queued behind the first, or first in line once the first was taken.
    probe.spin_until(lambda: second.feedback and second.feedback[-1][1].queue_position == 0
                     and any(fb.stage == Feedback.STAGE_DECODING for _, fb in first.feedback),
                     ANSWER_TIMEOUT, 'the first goal decoding, the second first in line')
    assert [fb.stage for _, fb in second.feedback] == [Feedback.STAGE_QUEUED] * len(
        second.feedback)
    cancel = asker.cancel(second)
    assert [g.goal_id for g in cancel.goals_canceling] == [second.goal_id]
    cancelled = asker.result(second)
    answered = asker.result(first)

    assert cancelled.status == GoalStatus.STATUS_CANCELED
    assert cancelled.result.finish_reason == 'cancelled' and cancelled.result.text == ''
    assert {fb.stage for _, fb in second.feedback} == {Feedback.STAGE_QUEUED}
    assert answered.status == GoalStatus.STATUS_SUCCEEDED
    assert answered.result.finish_reason == 'length'
    assert json.loads(answered.result.info)['generated_tokens'] == LONG
    refused = _info_for(probe, json.loads(cancelled.result.info)['request_id'])
    assert refused['finish_reason'] == 'refused' and 'cancelled' in refused['error']


@pytest.mark.parametrize('stage', ['encoding_images', 'prefill'])
def test_a_cancel_before_the_first_token_stops_the_answer(probe, stage):
    asker = probe.asker
    probe.reset()
    wanted = {'encoding_images': Feedback.STAGE_ENCODING_IMAGES,
              'prefill': Feedback.STAGE_PREFILL}[stage]
    if stage == 'encoding_images':
        rng = np.random.default_rng(3)
        image = rgb_to_image(rng.integers(0, 255, (1080, 1920, 3), dtype=np.uint8), Image)
        goal = _long('What is this?', images=[image])
    else:
        goal = _long(LONG_PROMPT)
    state = {}

    def on_feedback(fb):
        if fb.stage == wanted and 'cancel' not in state:
            state['cancel'] = state['handle'].cancel_goal_async()

    state['handle'] = handle = asker.send(goal, on_feedback)
    result = asker.result(handle)

    assert 'cancel' in state, f'no {stage} feedback: {_stages(handle)}'
    assert result.status == GoalStatus.STATUS_CANCELED
    assert result.result.finish_reason == 'cancelled'
    info = json.loads(result.result.info)
    # Encoding: stopped before the prefill.  Prefill: stopped between its chunks, or (when the
    # cancel lands in the last chunk) at the first token.
    assert info['generated_tokens'] <= (0 if stage == 'encoding_images' else 1), info
    assert info['finish_reason'] == 'cancelled'


def test_a_cancel_while_decoding_stops_that_answer(probe):
    asker = probe.asker
    probe.reset()
    state = {}

    def on_feedback(fb):
        if fb.tokens > 0 and 'cancel' not in state:
            state['cancel'] = state['handle'].cancel_goal_async()

    state['handle'] = handle = asker.send(_long('Talk.'), on_feedback)
    result = asker.result(handle)
    assert result.status == GoalStatus.STATUS_CANCELED
    assert result.result.finish_reason == 'cancelled'
    tokens = json.loads(result.result.info)['generated_tokens']
    assert 0 < tokens < LONG
    assert result.result.text.startswith(_text(handle))
    # The node answers the next question as ever.
    assert probe.ask('Still there?')


def test_the_readme_behaviour_tree_leaf_gets_the_answer(probe):
    probe.reset()
    expected = probe.ask('Where is the door?')
    probe.reset()
    readme = (REPO / 'README.md').read_text()
    block = readme.split('<!-- ask-bt-example -->\n```python\n', 1)[1].split('```', 1)[0]
    scope = {}
    exec(compile(block, 'README.md', 'exec'), scope)  # noqa: S102 - the README's own code
    leaf = scope['AskLeaf'](probe.node, 'Where is the door?', action=f'{NS}/ask')
    status, deadline = 'RUNNING', time.monotonic() + ANSWER_TIMEOUT
    while status == 'RUNNING' and time.monotonic() < deadline:
        status = leaf.tick()
        probe.spin_for(0.02)
    assert status == 'SUCCESS' and leaf.answer == expected
    leaf.client.destroy()


def _refused(probe, goal, needle):
    handle = probe.asker.send(goal)
    result = probe.asker.result(handle, EVENT_TIMEOUT)
    assert result.status == GoalStatus.STATUS_ABORTED
    assert result.result.finish_reason == 'refused' and needle in result.result.error, \
        result.result.error
    info = json.loads(result.result.info)
    assert _info_for(probe, info['request_id'])['error'] == result.result.error
    return result.result.error


def test_malformed_goals_are_refused_with_the_reason(probe):
    bad_image = Image(height=2, width=2, encoding='yuv422_weird', step=8, data=bytes(16))
    cases = [
        (Ask.Goal(prompt='x', response_format='{"type": '), 'response_format is not valid JSON'),
        (Ask.Goal(prompt='x', response_format='{"type": "nonsense"}'), 'response_format'),
        (Ask.Goal(prompt='x', cameras=['nowhere']), "unknown camera(s) 'nowhere'"),
        (Ask.Goal(prompt='x', images=[bad_image]), 'goal image 1: unsupported image encoding'),
        (Ask.Goal(prompt='x', images=[rgb_to_image(_frame(), Image)], video_s=1.0),
         'takes no cameras and no video_s'),
        (Ask.Goal(prompt='   '), 'prompt must not be empty'),
        (Ask.Goal(prompt='x', temperature=float('nan')), 'malformed goal'),
        (Ask.Goal(prompt='x', conversation='forget'), 'conversation must be one of'),
        (Ask.Goal(prompt='x', video_s=1e6), 'video_buffer_s'),
    ]
    for goal, needle in cases:
        _refused(probe, goal, needle)
    assert probe.ask('Still there?')


def test_a_goal_is_refused_when_the_queue_is_full(probe):
    asker = probe.asker
    probe.reset()
    running = asker.send(_long('Describe everything.'))
    probe.spin_until(lambda: any(fb.stage != Feedback.STAGE_QUEUED for _, fb in running.feedback),
                     ANSWER_TIMEOUT, 'the first goal running')
    queued = [asker.send(_long(f'Question {i}?')) for i in range(2)]
    # Accepted is not yet queued: the first feedback says the goal is in the queue.
    probe.spin_until(lambda: all(h.feedback for h in queued), EVENT_TIMEOUT, 'queued')
    assert [h.feedback[0][1].queue_position for h in queued] == [0, 1]
    error = _refused(probe, Ask.Goal(prompt='One too many?'), 'queue full (queue_size 2)')
    assert 'refused' in error
    for handle in [running] + queued:
        asker.cancel(handle)
    assert all(asker.result(h).status == GoalStatus.STATUS_CANCELED for h in [running] + queued)


# A client whose DDS participant is forgotten 2 s after it stops announcing itself (Fast DDS
# keeps a silent participant for its lease, 20 s by default): how soon a killed client can be
# noticed at all.
SHORT_LEASE = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns="http://www.eprosima.com"><profiles>
  <participant profile_name="ask_test_short_lease" is_default_profile="true"><rtps><builtin>
    <discovery_config>
      <leaseDuration><sec>2</sec></leaseDuration>
      <leaseAnnouncement><sec>0</sec><nanosec>500000000</nanosec></leaseAnnouncement>
    </discovery_config>
  </builtin></rtps></participant>
</profiles></dds>
"""


def _chat(*args, env=None):
    return spawn(
        [sys.executable, '-m', 'orin_llm_node.cli.chat', '--action', '-n', NS, '--timeout', '60',
         *args], env=env or ros_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def test_orin_llm_chat_action_prints_stages_and_the_answer(probe):
    probe.reset()
    expected = probe.ask('Where is the red box?')
    probe.reset()
    chat = _chat('Where', 'is', 'the', 'red', 'box?')
    out, err = chat.communicate(timeout=ANSWER_TIMEOUT)
    assert chat.returncode == 0, err
    assert out == expected + '\n'
    lines = [line for line in err.splitlines() if line.startswith('[')]
    assert lines[0] == '[queued (0 ahead)]' and lines[1] == '[prefill]'
    assert lines[2].startswith('[decoding (first token after ')
    assert 'finish_reason=length' in lines[-1]


def _chat_cancelled(probe, sig, code, env=None):
    """orin_llm_chat --action ended by ``sig`` while decoding: its answer is cancelled."""
    n_info = len(probe.infos)
    chat = _chat('Talk', 'for', 'a', 'long', 'while.', env=env)
    try:
        line = ''
        while not line.startswith('[decoding'):
            line = chat.stderr.readline()
            assert line, 'orin_llm_chat ended before the answer began'
        chat.send_signal(sig)
        assert chat.wait(timeout=EVENT_TIMEOUT) == code
        probe.spin_until(lambda: len(probe.infos) > n_info, EVENT_TIMEOUT, 'its response/info')
        info = probe.infos[n_info]
        assert info['finish_reason'] == 'cancelled' and info['generated_tokens'] < LONGER, info
    finally:
        stop(chat)
        chat.stdout.close()
        chat.stderr.close()


@pytest.fixture
def longer_answers(probe):
    """The node's own max_new_tokens and response_format: LONGER tokens that never stop."""
    assert all(r.successful for r in probe.set_params(max_new_tokens=LONGER,
                                                      response_format=ENDLESS))
    probe.reset()
    yield
    probe.set_params(max_new_tokens=MAX_NEW, response_format='')


def test_ctrl_c_in_orin_llm_chat_action_cancels_its_goal(probe, longer_answers):
    _chat_cancelled(probe, signal.SIGINT, 130)


def test_a_goal_whose_client_vanished_is_cancelled(probe, longer_answers, tmp_path):
    # The node notices that no ask client is left (rclpy names no goal's client): this
    # process's own client goes first, so the killed orin_llm_chat is the last one.
    profile = tmp_path / 'short_lease.xml'
    profile.write_text(SHORT_LEASE)
    env = {**ros_env(), 'FASTDDS_DEFAULT_PROFILES_FILE': str(profile)}
    probe.asker.client.destroy()
    try:
        t0 = time.monotonic()
        _chat_cancelled(probe, signal.SIGKILL, -signal.SIGKILL, env)
        # The lease, then a few 1 Hz checks: well before the answer's end.
        assert time.monotonic() - t0 < EVENT_TIMEOUT
    finally:
        probe.asker = Asker(probe, NS)


@pytest.fixture
def managed(slow_ckpt, tmp_path):
    proc = start_node(slow_ckpt, MANAGED_NS, tmp_path, f'max_new_tokens:={MAX_NEW}',
                      'queue_size:=2', managed=True)
    from _ros_harness import Probe
    p = Probe(MANAGED_NS)
    try:
        p.asker = Asker(p, MANAGED_NS)
        p.change = p.node.create_client(ChangeState, f'{MANAGED_NS}/orin_llm/change_state')
        yield p
        p.asker.client.destroy()
    finally:
        p.close()
        stop(proc)


def _transition(probe, tid):
    req = ChangeState.Request()
    req.transition.id = tid
    assert probe.call(probe.change, req, timeout=ANSWER_TIMEOUT).success


def test_goals_are_refused_by_state_and_deactivate_aborts_them(managed):
    probe = managed
    _refused(probe, Ask.Goal(prompt='Hello?'), 'node is unconfigured')
    _transition(probe, Transition.TRANSITION_CONFIGURE)
    _refused(probe, Ask.Goal(prompt='Hello?'), 'node is inactive')
    _transition(probe, Transition.TRANSITION_ACTIVATE)
    probe.spin_until(lambda: probe.ready, EVENT_TIMEOUT, 'ready')
    running = probe.asker.send(_long('Describe everything.'))
    queued = probe.asker.send(Ask.Goal(prompt='And then?'))
    probe.spin_until(lambda: any(fb.tokens for _, fb in running.feedback), ANSWER_TIMEOUT,
                     'the first goal decoding')
    _transition(probe, Transition.TRANSITION_DEACTIVATE)
    for handle in (running, queued):
        result = probe.asker.result(handle)
        assert result.status == GoalStatus.STATUS_ABORTED
        assert result.result.error == 'node deactivated', result.result.error
    assert probe.asker.result(running).result.finish_reason == 'cancelled'
    _transition(probe, Transition.TRANSITION_ACTIVATE)
    probe.spin_until(lambda: probe.ready, EVENT_TIMEOUT, 'ready again')
    again = probe.asker.send(Ask.Goal(prompt='Hello again?'))
    assert probe.asker.result(again).status == GoalStatus.STATUS_SUCCEEDED


def test_a_goal_image_that_does_not_decode_fails_the_goal_with_the_reason(probe):
    # Its magic bytes and header (size) pass the checks on arrival; the pixels do not decode.
    import cv2
    from sensor_msgs.msg import CompressedImage
    png = bytearray(cv2.imencode('.png', _frame()[:64, :64])[1].tobytes())
    png[60:-12] = bytes(len(png) - 72)      # the image data zeroed, the IHDR chunk kept
    broken = CompressedImage(format='png', data=bytes(png))
    handle = probe.asker.send(Ask.Goal(prompt='What is in the picture?',
                                       compressed_images=[broken]))
    result = probe.asker.result(handle)
    assert result.status == GoalStatus.STATUS_ABORTED, result
    assert result.result.finish_reason == 'error', result.result
    assert 'goal image 1: image rejected' in result.result.error, result.result.error
    info = json.loads(result.result.info)
    assert _info_for(probe, info['request_id'])['error'] == result.result.error
    assert probe.ask('Still there?')
