# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: what a flood of bad camera frames costs the node.

Starts the node (a subprocess on the embedded demo checkpoint, CPU) and, once it is ready,
publishes two floods of frames that every check refuses:

1. ``--frames`` (default 1200) sensor_msgs/Image frames, each with a unique encoding name of
   ``--encoding-kb`` KB (default 100): the attacker's string is in the refusal's reason;
2. rgb8 frames truncated to a different length each, for ``--seconds`` (default 3.6 s).

It counts the ``error`` messages the node publishes (and their longest and total length), the
bytes the node writes to its log, its resident memory before and after (``VmRSS``) and checks
that it still answers a prompt.  Prints JSON and writes a PNG (default
``bench/results/error_flood.png``).

    .venv/bin/python bench/error_flood.py [--frames 1200] [--encoding-kb 100] [--seconds 3.6]

Loopback-only discovery and a private ROS_DOMAIN_ID.
"""

import argparse
import array
import json
from pathlib import Path
import subprocess
import sys
import tempfile
import time

from loopback_env import ros_env  # noqa: E402  (sets the loopback environment before rclpy starts)
import rclpy  # noqa: E402  (after the environment above)
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from orin_llm_node.cli.chat_client import LLMClient  # noqa: E402

NS = '/bench_flood'
DEEP = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                  reliability=ReliabilityPolicy.RELIABLE)


def rss_mb(pid):
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
    return float('nan')


def frames_with_unique_encodings(count, kb):
    for i in range(count):
        msg = Image(width=8, height=6, step=24)
        msg.encoding = f'{i:06d}' + 'x' * (kb * 1024 - 6)
        msg.data = array.array('B', bytes(8 * 6 * 3))
        yield msg


def truncated_frame(i):
    msg = Image(width=64, height=48, step=64 * 3, encoding='rgb8')
    msg.data = array.array('B', bytes(64 * 48 * 3 - 1 - i % 9000))
    return msg


def flood(opts):
    log_path = Path(tempfile.mkdtemp(prefix='bench_flood_')) / 'node.log'
    cmd = [sys.executable, '-m', 'orin_llm_node.ros.main', '--ros-args', '-r', f'__ns:={NS}',
           '-p', 'device:=cpu', '-p', 'max_new_tokens:=4', '-p', 'image_qos:=reliable']
    with open(log_path, 'w') as log:
        node = subprocess.Popen(cmd, env=ros_env(), stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    client = LLMClient(NS, node_name='bench_flood_client')
    errors = []
    client.on_error = errors.append
    pub = client.create_publisher(Image, f'{NS}/image', DEEP)
    report = {'frames': opts.frames, 'encoding_kb': opts.encoding_kb,
              'truncation_seconds': opts.seconds}
    try:
        if not client.wait_ready(300):
            raise RuntimeError('node not ready:\n' + log_path.read_text()[-2000:])
        client.spin_until(lambda: pub.get_subscription_count() > 0, 20)
        if client.ask('Hello?', 120) is None:
            raise RuntimeError('no answer before the flood')
        client.spin_until(lambda: False, 2.0)
        rss0, log0 = rss_mb(node.pid), log_path.stat().st_size
        errors.clear()
        t0 = time.monotonic()
        # Paced (each frame acknowledged before the next): the node's reader keeps only the
        # newest frame, so an unpaced burst would mostly be dropped before any check runs.
        for msg in frames_with_unique_encodings(opts.frames, opts.encoding_kb):
            pub.publish(msg)
            pub.wait_for_all_acked(rclpy.duration.Duration(seconds=5))
            client.spin_until(lambda: False, 0.002)
        client.spin_until(lambda: False, 2.0)
        report['unique_encodings'] = {
            'seconds': round(time.monotonic() - t0, 2), 'errors': len(errors),
            'longest_error_chars': max(map(len, errors), default=0),
            'error_chars': sum(map(len, errors))}
        errors.clear()
        t0, i = time.monotonic(), 0
        while time.monotonic() - t0 < opts.seconds:
            pub.publish(truncated_frame(i))
            i += 1
            if i % 20 == 0:
                client.spin_until(lambda: False, 0.005)
        client.spin_until(lambda: False, 2.0)
        report['truncated'] = {'frames': i, 'errors': len(errors),
                               'longest_error_chars': max(map(len, errors), default=0)}
        t_ask = time.monotonic()
        info = client.ask_tagged('Still there?', 120)
        report['answers_after_flood'] = info is not None and info.get('text') is not None
        report['answer_after_flood_s'] = round(time.monotonic() - t_ask, 2)
        client.spin_until(lambda: False, 3.0)
        report['rss_mb'] = {'before': round(rss0), 'after': round(rss_mb(node.pid))}
        report['log_bytes_added'] = log_path.stat().st_size - log0
    finally:
        client.destroy_node()
        rclpy.try_shutdown()
        node.send_signal(2)
        node.wait(timeout=30)
    return report


def plot(report, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    parts = [('error messages', [report['unique_encodings']['errors'],
                                 report['truncated']['errors']],
              ['unique encodings', 'truncations']),
             ('log MB added', [report['log_bytes_added'] / 1e6], ['log']),
             ('RSS MB', [report['rss_mb']['before'], report['rss_mb']['after']],
              ['before', 'after'])]
    for ax, (title, values, labels) in zip(axes, parts, strict=True):
        ax.bar(range(len(values)), values)
        ax.set_xticks(range(len(values)), labels, fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"{report['frames']} frames with unique {report['encoding_kb']} KB encodings, "
                 f"then {report['truncated']['frames']} truncated frames", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--frames', type=int, default=1200)
    parser.add_argument('--encoding-kb', type=int, default=100)
    parser.add_argument('--seconds', type=float, default=3.6)
    parser.add_argument('--out', type=Path,
                        default=Path(__file__).resolve().parent / 'results')
    opts = parser.parse_args()
    report = flood(opts)
    png = opts.out / 'error_flood.png'
    plot(report, png)
    report['png'] = str(png)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
