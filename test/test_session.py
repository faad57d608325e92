# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The session in-process: a real engine on a tiny checkpoint, a recorder for its Replies port.

No DDS and no node process: what the session says (answers, deltas, ``response/info``, errors,
counters) is recorded in order and compared with the same engine run directly.  The node's own
part (topics, lifecycle, parameters) is tested over loopback DDS in test_node.py and beside it.
"""

import json
import subprocess
import sys
import threading

from _image_samples import png_header_only, red_disc
import pytest

from orin_llm_node import parameters
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.ros.cameras.camera_views import CameraView, PendingImage, Request
from orin_llm_node.ros.session import EngineFacts, LoadFailed, Session

SYSTEM = 'You are a test robot.'
MAX_NEW = 6
WAIT_S = 60.0                       # what an answer of a few tokens may take on a busy core


class _Log:
    """A logger writing its lines into a list."""

    def __init__(self, lines):
        self.lines = lines

    def _line(self, text):
        self.lines.append(text)

    debug = info = warning = error = _line


class Recorder:
    """A :class:`~orin_llm_node.ros.replies.Replies` that writes down what it is told."""

    def __init__(self):
        self.events = []                # (kind, payload) in the order said
        self.counts = {}
        self.facts_set = {}
        self.lines = []                 # what the session logged
        self.logger = _Log(self.lines)
        self.said = threading.Condition()

    def _add(self, kind, payload):
        with self.said:
            self.events.append((kind, payload))
            self.said.notify_all()

    def stream(self, delta):
        self._add('stream', delta)

    def answer(self, text):
        self._add('answer', text)

    def info(self, info):
        self._add('info', json.loads(info.to_json()))

    def error(self, text):
        self._add('error', text)

    def count(self, **counts):
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + n

    def facts(self, **values):
        self.facts_set.update(values)

    def diagnostics(self, pool_stats, queue_depth, force=False, only_if_due=False,
                    backend_stats=None):
        self.pool_stats = pool_stats
        return 0.5

    def frame_rejected(self, view, exc):
        self._add('frame_rejected', (view.name, exc.kind))

    def of(self, kind):
        return [payload for k, payload in self.events if k == kind]

    def wait_for(self, kind, n, timeout=WAIT_S):
        with self.said:
            assert self.said.wait_for(lambda: len(self.of(kind)) >= n, timeout), (
                f'{kind} #{n} never came: {self.events[-5:]}')
        return self.of(kind)[n - 1]


def settings_for(ckpt, changes=None, **values):
    """The parameter values a node would give its session: the table's defaults and ours.

    ``changes``: a dict the test fills later (run-time parameters set while it runs).
    """
    base = {p.name: p.default for p in parameters.PARAMETERS}
    base.update({'model_path': str(ckpt), 'device': 'cpu', 'system_prompt': SYSTEM,
                 'max_new_tokens': MAX_NEW, **values})
    changes = {} if changes is None else changes
    return lambda: {**base, **changes}


def start(ckpt, changes=None, **values):
    replies = Recorder()
    session = Session(replies, settings_for(ckpt, changes, **values))
    session.start()
    return session, replies


def request(request_id, text, image=None, envelope=None):
    views = [CameraView('image', image=image, missing='' if image else 'no image received yet')]
    return Request(request_id, text, views, True, 0.0, envelope)


def pending(rgb):
    from sensor_msgs.msg import Image

    from orin_llm_node.ros.cameras.ros_image import rgb_to_image
    msg = rgb_to_image(rgb, Image, frame_id='camera')
    msg.header.stamp.sec = 5
    return PendingImage(msg, False, 5 * 10**9, True)


@pytest.fixture(scope='module')
def reference(tiny_ckpt):
    return LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', image_max_pixels=307200))


@pytest.fixture(scope='module')
def loaded(tiny_ckpt):
    session, replies = start(tiny_ckpt)
    facts = session.load()
    yield session, replies, facts
    assert session.stop(10.0)


def expected(reference, prompts, images=None):
    conv = reference.new_conversation(SYSTEM)
    try:
        return [reference.chat(conv, text, images=images or [],
                               sampling=SamplingParams(max_tokens=MAX_NEW)).text
                for text in prompts]
    finally:
        reference.reset(conv)


def test_loading_returns_the_engine_facts(loaded):
    _, _, facts = loaded
    assert isinstance(facts, EngineFacts)
    assert (facts.device, facts.dtype, facts.weight_format) == ('cpu', 'float32', 'float32')
    assert facts.attention_backend == 'torch' and facts.cuda_graph is False
    assert facts.weight_bytes > 0 and facts.frame_sizer is not None
    assert facts.diagnostics()['device'] == 'cpu'


def test_answers_equal_the_engine_and_say_everything_in_order(loaded, reference):
    session, replies, _ = loaded
    session.request_reset()
    rgb = red_disc()
    want = expected(reference, ['What colour is the shape?', 'And now?'], [rgb])
    n = len(replies.events)
    session.submit(request(1, 'What colour is the shape?', pending(rgb)), 4)
    assert replies.wait_for('answer', 1) == want[0]
    kinds = [k for k, _ in replies.events[n:]]
    # Deltas, then response/info, then the answer; the deltas make up the answer.
    assert kinds == ['stream'] * kinds.count('stream') + ['info', 'answer']
    assert ''.join(p for k, p in replies.events[n:] if k == 'stream') == want[0]
    info = replies.of('info')[-1]
    assert list(info) == ['request_id', 'prompt', 'text', 'image', 'no_image', 'cameras',
                          'camera_sync', 'video', 'finish_reason', 'error', 'generated_tokens',
                          'cached_tokens', 'prompt_tokens', 'ttft_ms', 'decode_tok_s',
                          'weight_format', 'backend', 'model']
    assert info['image'] == {'stamp': {'sec': 5, 'nanosec': 0}, 'frame_id': 'camera',
                             'stamped': True}
    assert info['no_image'] is None and info['text'] == want[0] and info['error'] is None
    assert replies.facts_set['last_image_stamp'] == 5.0
    # The conversation goes on: the follow-up hits the prefix cache.
    session.submit(request(2, 'And now?', pending(rgb)), 4)
    assert replies.wait_for('answer', 2) == want[1]
    assert replies.of('info')[-1]['cached_tokens'] > 0


def test_reset_and_single_mode_answer_alone(loaded, reference, tiny_ckpt):
    session, replies, _ = loaded
    session.request_reset()
    session.submit(request(3, 'Hello.'), 4)
    replies.wait_for('info', len(replies.of('info')) + 1)
    session.request_reset()
    n = len(replies.of('answer'))
    session.submit(request(4, 'Who are you?'), 4)
    assert replies.wait_for('answer', n + 1) == expected(reference, ['Who are you?'])[0]
    assert any('conversation reset (reset service)' in line for line in replies.lines)


def test_a_frame_that_cannot_be_decoded_is_left_out_and_said(loaded, reference):
    from sensor_msgs.msg import CompressedImage
    session, replies, _ = loaded
    session.request_reset()
    msg = CompressedImage(format='png', data=png_header_only(64, 48))
    n = len(replies.of('info'))
    session.submit(request(5, 'Anything there?', PendingImage(msg, True, 10**9, True)), 4)
    info = replies.wait_for('info', n + 1)
    assert replies.of('frame_rejected')[-1] == ('image', 'decode')
    assert info['image'] is None and info['no_image'].startswith('image rejected: ')
    assert info['text'] == expected(reference, ['Anything there?'])[0]


def test_the_queue_drops_the_oldest_and_a_cancel_stops_the_answer(tiny_ckpt):
    session, replies = start(tiny_ckpt, max_new_tokens=400)
    try:
        assert session.submit(request(1, 'a'), 2) is None
        assert session.submit(request(2, 'b'), 2) is None
        assert session.submit(request(3, 'c'), 2).request_id == 1   # queued before loading
        assert session.queue_depth() == 2 and not session.cancel()
        assert [r.request_id for r in session.drain()] == [2, 3]
        session.load()
        session.submit(request(4, 'Tell me a long story.',
                               envelope={'tag': 't'}), 2)
        replies.wait_for('stream', 1)
        assert session.cancel()
        info = replies.wait_for('info', 1)
        assert info['finish_reason'] == 'cancelled' and info['tag'] == 't'
        assert replies.facts_set['last_finish_reason'] == 'cancelled'
    finally:
        assert session.stop(10.0)


def test_input_the_engine_refuses_is_a_failed_info(tiny_ckpt):
    long_system = 'word ' * 200                 # no room for a turn within 64 tokens
    session, replies = start(tiny_ckpt, max_model_len=64, system_prompt=long_system)
    try:
        with pytest.raises(LoadFailed, match="parameter 'system_prompt'"):
            session.load()          # the loaded engine's check refuses it first
    finally:
        assert session.stop(10.0)
    values = {}
    session, replies = start(tiny_ckpt, values, max_model_len=64)
    try:
        session.load()
        session.submit(request(7, 'Hello.'), 4)
        assert replies.wait_for('info', 1)['finish_reason'] in ('stop', 'length')
        # Set at run time (the node's own check would refuse it first): the engine's
        # ValueError when the conversation begins, said on both topics.
        values['system_prompt'] = long_system
        session.submit(request(8, 'Hello again.', envelope={'conversation': 'new',
                                                            'tag': 'x'}), 4)
        info = replies.wait_for('info', 2)
        assert info['request_id'] == 8 and info['finish_reason'] == 'error', info
        assert info['text'] is None and info['error'].startswith('prompt rejected: ')
        assert info['tag'] == 'x' and 'no_image' not in info and 'cameras' in info
        assert replies.of('error')[-1] == f"{info['error']} (request 8)"
        assert replies.counts['errors'] == 1 and replies.counts['requests'] == 2
        # A prompt longer than the context is the engine's refusal: an answer with an error.
        values['system_prompt'] = SYSTEM
        session.submit(request(9, 'red ' * 100), 4)
        info = replies.wait_for('info', 3)
        assert info['text'] is None and info['error'] and 'generated_tokens' in info, info
        assert 'rejected' in replies.of('error')[-1] and 'request 9' in replies.of('error')[-1]
    finally:
        assert session.stop(10.0)


def test_a_load_that_fails_says_why_in_one_line(tmp_path):
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'config.json').write_text('{}')
    session, _ = start(broken)
    try:
        with pytest.raises(LoadFailed) as err:
            session.load()
        assert str(err.value) and '\n' not in str(err.value)
    finally:
        assert session.stop(10.0)


def test_check_loaded_uses_the_engine_once_loaded(loaded, tiny_ckpt):
    session, _, _ = loaded
    values = settings_for(tiny_ckpt)()
    session.check_loaded({**values, 'system_prompt': 'Be brief.'}, ['system_prompt'])
    with pytest.raises(parameters.ParameterError, match="'system_prompt'"):
        session.check_loaded({**values, 'system_prompt': 'word ' * 20000}, ['system_prompt'])
    idle = Session(Recorder(), settings_for(tiny_ckpt))
    idle.check_loaded({**values, 'system_prompt': 'word ' * 20000}, ['system_prompt'])


def test_the_session_imports_no_rclpy():
    code = ('import sys, orin_llm_node.ros.session, orin_llm_node.ros.contract; '
            "sys.exit('rclpy' in sys.modules)")
    assert subprocess.run([sys.executable, '-c', code], timeout=120).returncode == 0
