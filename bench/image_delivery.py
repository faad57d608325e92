# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Measurement: which Fast DDS set-up delivers camera-sized frames between two processes.

For every combination of

* frame size (640x480 and 1280x720 rgb8: 0.92 / 2.76 MB),
* publisher QoS at a camera driver's defaults: sensor data (best effort, depth 5) or the
  rclpy default (reliable, depth 10),
* subscriber QoS: best effort or reliable, depth 1 (the node's image subscriptions),
* which side loads the project's profile (``config/fastdds_large_images.xml``): neither, the
  publisher only, the subscriber only, both -- or ``node``: the subscriber has the profile the
  node gives itself (``orin_llm_node/ros/dds_profiles/loopback.xml``), the publisher none,

a publisher process sends ``--frames`` frames at 10 Hz to a subscriber process and the number
received is reported (JSON on stdout).  A fresh process pair per combination because Fast DDS
reads its XML profile once per process.  Loopback-only discovery and a private ROS_DOMAIN_ID;
every process ends by itself (bounded waits).

    .venv/bin/python bench/image_delivery.py [--frames 10] [--sizes 640x480,1280x720]
"""

import argparse
import array
import itertools
import json
import os
from pathlib import Path
import subprocess
import sys
import time

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orin_llm_node.ros.dds_profile import PROFILE_VARIABLES, profile_path  # noqa: E402

PROFILE = REPO / 'config' / 'fastdds_large_images.xml'
# The profile the node gives itself under this bench's loopback-only discovery.
NODE_PROFILE = profile_path({'ROS_LOCALHOST_ONLY': '1'})
TOPIC = '/bench/delivery'


def ros_env(profile):
    """The loopback-only environment, with ``profile`` (a path, or None) for Fast DDS."""
    env = {k: v for k, v in os.environ.items() if k not in PROFILE_VARIABLES}
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1',
               AMENT_PREFIX_PATH=os.environ.get('AMENT_PREFIX_PATH', sys.prefix),
               PYTHONUNBUFFERED='1')
    env.setdefault('ROS_DOMAIN_ID', str(150 + os.getpid() % 50))
    if profile:
        env['FASTDDS_DEFAULT_PROFILES_FILE'] = str(profile)
    return env


def qos(name):
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    return {
        'sensor_data': qos_profile_sensor_data,
        'default_reliable': QoSProfile(depth=10),
        'best_effort_1': QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                                    reliability=ReliabilityPolicy.BEST_EFFORT),
        'reliable_1': QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                                 reliability=ReliabilityPolicy.RELIABLE),
    }[name]


def run_sub(qos_name, frames):
    import rclpy
    from sensor_msgs.msg import Image
    rclpy.init()
    node = rclpy.create_node('delivery_sub')
    got = []
    node.create_subscription(Image, TOPIC, lambda m: got.append(len(m.data)), qos(qos_name))
    deadline = time.monotonic() + 30.0
    matched_at = None
    while time.monotonic() < deadline and len(got) < frames:
        rclpy.spin_once(node, timeout_sec=0.05)
        if matched_at is None and node.count_publishers(TOPIC) > 0:
            matched_at = time.monotonic()
            deadline = min(deadline, matched_at + 4.0 + 0.1 * frames)
    print(json.dumps({'received': len(got)}))
    node.destroy_node()
    rclpy.try_shutdown()


def run_pub(qos_name, frames, width, height):
    import rclpy
    from sensor_msgs.msg import Image
    rclpy.init()
    node = rclpy.create_node('delivery_pub')
    pub = node.create_publisher(Image, TOPIC, qos(qos_name))
    deadline = time.monotonic() + 20.0
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    matched = pub.get_subscription_count() > 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.05)
    msg = Image(height=height, width=width, encoding='rgb8', step=width * 3)
    msg.data = array.array('B', bytes(width * height * 3))
    for _ in range(frames):
        pub.publish(msg)
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.02)
    end = time.monotonic() + 2.0           # reliable: let retransmissions finish
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.05)
    print(json.dumps({'matched': matched}))
    node.destroy_node()
    rclpy.try_shutdown()


def combination(size, pub_qos, sub_qos, profile_side, frames):
    width, height = map(int, size.split('x'))
    me = [sys.executable, __file__]
    sub = subprocess.Popen(me + ['--sub', sub_qos, str(frames)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env=ros_env(NODE_PROFILE if profile_side == 'node' else
                                       PROFILE if profile_side in ('subscriber', 'both')
                                       else None))
    pub = subprocess.Popen(me + ['--pub', pub_qos, str(frames), str(width), str(height)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=ros_env(PROFILE if profile_side in ('publisher', 'both')
                                       else None))
    try:
        sub_out, sub_err = sub.communicate(timeout=60)
        pub_out, pub_err = pub.communicate(timeout=60)
    finally:
        for proc in (sub, pub):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    row = {'size': size, 'publisher_qos': pub_qos, 'subscriber_qos': sub_qos,
           'profile_on': profile_side, 'sent': frames}
    try:
        row.update(json.loads(sub_out.strip().splitlines()[-1]))
        row.update(json.loads(pub_out.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        row['failure'] = (sub_err + pub_err)[-500:]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--frames', type=int, default=10)
    parser.add_argument('--sizes', default='640x480,1280x720')
    parser.add_argument('--sides', default='none,publisher,subscriber,both,node')
    parser.add_argument('--sub', nargs=2, help=argparse.SUPPRESS)
    parser.add_argument('--pub', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sub:
        return run_sub(args.sub[0], int(args.sub[1]))
    if args.pub:
        return run_pub(args.pub[0], *map(int, args.pub[1:]))
    rows = []
    for size, pub_qos, sub_qos, side in itertools.product(
            args.sizes.split(','), ('sensor_data', 'default_reliable'),
            ('best_effort_1', 'reliable_1'), args.sides.split(',')):
        if pub_qos == 'sensor_data' and sub_qos == 'reliable_1':
            continue                    # incompatible QoS: never matches
        row = combination(size, pub_qos, sub_qos, side, args.frames)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print(json.dumps({'frames_per_combination': args.frames, 'results': rows}, indent=1))


if __name__ == '__main__':
    main()
