# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The orin_llm node over real loopback DDS: a separate node process, no mocks.

One node process serves the whole module (start-up is the expensive part); the tests run in
file order and each brings the conversation to a known state with the ``reset`` service.  The
same engine runs in this process on the same checkpoint as the reference for every answer.
Budget: ~1-2 min on 2 busy cores.
"""

import array
import json
from pathlib import Path
import signal
import subprocess
import sys
import time

from child_processes import spawn
import pytest

rclpy = pytest.importorskip('rclpy')

from _image_samples import png_bomb, png_header_only, red_disc  # noqa: E402
from _ros_harness import (  # noqa: E402
    ANSWER_TIMEOUT,
    EVENT_TIMEOUT,
    EXIT_WITHIN_S,
    START_TIMEOUT,
    SYSTEM,
    connect,
    memory_mb,
    node_command,
    ros_env,
    start_node,
    stop,
)
from builtin_interfaces.msg import Time  # noqa: E402
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from orin_llm_node.ros.cameras.ros_image import rgb_to_image  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_test'
SINGLE_NS = '/llm_test_single'
POOL_BLOCKS = 16                    # x 16 tokens: small enough to exhaust in a few seconds
MAX_NEW = 6


@pytest.fixture(scope='module')
def reference(tiny_ckpt):
    """The same engine in this process: the expected answers."""
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', num_kv_blocks=POOL_BLOCKS,
                                 image_max_pixels=307200))
    return eng


@pytest.fixture(scope='module')
def node(tiny_ckpt, reference, tmp_path_factory):
    """The node under test: chat mode, a 16-block KV pool."""
    mb = POOL_BLOCKS * reference.stats().bytes_per_block / 2**20
    proc = start_node(tiny_ckpt, NS, tmp_path_factory.mktemp('node'),
                      f'kv_cache_memory_mb:={mb!r}', f'max_new_tokens:={MAX_NEW}',
                      'queue_size:=2')
    yield proc
    stop(proc)


@pytest.fixture(scope='module')
def probe(node):
    p = connect(node, NS)
    yield p
    p.close()


def _log(node):
    return node.log_path.read_text()


def test_ready_and_diagnostics_keys(probe, node):
    level, _, pool = probe.pool()
    assert pool['total_blocks'] == str(POOL_BLOCKS) and pool['block_size'] == '16'
    for key in ('free_blocks', 'cached_blocks', 'used_blocks', 'usage_pct', 'bytes_per_block',
                'prefix_hit_rate', 'evictions', 'exhaustion_events', 'truncated_generations',
                'rejected_prompts'):
        assert key in pool, key
    _, _, gen = probe.generation()
    for key in ('device', 'dtype', 'cuda_graph', 'last_ttft_ms', 'last_vision_ms',
                'last_decode_tok_s', 'queue_depth', 'requests', 'errors', 'last_image_stamp',
                'last_finish_reason'):
        assert key in gen, key
    assert gen['device'] == 'cpu' and gen['dtype'] == 'float32'
    assert gen['weight_format'] == 'float32' and int(gen['weight_bytes']) > 0
    assert gen['attention_backend'] == 'torch' and gen['backend_fallback_reason'] == ''
    assert 'RANDOM' not in _log(node)


def test_answers_equal_the_engine_and_the_stream_concatenates(probe, reference):
    rgb = red_disc()
    conv = reference.new_conversation(SYSTEM)
    greedy = SamplingParams(max_tokens=MAX_NEW)
    ref1 = reference.chat(conv, 'What colour is the shape?', images=[rgb], sampling=greedy)
    ref2 = reference.chat(conv, 'Describe it again.', images=[rgb], sampling=greedy)
    assert ref2.cached_tokens > 0

    now = probe.node.get_clock().now().nanoseconds
    probe.send_image(probe.image(rgb, stamp_ns=now))
    answer = probe.ask('What colour is the shape?')
    assert answer == ref1.text
    assert ''.join(probe.deltas) == answer
    probe.spin_until(lambda: probe.generation()[2]['requests'] == '1',
                     EVENT_TIMEOUT, 'diagnostics')
    assert float(probe.generation()[2]['last_image_stamp']) == pytest.approx(now / 1e9)
    assert probe.pool()[2]['prefix_hits'] == '0'

    # An image stamped 1000 s earlier arrives (a delayed sample): it never replaces the kept
    # one, which the follow-up gets again.
    probe.send_image(probe.image(red_disc(32, 32), stamp_ns=now - 1000 * 10**9))
    answer = probe.ask('Describe it again.')
    assert answer == ref2.text
    assert ''.join(probe.deltas) == answer
    probe.spin_until(lambda: int(probe.pool()[2]['prefix_hits']) >= ref2.cached_tokens,
                     EVENT_TIMEOUT, 'prefix-cache hits in /diagnostics')
    assert float(probe.pool()[2]['prefix_hit_rate']) > 0
    reference.reset(conv)


def test_reset_forgets_the_conversation(probe, reference):
    probe.reset()
    rgb = red_disc(48, 64)
    probe.send_image(probe.image(rgb, stamp_ns=probe.node.get_clock().now().nanoseconds))
    conv = reference.new_conversation(SYSTEM)
    ref = reference.chat(conv, 'Hello again.', images=[rgb],
                         sampling=SamplingParams(max_tokens=MAX_NEW))
    assert probe.ask('Hello again.') == ref.text
    probe.reset()
    reference.reset(conv)


def test_runtime_parameters_and_bad_inputs(probe, reference):
    results = probe.set_params(max_new_tokens=2, top_p=0.5)
    assert all(r.successful for r in results)
    bad = probe.set_params(top_p=1.5)[0]
    assert not bad.successful and 'top_p' in bad.reason
    assert not probe.set_params(queue_size=100)[0].successful      # read-only
    probe.set_params(top_p=1.0)

    conv = reference.new_conversation(SYSTEM)
    greedy = SamplingParams(max_tokens=2)
    w, h = 8, 6

    def raw(encoding, data, width=w, height=h, step=w * 3):
        msg = Image(width=width, height=height, encoding=encoding, step=step)
        msg.data = array.array('B', data)
        return msg

    def compressed(data, fmt='jpeg'):
        msg = CompressedImage(format=fmt)
        msg.data = array.array('B', data)
        return msg

    # The first case leaves the camera without a kept frame (the worker could not decode the
    # newest one), so the frames refused after it leave the prompts text-only.
    cases = [
        # Passes the header checks, fails when the worker decodes it for the prompt.
        (compressed(png_header_only(64, 48), 'png'), 'could not be decoded'),
        (raw('hsv8', bytes(w * h * 3)), 'unsupported image encoding'),
        (raw('rgb8', bytes(w * h * 3 - 1)), 'too short'),
        (raw('rgb8', b'', width=0, height=0, step=0), 'zero-size'),
        (raw('bgr8', bytes(w * h * 3), step=w * 3 - 3), 'step'),
        (raw('rgb8', bytes(16), width=100000, height=100000, step=300000), 'absurd'),
        (compressed(b'definitely not a jpeg'), 'magic'),
        (compressed(b'\xff\xd8\xff\xe0' + bytes(64)), 'header could not be read'),
        (compressed(png_bomb(300, 1), 'png'), 'aspect ratio 300.0'),
    ]
    for i, (msg, needle) in enumerate(cases):
        text = f'Still there {i}?'
        if needle == 'could not be decoded':
            # Stamped just after a good frame due for the camera's video ring (over a period
            # after the last frame), it is not due itself (video_fps), so it is not decoded on
            # arrival (and refused there): it is kept, and the worker decodes it.
            probe.spin_for(1.0)
            now = probe.node.get_clock().now().nanoseconds
            probe.send_image(probe.image(red_disc(), stamp_ns=now))
            later = now + 10**8
            msg.header.stamp = Time(sec=later // 10**9, nanosec=later % 10**9)
            probe.send_image(msg)
            n_resp = len(probe.responses)
            probe.expect_error(lambda t=text: probe.pub_prompt.publish(String(data=t)), needle)
            probe.spin_until(lambda n=n_resp: len(probe.responses) > n, ANSWER_TIMEOUT, 'answer')
            answer = probe.responses[n_resp]
        else:
            probe.expect_error(lambda m=msg: probe.send_image(m), needle)
            answer = probe.ask(text)
        assert answer == reference.chat(conv, text, sampling=greedy).text, needle
    probe.expect_error(lambda: probe.pub_prompt.publish(String(data='   ')), 'empty prompt')
    last = probe.ask_info('Last one.')
    assert last['text'] == reference.chat(conv, 'Last one.', sampling=greedy).text
    # The last frame received was refused, and the prompt says so.
    assert last['no_image'].startswith('image rejected: image aspect ratio 300.0'), last
    assert int(probe.generation()[2]['errors']) >= len(cases)
    probe.reset()
    reference.reset(conv)


def test_cancel_stops_the_generation_in_progress(probe):
    assert not probe.call(probe.cancel_client, Trigger.Request()).success   # nothing running
    probe.set_params(max_new_tokens=180)
    n_resp = len(probe.responses)
    probe.deltas.clear()
    t0 = time.monotonic()
    probe.pub_prompt.publish(String(data='Tell me a long story.'))
    probe.spin_until(lambda: probe.deltas, ANSWER_TIMEOUT, 'the first streamed delta')
    reply = probe.call(probe.cancel_client, Trigger.Request())
    assert reply.success, reply.message
    probe.spin_until(lambda: len(probe.responses) > n_resp, 20.0, 'the cancelled answer')
    assert time.monotonic() - t0 < 30.0
    probe.spin_until(lambda: probe.generation()[2]['last_finish_reason'] == 'cancelled',
                     EVENT_TIMEOUT, 'last_finish_reason cancelled')
    assert probe.responses[-1].startswith(probe.deltas[0])
    probe.reset()


def test_queue_overflow_drops_the_oldest_prompt(probe):
    probe.set_params(max_new_tokens=40)
    n_resp, n_err = len(probe.responses), len(probe.errors)
    for i in range(4):                          # queue_size is 2
        probe.pub_prompt.publish(String(data=f'Queued prompt {i}.'))

    def drops():
        return [e for e in probe.errors[n_err:] if 'queue full' in e]

    probe.spin_until(lambda: drops() and len(probe.responses) - n_resp >= 4 - len(drops()),
                     ANSWER_TIMEOUT, 'a dropped prompt and the other answers')
    probe.spin_for(1.0)
    assert len(probe.responses) - n_resp == 4 - len(drops())
    assert "'Queued prompt 0.'" in drops()[0] or "'Queued prompt 1.'" in drops()[0]
    probe.set_params(max_new_tokens=MAX_NEW)
    probe.reset()


def test_small_pool_exhaustion_is_an_error_in_diagnostics(probe, node):
    # The prompt fits in the 16-block pool, the answer does not: truncated (kv_exhausted).
    probe.set_params(max_new_tokens=300)
    probe.ask('Tell me a story about a red circle on a grey floor. ' * 6, timeout=120.0)
    probe.spin_until(lambda: probe.generation()[2]['last_finish_reason'] == 'kv_exhausted',
                     5.0, 'kv_exhausted')
    probe.spin_until(lambda: probe.pool()[0] == 2, EVENT_TIMEOUT, 'kv_block_pool ERROR')
    level, message, pool = probe.pool()
    assert int(pool['exhaustion_events']) > 0 and int(pool['truncated_generations']) > 0
    assert 'truncated' in message
    # A prompt that cannot fit at all is rejected with a reason; the node keeps serving.
    probe.reset()
    probe.expect_error(lambda: probe.pub_prompt.publish(String(data='red ' * 400)), 'rejected')
    probe.spin_until(lambda: int(probe.pool()[2]['rejected_prompts']) > 0, EVENT_TIMEOUT,
                     'rejected_prompts in /diagnostics')
    assert int(probe.pool()[2]['exhaustion_events']) >= 2
    probe.set_params(max_new_tokens=MAX_NEW)
    assert probe.ask('Are you still there?')
    assert node.poll() is None


def test_use_sim_time_ages_images_on_the_ros_clock(probe):
    probe.reset()
    assert all(r.successful for r in probe.set_params(use_sim_time=True, max_new_tokens=1))
    sim = 1000 * 10**9
    for _ in range(5):
        probe.pub_clock.publish(Clock(clock=Time(sec=sim // 10**9)))
        probe.spin_for(0.1)
    # 5 s old on the simulated clock (ancient on the wall clock): fresh, so it is paired.
    probe.send_image(probe.image(red_disc(), stamp_ns=sim - 5 * 10**9))
    probe.ask('Colour?')
    probe.spin_until(lambda: probe.generation()[2]['last_image_stamp'] == '995', EVENT_TIMEOUT,
                     'the sim-time image paired')
    # 100 s on, the image is 105 s old on the simulated clock: stale, answered text-only.
    for _ in range(5):
        probe.pub_clock.publish(Clock(clock=Time(sec=sim // 10**9 + 100)))
        probe.spin_for(0.1)
    info = probe.ask_info('Colour now?')
    assert info['image'] is None and info['no_image'].startswith('newest image is 105'), info
    probe.set_params(use_sim_time=False, max_new_tokens=MAX_NEW)
    probe.reset()


def stamp_ns(stamp):
    return stamp['sec'] * 10**9 + stamp['nanosec']


def test_an_older_frame_never_replaces_the_kept_one(probe):
    probe.reset()
    probe.set_params(max_new_tokens=1)
    now = probe.node.get_clock().now().nanoseconds
    probe.send_image(probe.image(red_disc(), stamp_ns=now))
    # A delayed sample of an older scene arrives after it: skipped, as out-of-order frames are.
    probe.send_image(probe.image(red_disc(48, 48), stamp_ns=now - 10**9))
    info = probe.ask_info('Which frame?')
    assert stamp_ns(info['image']['stamp']) == now and info['no_image'] is None, info
    probe.set_params(max_new_tokens=MAX_NEW)
    probe.reset()


def test_every_reason_for_no_image_is_true(probe):
    # On a simulated clock: a kept frame from ahead of the clock (the wall clock's, before
    # the switch) gives way; a refused frame never replaces the kept one; a stale one is said
    # stale, with the refused frame after it.
    probe.reset()
    probe.send_image(probe.image(red_disc(), stamp_ns=probe.node.get_clock().now().nanoseconds))
    assert all(r.successful for r in probe.set_params(use_sim_time=True, max_new_tokens=1))
    sim = 2000 * 10**9

    def clock(ns):
        for _ in range(5):
            probe.pub_clock.publish(Clock(clock=Time(sec=ns // 10**9, nanosec=ns % 10**9)))
            probe.spin_for(0.1)

    try:
        clock(sim)
        probe.send_image(probe.image(red_disc(), stamp_ns=sim - 10**9))
        assert stamp_ns(probe.ask_info('Kept?')['image']['stamp']) == sim - 10**9
        probe.expect_error(lambda: probe.send_image(probe.image(
            red_disc(), stamp_ns=sim + 5 * 10**9)), 'in the future')
        info = probe.ask_info('Still kept?')
        assert stamp_ns(info['image']['stamp']) == sim - 10**9, info
        clock(sim + 100 * 10**9)
        probe.expect_error(lambda: probe.send_image(probe.image(red_disc(1, 300))),
                           'aspect ratio 300.0')
        info = probe.ask_info('And now?')
        assert info['image'] is None, info
        assert info['no_image'].startswith(
            'newest image is 101.0 s old (> image_max_age_s 30 s); the last frame received was '
            'rejected: image aspect ratio 300.0'), info
    finally:
        probe.set_params(use_sim_time=False, max_new_tokens=MAX_NEW)
    probe.reset()


def test_image_bomb_and_bad_images_are_refused_on_arrival(probe, node):
    probe.reset()
    probe.set_params(max_new_tokens=2)
    idle = memory_mb(node, 'VmHWM')
    bomb = CompressedImage(format='png')
    bomb.data = array.array('B', png_bomb(16000, 16000))     # 768 MB once decoded
    for msg, needle in ((bomb, 'absurd'),
                        (probe.image(red_disc(1, 300)), 'aspect ratio 300.0'),
                        (probe.image(red_disc(), stamp_ns=probe.node.get_clock().now().nanoseconds
                                     + 3600 * 10**9), 'in the future')):
        good = probe.node.get_clock().now().nanoseconds
        probe.send_image(probe.image(red_disc(), stamp_ns=good))     # a good image first
        probe.expect_error(lambda m=msg: probe.send_image(m), needle)
        info = probe.ask_info(f'After {needle}?')
        # The refused image never replaces the good one: the prompt still gets it.
        assert info['image'] is not None and stamp_ns(info['image']['stamp']) == good, info
        assert info['no_image'] is None, info
        assert info['finish_reason'] in ('stop', 'length') and info['text'] is not None
    assert memory_mb(node, 'VmHWM') - idle < 200, 'the bomb was decoded'
    probe.set_params(max_new_tokens=MAX_NEW)
    probe.reset()


def test_a_prompt_flood_is_answered_or_reported_prompt_by_prompt(probe):
    probe.set_params(max_new_tokens=1)
    deep = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                      reliability=ReliabilityPolicy.RELIABLE)
    infos = []
    sub = probe.node.create_subscription(String, f'{NS}/response/info',
                                         lambda m: infos.append(json.loads(m.data)), deep)
    pub = probe.node.create_publisher(String, f'{NS}/prompt', deep)
    probe.spin_until(lambda: pub.get_subscription_count() > 0 and
                     sub.get_publisher_count() > 0, 20.0, 'flood endpoints matched')
    texts = [f'Flood {i}.' for i in range(300)]
    for text in texts:
        pub.publish(String(data=text))
    probe.spin_until(lambda: len({i['prompt'] for i in infos} & set(texts)) == len(texts),
                     120.0, 'one response/info per prompt')
    mine = [i for i in infos if i['prompt'] in texts]
    assert len(mine) == len(texts) and len({i['request_id'] for i in mine}) == len(texts)
    refused = [i for i in mine if i['finish_reason'] == 'refused']
    assert refused and all('queue full' in i['error'] for i in refused)
    assert len(mine) - len(refused) >= 2, 'some are answered'
    probe.node.destroy_subscription(sub)
    probe.node.destroy_publisher(pub)
    probe.set_params(max_new_tokens=MAX_NEW)
    probe.reset()


def test_a_flood_of_bad_frames_gives_few_short_errors_and_full_counts(probe):
    # Unique 20 KB encoding names and truncations of every length: the reasons differ frame by
    # frame, the kinds of fault do not.  Paced like a fast camera (100 fps at most), so that
    # most frames reach the node's checks.
    probe.set_params(max_new_tokens=2)
    gen = probe.generation()[2]
    rejected0, unsaid0 = int(gen['rejected_images']), int(gen['unsaid_errors'])
    n_err = len(probe.errors)
    t0 = time.monotonic()
    for i in range(400):
        if i % 2:
            msg = Image(width=8, height=6, step=24, encoding=f'{i:05d}' + 'x' * 20000)
            msg.data = array.array('B', bytes(8 * 6 * 3))
        else:
            msg = Image(width=64, height=48, step=64 * 3, encoding='rgb8')
            msg.data = array.array('B', bytes(64 * 48 * 3 - 1 - i))
        probe.pub_image.publish(msg)
        probe.spin_for(0.01)
    probe.spin_for(1.5)
    said = [e for e in probe.errors[n_err:] if e.startswith('image on')]
    seconds = time.monotonic() - t0
    # One message per kind of fault (here two) and second, at most; each one short.
    assert 2 <= len(said) <= 2 * (seconds + 2), (len(said), seconds)
    assert max(map(len, said)) < 500 and not any('x' * 100 in e for e in said)
    # Every refused frame is counted: said on `error`, or only counted (unsaid_errors).

    def counted():
        g = probe.generation()[2]
        return (int(g['rejected_images']) - rejected0, int(g['unsaid_errors']) - unsaid0)

    probe.spin_until(lambda: counted()[0] == len(said) + counted()[1] and counted()[0] > 100,
                     EVENT_TIMEOUT, f'the refusals counted in /diagnostics (said {len(said)})')
    # A frame_id is repeated cut short; the node keeps answering with the image.
    probe.send_image(rgb_to_image(red_disc(), Image, frame_id='f' * 100000))
    info = probe.ask_info('Which frame was that?')
    assert info['image'] is not None and len(info['image']['frame_id']) < 200, info['no_image']
    assert info['text'] is not None
    probe.set_params(max_new_tokens=MAX_NEW)
    probe.reset()


def test_sigterm_shuts_down_cleanly(probe, node):
    failures = [e for e in probe.errors if e.startswith('request failed')]
    assert not failures, f'internal errors while serving: {failures}'
    t0 = time.monotonic()
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=60) == 0
    assert time.monotonic() - t0 < EXIT_WITHIN_S
    log = _log(node)
    assert 'Traceback' not in log, log[-3000:]


@pytest.fixture(scope='module')
def single(tiny_ckpt, tmp_path_factory):
    """A second node: conversation_mode single, a 3 s deadline per answer (a busy CI core)."""
    proc = start_node(tiny_ckpt, SINGLE_NS, tmp_path_factory.mktemp('single'),
                      'conversation_mode:=single', 'max_generation_s:=3.0',
                      f'max_new_tokens:={MAX_NEW}')
    p = connect(proc, SINGLE_NS)
    yield p
    p.close()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0


def test_single_mode_answers_each_prompt_alone(single, reference):
    greedy = SamplingParams(max_tokens=MAX_NEW)
    for text in ('What colour is the shape?', 'And its size?'):
        conv = reference.new_conversation(SYSTEM)
        expected = reference.chat(conv, text, sampling=greedy).text
        reference.reset(conv)
        assert single.ask(text) == expected
    # The system prompt (and the template head) is served from the prefix cache.
    single.spin_until(lambda: single.generation()[2].get('requests') == '2',
                      EVENT_TIMEOUT, 'diagnostics')
    assert int(single.pool()[2]['prefix_hits']) > 0
    # Single mode drops the conversation after each answer; diagnostics may lag one period.
    single.spin_until(lambda: single.pool()[2]['used_blocks'] == '0',
                      EVENT_TIMEOUT, 'used_blocks 0')


def test_two_clients_each_get_their_own_answer(single, reference):
    texts = ('What colour is the shape?', 'Describe the scene in detail.')
    greedy = SamplingParams(max_tokens=MAX_NEW)
    expected = []
    for text in texts:
        conv = reference.new_conversation(SYSTEM)
        expected.append(reference.chat(conv, text, sampling=greedy).text)
        reference.reset(conv)
    assert expected[0] != expected[1]
    cmd = [sys.executable, '-m', 'orin_llm_node.cli.chat']
    clients = [spawn(cmd + ['-n', SINGLE_NS, '--timeout', '120', text], env=ros_env(),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for text in texts]
    outs = [c.communicate(timeout=180) for c in clients]
    for client, (out, err), answer in zip(clients, outs, expected, strict=True):
        assert client.returncode == 0, err[-2000:]
        assert out.rstrip('\n') == answer and 'finish_reason=' in err
    single.spin_until(lambda: {i['prompt'] for i in single.infos} >= set(texts), EVENT_TIMEOUT,
                      'both infos')
    ids = {i['prompt']: i['request_id'] for i in single.infos}
    assert ids[texts[0]] != ids[texts[1]]


def test_max_generation_s_ends_the_answer_with_timeout(single):
    single.set_params(max_new_tokens=100000)
    t0 = time.monotonic()
    assert single.ask('Tell me everything.') is not None
    assert time.monotonic() - t0 < 20.0
    single.spin_until(lambda: single.generation()[2]['last_finish_reason'] == 'timeout',
                      EVENT_TIMEOUT, 'last_finish_reason timeout')
    single.set_params(max_new_tokens=MAX_NEW)


def test_load_failure_exits_non_zero_with_one_fatal_line(tmp_path):
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'config.json').write_text('{}')
    proc = subprocess.run(
        node_command() + ['--ros-args', '-r', '__ns:=/llm_broken', '-p',
                          f'model_path:={broken}'],
        env=ros_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    fatal = [ln for ln in (proc.stdout + proc.stderr).splitlines() if 'FATAL' in ln]
    assert len(fatal) == 1 and 'failed to load the model' in fatal[0], proc.stderr[-2000:]
    assert 'Traceback' not in proc.stdout + proc.stderr


def test_a_model_that_cannot_fit_exits_before_loading_with_one_line(tiny_ckpt, tmp_path):
    """The memory plan refuses before a weight is read (an 8 GB Orin must not be OOM-killed).

    A max_model_len far beyond this machine's memory: one conversation's KV cannot fit.
    """
    proc = subprocess.run(
        node_command() + ['--ros-args', '-r', '__ns:=/llm_no_fit', '-p',
                          f'model_path:={tiny_ckpt}', '-p', 'max_model_len:=4000000000'],
        env=ros_env(), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    fatal = [ln for ln in out.splitlines() if 'FATAL' in ln]
    assert len(fatal) == 1 and 'does not fit in memory' in fatal[0], out[-2000:]
    assert 'max_model_len=' in fatal[0] and 'available (' in fatal[0]
    assert 'loaded in' not in out and 'Traceback' not in out


def test_empty_model_path_is_the_demo_checkpoint_or_a_clear_error(tmp_path, monkeypatch):
    from orin_llm_node import package_files, parameters
    values = {p.name: p.default for p in parameters.PARAMETERS}
    assert parameters.engine_config(values).model_path == package_files.DEMO_MODEL_DIR
    values['model_path'] = str(tmp_path)
    assert parameters.engine_config(values).model_path == tmp_path
    monkeypatch.setattr(package_files, 'DEMO_MODEL_DIR', tmp_path / 'no_demo_model')
    with pytest.raises(ValueError, match='set model_path'):
        parameters.engine_config({**values, 'model_path': ''})


def test_bad_parameter_exits_with_one_line(tmp_path):
    proc = subprocess.run(
        node_command() + ['--ros-args', '-p', 'top_p:=1.5', '-r', '__ns:=/llm_bad_param'],
        env=ros_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(out) == 1 and "'top_p'" in out[0], out


@pytest.mark.parametrize('signals', [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM,)],
                         ids=['two-sigints', 'sigterm'])
def test_a_signal_while_loading_exits_at_once_with_code_0(tiny_ckpt, tmp_path, signals):
    proc = start_node(tiny_ckpt, '/llm_signal', tmp_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while ']: loading ' not in proc.log_path.read_text():
            assert proc.poll() is None, proc.log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, 'never started loading'
            time.sleep(0.02)
        t0 = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.1)
        assert proc.wait(timeout=30) == 0, proc.log_path.read_text()[-2000:]
        assert time.monotonic() - t0 < EXIT_WITHIN_S
    finally:
        stop(proc)


def _handles_sigterm(pid):
    """Whether the process has installed its own SIGTERM handler (main() does so first)."""
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('SigCgt:'):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_signal_while_starting_exits_at_once_with_code_0(tiny_ckpt, tmp_path):
    # Still importing torch and building the node (seconds on a busy CPU): it must not wait
    # for the node to be built only to tear it down.
    proc = start_node(tiny_ckpt, '/llm_signal_start', tmp_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _handles_sigterm(proc.pid):
            assert proc.poll() is None, proc.log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, 'never installed its signal handlers'
            time.sleep(0.005)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.log_path.read_text()[-2000:]
        assert 'Fast DDS profile' not in proc.log_path.read_text(), 'waited for the node'
        assert time.monotonic() - t0 < EXIT_WITHIN_S
    finally:
        stop(proc)
