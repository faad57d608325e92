# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A camera at its defaults over real loopback DDS: the node at *its* defaults sees the frames.

The node runs as its own process with nothing but a namespace (the embedded demo checkpoint,
the package's parameter defaults, its own Fast DDS profile); this process plays the camera with
publishers at rclpy's defaults -- sensor data (best effort) and plain reliable -- sending 640x480
and 1280x720 rgb8 frames, and with no Fast DDS profile of its own.  The demo checkpoint names the
colour of a shape, so an answer that used the image says the frame's colour.  Also: the node says
when it is blind, and ``orin_llm_chat --image`` answers from BMP and PNG files, judges by the
answer (not by a late DDS acknowledgement) whether the node used its image, and fails loudly
when the node's image topic is remapped away.  Budget: ~1-2 min on 2 busy cores.
"""

import os
import subprocess
import sys
import time

from child_processes import spawn
import cv2
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import EVENT_TIMEOUT, connect, defaults_env, node_command, stop  # noqa: E402
from rclpy.qos import QoSProfile, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from orin_llm_node.cli.chat import _image_verdict  # noqa: E402
from orin_llm_node.cli.chat_client import image_message  # noqa: E402
from orin_llm_node.ros.cameras.blind_camera import BLIND_AFTER_S  # noqa: E402
from orin_llm_node.ros.dds_profile import PROFILE_VARIABLES  # noqa: E402
from orin_llm_node.testing.shapes import simple_scene  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/camera_test'
REMAPPED_NS = '/camera_test_remapped'
QUESTION = 'What colour is the shape?'


def start(ns, log_path, *ros_args):
    with open(log_path, 'w') as log:
        proc = spawn(node_command() + ['--ros-args', '-r', f'__ns:={ns}', *ros_args],
                                env=defaults_env(), stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


@pytest.fixture(scope='module')
def nodes(tmp_path_factory):
    """The node at its defaults, and one whose image topics are remapped away (both loading)."""
    logs = tmp_path_factory.mktemp('camera')
    for var in PROFILE_VARIABLES:
        assert var not in os.environ, f'{var} is set: the test would not run at the defaults'
    node = start(NS, logs / 'node.log')
    # Its own node name: both publish on /diagnostics, named after the node.
    remapped = start(REMAPPED_NS, logs / 'remapped.log', '-r', '__node:=orin_llm_remapped',
                     '-r', 'image:=/nowhere/image',
                     '-r', 'image/compressed:=/nowhere/image/compressed')
    yield node, remapped
    stop(node)
    stop(remapped)


@pytest.fixture(scope='module')
def probe(nodes):
    p = connect(nodes[0], NS)
    yield p
    p.close()


def frame(rgb, probe):
    return probe.image(rgb, stamp_ns=probe.node.get_clock().now().nanoseconds)


def ask_while_streaming(probe, pub, rgb, text=QUESTION, timeout=90.0):
    """Publish frames at 5 Hz like a camera; ask once frames flowed 1 s; the prompt's info."""
    n_info = len(probe.infos)
    start, asked = time.monotonic(), False
    while True:
        pub.publish(frame(rgb, probe))
        probe.spin_for(0.2)
        if not asked and time.monotonic() - start > 1.0:
            probe.pub_prompt.publish(String(data=text))
            asked = True
        mine = [i for i in probe.infos[n_info:] if i['prompt'] == text]
        if mine:
            return mine[0]
        assert time.monotonic() - start < timeout, 'no answer while streaming frames'


def test_node_says_when_it_is_blind(probe, nodes):
    # The probe's image publishers are matched and have sent nothing: that is what a camera
    # whose frames never arrive looks like from the node.
    assert 'Fast DDS profile' in nodes[0].log_path.read_text()
    probe.spin_until(lambda: any(e.startswith('blind:') for e in probe.errors),
                     BLIND_AFTER_S + 10.0, 'the blind message on error')
    blind = [e for e in probe.errors if e.startswith('blind:')]
    assert len(blind) == 1 and f'{NS}/image' in blind[0], blind
    # Reliable publishers that sent nothing: no transport advice, the camera is not sending.
    assert 'none of its frames arrived' in blind[0] and '512 KB' not in blind[0], blind
    probe.spin_until(lambda: probe.generation()[2].get('camera') == 'blind', EVENT_TIMEOUT,
                     'camera blind in /diagnostics')
    level, message, _ = probe.generation()
    assert level == 1 and 'blind' in message
    probe.send_image(frame(simple_scene('circle', 'red', 64, 64).image, probe))
    probe.spin_until(lambda: probe.generation()[2].get('camera') == 'ok', EVENT_TIMEOUT,
                     'camera ok once a frame arrived')
    assert len([e for e in probe.errors if e.startswith('blind:')]) == 1, 'said once'


@pytest.mark.parametrize('width,height,qos_name,kind,colour', [
    (640, 480, 'sensor_data', 'circle', 'red'),
    (1280, 720, 'sensor_data', 'square', 'blue'),
    (640, 480, 'default_reliable', 'square', 'green'),
    (1280, 720, 'default_reliable', 'circle', 'yellow'),
])
def test_camera_frames_at_publisher_defaults_are_seen(probe, width, height, qos_name, kind,
                                                      colour):
    probe.reset()
    qos = qos_profile_sensor_data if qos_name == 'sensor_data' else QoSProfile(depth=10)
    pub = probe.node.create_publisher(Image, f'{NS}/image', qos)
    try:
        probe.spin_until(lambda: pub.get_subscription_count() > 0, 20.0, 'the node matched')
        info = ask_while_streaming(probe, pub, simple_scene(kind, colour, height, width).image)
    finally:
        probe.node.destroy_publisher(pub)
    assert info['image'] is not None, f'answered without the frame: {info}'
    assert info['finish_reason'] == 'stop' and info['text'] == f'{colour}.', info


def chat(ns, *args, timeout=180):
    cmd = [sys.executable, '-m', 'orin_llm_node.cli.chat']
    return subprocess.run(cmd + ['-n', ns, '--timeout', '120', *args], env=defaults_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize('suffix,kind,colour', [('.bmp', 'circle', 'blue'),
                                                ('.png', 'square', 'red')])
def test_chat_client_image_files_are_answered_from_the_image(probe, tmp_path, suffix, kind,
                                                              colour):
    probe.reset()
    path = tmp_path / f'shape{suffix}'
    rgb = simple_scene(kind, colour, 480, 640).image
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert image_message(path).format == 'png'          # BMP re-encoded, PNG as it is
    out = chat(NS, '--image', str(path), QUESTION)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f'{colour}.'
    assert 'finish_reason=stop' in out.stderr


def test_chat_client_fails_when_the_answer_did_without_its_image(probe, tmp_path):
    path = tmp_path / 'sliver.png'                  # aspect ratio 300: refused on arrival
    assert cv2.imwrite(str(path), simple_scene('circle', 'red', 1, 300).image)
    out = chat(NS, '--image', str(path), QUESTION)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'WITHOUT your image' in out.stderr and 'aspect ratio 300.0' in out.stderr
    assert out.stdout.strip(), 'the (text-only) answer is still printed'


# The client as a user runs it, except that no DDS acknowledgement ever comes in time (what a
# loaded machine does now and then: an acknowledgement can lag the data by a heartbeat period).
LATE_ACKS = ('import sys, time; from rclpy.publisher import Publisher; '
             'Publisher.wait_for_all_acked = lambda self, timeout=None: time.sleep(0.5) or False; '
             'from orin_llm_node.cli.chat import main; sys.exit(main())')


def test_chat_client_judges_the_image_by_the_answer_not_by_the_acknowledgement(probe,
                                                                             tmp_path):
    probe.reset()
    path = tmp_path / 'shape.png'
    assert cv2.imwrite(str(path), cv2.cvtColor(simple_scene('circle', 'red', 480, 640).image,
                                               cv2.COLOR_RGB2BGR))
    cmd = [sys.executable, '-c', LATE_ACKS, '-n', NS, '--timeout', '120', '--image', str(path),
           QUESTION]
    out = subprocess.run(cmd, env=defaults_env(), capture_output=True, text=True, timeout=240)
    assert 'remapped' not in out.stderr, out.stderr[-2000:]
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == 'red.'


def test_chat_client_fails_when_the_image_topic_is_remapped_away(nodes, tmp_path):
    path = tmp_path / 'shape.png'
    assert cv2.imwrite(str(path), simple_scene('circle', 'red', 480, 640).image)
    out = chat(REMAPPED_NS, '--image', str(path), QUESTION)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'remapped' in out.stderr and f'{REMAPPED_NS}/image/compressed' in out.stderr
    assert nodes[1].poll() is None, 'the remapped node keeps running'


def test_image_verdict_names_an_answer_without_its_image():
    msg = image_message_stub('orin_llm_chat_1_2')
    ours = {'stamp': {'sec': 5, 'nanosec': 7}, 'frame_id': 'orin_llm_chat_1_2', 'stamped': False}
    assert _image_verdict({'image': ours}, msg) is None
    other = dict(ours, frame_id='camera')
    assert 'another image' in _image_verdict({'image': other}, msg)
    assert 'too old' in _image_verdict({'image': None, 'no_image': 'too old'}, msg)
    assert _image_verdict({'image': None, 'no_image': None}, msg)


def image_message_stub(frame_id):
    from sensor_msgs.msg import CompressedImage
    msg = CompressedImage()
    msg.header.frame_id = frame_id
    return msg
