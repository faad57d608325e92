# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Large camera frames through the node over real loopback DDS: pairing and resident memory.

A 5792x5792 PNG (tens of KB on the wire, 100 MB decoded) due for the video ring is decoded on
an executor thread on arrival, for a second or so; the prompt that follows it must still get
it, and the node's memory must come back after each such frame, whichever thread decoded it.
Budget: ~1-2 min on 2 busy cores.
"""

import array
import time

import pytest

rclpy = pytest.importorskip('rclpy')

from _image_samples import png_bomb, png_header_only, red_disc  # noqa: E402
from _ros_harness import connect, memory_mb, start_node, stop  # noqa: E402
from builtin_interfaces.msg import Time  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_test_image_memory'
SIDE = 5792                 # the largest square under ros_image.MAX_PIXELS
FRAMES = 16
# Resident memory the node may keep after FRAMES such frames and prompts, once nothing is in
# flight: their images at the model's size and the video ring's frames take a few MB; the
# rest is slack for a busy machine.  Before the node limited its malloc arenas and trimmed
# after each large decode it kept 0.5-1 GB here (each executor thread's arena held what it
# had decoded).
KEPT_MB = 300.0


def stamp(msg, ns):
    msg.header.stamp = Time(sec=ns // 10**9, nanosec=ns % 10**9)
    return msg


def stamp_ns(info):
    return info['image']['stamp']['sec'] * 10**9 + info['image']['stamp']['nanosec']


@pytest.fixture(scope='module')
def node(tiny_ckpt, tmp_path_factory):
    proc = start_node(tiny_ckpt, NS, tmp_path_factory.mktemp('node'), 'max_new_tokens:=1')
    yield proc
    stop(proc)


@pytest.fixture(scope='module')
def probe(node):
    p = connect(node, NS)
    yield p
    p.close()


@pytest.fixture(scope='module')
def big_png():
    msg = CompressedImage(format='png')
    msg.data = array.array('B', png_bomb(SIDE, SIDE))
    return msg


def now_ns(probe):
    return probe.node.get_clock().now().nanoseconds


def test_a_frame_that_fails_to_decode_on_arrival_leaves_the_kept_one(probe):
    good = now_ns(probe)
    probe.send_image(probe.image(red_disc(), stamp_ns=good))
    probe.spin_for(0.6)                 # the next frame is due for the video ring (2 fps)
    bad = CompressedImage(format='png')
    bad.data = array.array('B', png_header_only(64, 48))
    probe.expect_error(lambda: probe.send_image(stamp(bad, now_ns(probe))),
                       'could not be decoded')
    info = probe.ask_info('Which frame now?')
    assert info['image'] is not None and stamp_ns(info) == good, info


def test_a_prompt_right_after_a_large_frame_is_paired_with_it(probe, big_png):
    for i in range(2):
        probe.spin_for(0.6)             # due for the video ring: decoded on arrival
        sent = now_ns(probe)
        probe.pub_compressed.publish(stamp(big_png, sent))
        # Long enough for the frame to arrive before the prompt (another topic), far shorter
        # than decoding it takes.
        probe.spin_for(0.15)
        info = probe.ask_info(f'What is it now, {i}?')
        assert info['image'] is not None and stamp_ns(info) == sent, info


def test_memory_comes_back_after_each_large_frame(probe, node, big_png):
    probe.reset()
    probe.spin_for(2.0)
    before = memory_mb(node, 'VmRSS')
    curve = []
    for i in range(FRAMES):
        start = time.monotonic()
        probe.send_image(stamp(big_png, now_ns(probe)))
        info = probe.ask_info(f'And now, {i}?')
        assert info['image'] is not None, info
        curve.append(round(memory_mb(node, 'VmRSS') - before))
        probe.spin_for(max(0.0, 0.6 - (time.monotonic() - start)))    # next one due
    probe.spin_for(2.0)                 # nothing in flight
    kept = memory_mb(node, 'VmRSS') - before
    print(f'\nnode RSS after {FRAMES} {SIDE}x{SIDE} frames: +{kept:.0f} MB once settled '
          f'(from {before:.0f} MB); right after each answer: {curve}')
    assert kept < KEPT_MB, (kept, curve)
