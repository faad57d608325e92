# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``make demo``: start the node on the embedded checkpoint, show it a red circle, ask about it.

    python -m orin_llm_node.cli.demo [--max-new-tokens N] [--timeout S]
    python -m orin_llm_node.cli.demo --save-image shape.png --save-clip frames/

The second form writes the demo's picture (PNG) and a short clip of it (the circle moving left
to right, one PNG per frame) and exits: the files the README's commands send.

Starts the ``orin_llm_node`` executable as a subprocess (``model_path`` empty: the embedded demo
checkpoint, or a tiny random one if none is installed) on a private loopback-only DDS domain,
publishes a sample image (a red circle on a grey background) and the prompt "What colour is the
shape?", prints the streamed answer and the ``kv_block_pool`` diagnostics, stops the node with
Ctrl-C (SIGINT) and exits 0 when all of that worked.
"""

import argparse
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

from orin_llm_node.package_files import share_dir

PROMPT = 'What colour is the shape?'
NAMESPACE = '/orin_llm_demo'


def sample_image(width=320, height=240):
    """A red filled circle on a grey background, as an RGB uint8 array."""
    import cv2
    import numpy as np

    rgb = np.full((height, width, 3), 128, np.uint8)
    cv2.circle(rgb, (width // 2, height // 2), min(width, height) // 4, (255, 0, 0), -1)
    return rgb


def sample_clip(frames=8, width=320, height=240):
    """The red circle moving from left to right across the grey, ``frames`` RGB arrays."""
    import cv2
    import numpy as np

    radius = min(width, height) // 4
    clip = []
    for i in range(frames):
        rgb = np.full((height, width, 3), 128, np.uint8)
        x = radius + round(i * (width - 2 * radius) / max(frames - 1, 1))
        cv2.circle(rgb, (x, height // 2), radius, (255, 0, 0), -1)
        clip.append(rgb)
    return clip


def save_samples(image_path=None, clip_dir=None):
    """Write the picture to ``image_path`` and the clip's frames into ``clip_dir`` (PNG)."""
    import cv2

    if image_path is not None:
        _write_png(cv2, Path(image_path), sample_image())
    if clip_dir is not None:
        for i, rgb in enumerate(sample_clip()):
            _write_png(cv2, Path(clip_dir) / f'frame_{i:02d}.png', rgb)


def _write_png(cv2, path, rgb):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise OSError(f'{path}: could not be written')


def isolated_ros_env(env=None):
    """Loopback-only discovery and a private domain id (nothing leaves this machine)."""
    env = dict(os.environ if env is None else env)
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'   # Jazzy and later
    env['ROS_LOCALHOST_ONLY'] = '1'                      # Humble
    env.setdefault('ORIN_LLM_DEMO_DOMAIN_ID', str(150 + os.getpid() % 80))
    env['ROS_DOMAIN_ID'] = env['ORIN_LLM_DEMO_DOMAIN_ID']
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)      # ROS 2 from PyPI wheels in a venv
    env['PYTHONUNBUFFERED'] = '1'
    return env


def node_command(max_new_tokens):
    """The node, run as a module (whatever console scripts an old install left), and its args."""
    cmd = [sys.executable, '-m', 'orin_llm_node.ros.main']
    config = share_dir() / 'config' / 'orin_llm.yaml'
    cmd += ['--ros-args', '--params-file', str(config), '-r', f'__ns:={NAMESPACE}',
            '-p', f'max_new_tokens:={max_new_tokens}']
    return cmd


def _print_status(status):
    from orin_llm_node.ros.diagnostics import LEVEL_NAMES, level_of
    level = level_of(status)
    name = LEVEL_NAMES.get(level, str(level))
    print(f'  {status.name} [{name}] {status.message}')
    for kv in status.values:
        print(f'    {kv.key:24s} {kv.value}')


def run(max_new_tokens, timeout_s):
    """The demo; returns the exit status."""
    env = isolated_ros_env()
    os.environ.update({k: env[k] for k in ('ROS_AUTOMATIC_DISCOVERY_RANGE', 'ROS_LOCALHOST_ONLY',
                                           'ROS_DOMAIN_ID', 'AMENT_PREFIX_PATH')})
    # rclpy reads the environment above when it starts, so import it only now.
    from diagnostic_msgs.msg import DiagnosticArray
    import rclpy
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import Image

    from orin_llm_node.cli.chat_client import LLMClient
    from orin_llm_node.ros.cameras.ros_image import rgb_to_image

    print(f'[demo] starting the node (ROS_DOMAIN_ID={env["ROS_DOMAIN_ID"]}, loopback only)',
          flush=True)
    node = subprocess.Popen(node_command(max_new_tokens), env=env)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    client = LLMClient(NAMESPACE, node_name='orin_llm_demo')
    pool = {}
    client.create_subscription(
        DiagnosticArray, '/diagnostics',
        lambda m: pool.update({s.name: s for s in m.status if s.name.endswith('kv_block_pool')}),
        10)
    answer = None
    try:
        if not client.spin_until(lambda: node.poll() is not None or (
                client.ready and client.pub_prompt.get_subscription_count() > 0), timeout_s):
            print(f'[demo] the node was not ready after {timeout_s:g} s', file=sys.stderr)
            return 1
        if node.poll() is not None:
            print(f'[demo] the node exited with {node.returncode}', file=sys.stderr)
            return 1
        rgb = sample_image()
        client.send_image(rgb_to_image(rgb, Image, stamp=client.get_clock().now().to_msg(),
                                       frame_id='demo_camera'))
        print(f'[demo] image: {rgb.shape[1]}x{rgb.shape[0]} rgb8, a red circle on grey')
        print(f'[demo] prompt: {PROMPT}')
        print('[demo] answer: ', end='', flush=True)
        client.on_delta = lambda d: print(d, end='', flush=True)
        t0 = time.monotonic()
        answer = client.ask(PROMPT, timeout_s)
        latency = time.monotonic() - t0
        if answer is not None:
            print(client.stream_rest(answer), flush=True)
        else:
            print(flush=True)
        if answer is None:
            print(f'[demo] no answer after {timeout_s:g} s (errors: {client.errors})',
                  file=sys.stderr)
            return 1
        print(f'[demo] prompt -> full answer in {latency:.2f} s')
        pool.clear()
        client.spin_until(lambda: pool, 10.0)
        print('[demo] /diagnostics:')
        for status in pool.values():
            _print_status(status)
    finally:
        client.destroy_node()
        rclpy.try_shutdown()
        if node.poll() is None:
            node.send_signal(signal.SIGINT)          # what Ctrl-C does
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
    if node.returncode != 0:
        print(f'[demo] the node exited with {node.returncode}', file=sys.stderr)
        return 1
    print('[demo] done: the node answered and shut down cleanly')
    return 0


def main(args=None):
    """Entry point (``python -m orin_llm_node.cli.demo``)."""
    parser = argparse.ArgumentParser(prog='python -m orin_llm_node.cli.demo',
                                     description=__doc__.split('\n')[0])
    parser.add_argument('--max-new-tokens', type=int, default=48,
                        help='longest answer (default 48)')
    parser.add_argument('--timeout', type=float, default=600.0,
                        help='seconds to wait for the node and for the answer (default 600)')
    parser.add_argument('--save-image', metavar='PATH',
                        help="write the demo's picture (PNG) and exit, no node started")
    parser.add_argument('--save-clip', metavar='DIR',
                        help='write a clip of it, one PNG per frame, into DIR and exit')
    opts = parser.parse_args(args)
    if opts.save_image or opts.save_clip:
        try:
            save_samples(opts.save_image, opts.save_clip)
        except OSError as exc:
            print(f'[demo] {exc}', file=sys.stderr)
            return 1
        return 0
    try:
        return run(opts.max_new_tokens, opts.timeout)
    except KeyboardInterrupt:
        return 130


if __name__ == '__main__':
    sys.exit(main())
