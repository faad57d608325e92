# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A blind camera is described as it was seen: stopped after delivering, or never delivered.

A node process at its defaults (its own Fast DDS profile) with three cameras over real loopback
DDS, played by this process: ``stopped`` -- a reliable camera whose 9 KB frames arrived, then
stopped; ``quiet`` -- a reliable publisher that never sends; ``lossy`` -- a best-effort one that
never sends.  Only the cameras whose frames never arrived get transport advice, fitted to
their QoS.  The branches this set-up cannot reach (no own profile, ``image_qos: reliable``) are
checked on :class:`BlindWatch` itself.  Budget: ~30 s on 2 busy cores.
"""

import subprocess

from child_processes import spawn
import numpy as np
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import EVENT_TIMEOUT, START_TIMEOUT, Probe, defaults_env, node_command, stop  # noqa: E402
from rclpy.qos import QoSProfile, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from orin_llm_node.ros.cameras.blind_camera import BLIND_AFTER_S, BlindWatch  # noqa: E402

NS = '/camera_blind_test'
FRAME = np.full((48, 64, 3), 90, np.uint8)            # 9216 bytes of rgb8: 9 KB


@pytest.fixture(scope='module')
def probe(tmp_path_factory):
    log_path = tmp_path_factory.mktemp('blind') / 'node.log'
    with open(log_path, 'w') as log:
        proc = spawn(
            node_command() + ['--ros-args', '-r', f'__ns:={NS}',
                              '-p', 'image_topics:=[stopped, quiet, lossy]'],
            env=defaults_env(), stdout=log, stderr=subprocess.STDOUT)
    p = Probe(NS)
    try:
        p.spin_until(lambda: p.ready or proc.poll() is not None, START_TIMEOUT, 'ready')
        assert proc.poll() is None, log_path.read_text()[-3000:]
        yield p
    finally:
        p.close()
        stop(proc)


@pytest.mark.ros
def test_a_stopped_camera_and_a_camera_never_heard_are_told_apart(probe):
    node = probe.node
    stopped = node.create_publisher(Image, f'{NS}/stopped', QoSProfile(depth=10))
    quiet = node.create_publisher(Image, f'{NS}/quiet', QoSProfile(depth=10))
    lossy = node.create_publisher(Image, f'{NS}/lossy', qos_profile_sensor_data)
    probe.spin_until(lambda: all(p.get_subscription_count() > 0 for p in (stopped, quiet, lossy)),
                     EVENT_TIMEOUT, 'the three cameras matched')
    for _ in range(15):                     # 1.5 s of a 10 Hz camera, then it stops
        stopped.publish(probe.image(FRAME, stamp_ns=node.get_clock().now().nanoseconds))
        probe.spin_for(0.1)

    def said(camera):
        return [e for e in probe.errors if e.startswith('blind:') and f'{NS}/{camera}' in e]

    probe.spin_until(lambda: all(said(c) for c in ('stopped', 'quiet', 'lossy')),
                     BLIND_AFTER_S + EVENT_TIMEOUT, 'a blind message per camera')
    [text] = said('stopped')
    assert text.startswith(f'blind: frames stopped arriving on {NS}/stopped '), text
    assert '(the last of 9 KB) and 1 publisher (reliable) is still there' in text, text
    assert f'stopped publishing or stalled (check: ros2 topic hz {NS}/stopped)' in text, text
    for advice in ('512 KB', 'Fast DDS', 'UDP', 'Fix:'):
        assert advice not in text, text
    [text] = said('quiet')
    assert text.startswith(f'blind: 1 publisher (reliable) on {NS}/quiet for '), text
    assert 'none of its frames arrived' in text and 'published nothing since it matched' in text
    assert '512 KB' not in text and 'UDP' not in text, text
    [text] = said('lossy')
    assert text.startswith(f'blind: 1 publisher (best effort) on {NS}/lossy for '), text
    assert 'over UDP' in text and 'net.core.rmem_max' in text and '512 KB' not in text, text
    probe.spin_until(lambda: probe.generation()[2].get('camera') == 'blind', EVENT_TIMEOUT,
                     'camera blind in /diagnostics')


def test_the_advice_fits_the_qos_and_the_transport():
    def blind(publishers, image_qos='auto', own_profile=True):
        watch = BlindWatch()
        assert watch.check(0.0, publishers, image_qos, own_profile) is None
        return watch.check(BLIND_AFTER_S, publishers, image_qos, own_profile)

    best_effort = [('/front', False)]
    text = blind(best_effort, own_profile=False)        # the user's own Fast DDS profile
    assert 'larger than 512 KB are lost by Fast DDS shared memory' in text, text
    assert 'start the node without FASTDDS_DEFAULT_PROFILES_FILE' in text, text
    text = blind(best_effort, image_qos='reliable')
    assert "cannot match this node's reliable image subscriptions" in text, text
    text = blind([('/front', True)], image_qos='best_effort', own_profile=False)
    assert '512 KB' in text, 'a reliable camera read best effort is delivered best effort'
    text = blind([('/front', True), ('/front', True), ('/front/compressed', False)])
    assert text.startswith('blind: 3 publishers (2 reliable, 1 best effort) on /front and '
                           '/front/compressed for 5 s'), text


def test_a_camera_is_said_blind_once_and_a_new_publisher_starts_afresh():
    watch, one = BlindWatch(), [('/front', True)]
    assert watch.frame(0.5, 9216, '/front') is False      # arrived before the first check
    assert watch.check(1.0, one, 'auto', True) is None
    said = watch.check(0.5 + BLIND_AFTER_S, one, 'auto', True)
    assert said.startswith('blind: frames stopped arriving on /front 5 s ago'), said
    assert watch.check(20.0, one, 'auto', True) is None, 'said once'
    assert watch.frame(21.0, 300, '/front') is True and watch.blind == ''
    assert watch.check(22.0, [], 'auto', True) is None      # the camera went away
    assert watch.check(23.0, one, 'auto', True) is None     # another one came, sends nothing
    said = watch.check(23.0 + BLIND_AFTER_S, one, 'auto', True)
    assert 'none of its frames arrived' in said, said
