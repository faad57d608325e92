# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Measurement: memory a conversation keeps for its images, through the API and the node.

* API: ``--turns`` turns (default 40), each with a new 1920x1080 frame, in one conversation of
  a tiny checkpoint whose preprocessor allows up to 4096x4096 (Qwen3-VL's own bounds), with
  ``image_max_pixels`` at the node's default 307200. Reported: the bytes of the images the
  conversation holds, and the process RSS added by the turns (after ``gc`` and
  ``malloc_trim``), with the frame size for scale.
* Node (``--node-prompts``, default 30; 0 skips it): the node process on the same checkpoint at
  its defaults, each prompt paired with a new grey 5792x5792 PNG (tens of KB compressed, 100 MB
  decoded); reported: the node's VmRSS once ready, right after every answer (a point may
  catch the video ring still decoding that prompt's frame), settled (2 s after the last
  answer), its peak (VmHWM) when ready and at the end, then after ``reset``; and the prompts
  that went without an image, with the node's reason.

Loopback-only DDS on a private ROS_DOMAIN_ID; every wait is bounded.

    .venv/bin/python bench/image_memory.py [--turns 40] [--node-prompts 30]

Prints JSON and writes ``image_memory.json`` / ``.png`` to ``--out`` (default bench/results).
"""

import argparse
import array
import ctypes
import gc
import json
import os
from pathlib import Path
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from orin_llm_node.testing import tiny_checkpoint  # noqa: E402

NS = '/bench_image_memory'


def rss_mb(pid='self', field='VmRSS'):
    """Resident set size of a process in MB (``VmHWM``: its peak)."""
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f'no {field}')


def trimmed_rss_mb():
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return rss_mb()


def checkpoint(out: Path) -> Path:
    path = tiny_checkpoint.make_tiny_checkpoint(out / 'ckpt')
    tiny_checkpoint.write_preprocessor_config(path, min_pixels=256 * 256,
                                              max_pixels=4096 * 4096)
    return path


def bench_api(ckpt: Path, turns: int) -> dict:
    eng = LLMEngine(EngineConfig(model_path=ckpt, device='cpu', max_model_len=32768,
                                 image_max_pixels=307200, kv_cache_memory_mb=256))
    conv = eng.new_conversation('You are a robot.')
    greedy = SamplingParams(max_tokens=1)
    frame = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    eng.chat(conv, 'warm-up', images=[frame], sampling=greedy)
    eng.reset(conv)
    before = trimmed_rss_mb()
    curve = []
    for turn in range(turns):
        f = frame.copy()
        f[0, 0, 0] = turn
        eng.chat(conv, f'What now, {turn}?', images=[f], sampling=greedy)
        del f
        curve.append(round(trimmed_rss_mb() - before, 1))
    held = [img.rgb for _, img in conv.media_spans()]
    return {
        'turns': turns, 'frame': '1920x1080', 'frame_mb': round(frame.nbytes / 2**20, 2),
        'images_held': len(held),
        'image_held_shape': list(held[0].shape) if held else None,
        'images_held_mb': round(sum(im.nbytes for im in held) / 2**20, 2),
        'rss_added_mb': curve[-1] if curve else 0.0, 'rss_added_mb_per_turn': curve,
    }


def grey_png(width, height):
    """A real grey PNG built row by row (tiny when compressed)."""
    def chunk(kind, body):
        return (struct.pack('>I', len(body)) + kind + body
                + struct.pack('>I', zlib.crc32(kind + body) & 0xffffffff))
    packer = zlib.compressobj(9)
    row = b'\x00' + bytes([128]) * width
    idat = b''.join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 0, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', idat)
            + chunk(b'IEND', b''))


def bench_node(ckpt: Path, prompts: int, log_dir: Path) -> dict:
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1',
               AMENT_PREFIX_PATH=os.environ.get('AMENT_PREFIX_PATH', sys.prefix),
               PYTHONUNBUFFERED='1')
    env.setdefault('ROS_DOMAIN_ID', str(150 + os.getpid() % 50))
    os.environ.update({k: env[k] for k in ('ROS_AUTOMATIC_DISCOVERY_RANGE',
                                           'ROS_LOCALHOST_ONLY', 'ROS_DOMAIN_ID',
                                           'AMENT_PREFIX_PATH')})
    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage
    from std_msgs.msg import Bool, String
    from std_srvs.srv import Trigger

    log = open(log_dir / 'node.log', 'w')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'orin_llm_node.ros.main', '--ros-args', '-r', f'__ns:={NS}',
         '--params-file', str(REPO / 'config/orin_llm.yaml'), '-p', f'model_path:={ckpt}',
         '-p', 'max_new_tokens:=1', '-p', 'image_max_age_s:=60.0',
         '-p', 'max_model_len:=32768', '-p', 'kv_cache_memory_mb:=256.0'],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    n = rclpy.create_node('image_memory_bench')
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    state = {'ready': False, 'infos': []}
    n.create_subscription(Bool, f'{NS}/ready', lambda m: state.update(ready=m.data), latched)
    n.create_subscription(String, f'{NS}/response/info',
                          lambda m: state['infos'].append(json.loads(m.data)), reliable)
    pub_prompt = n.create_publisher(String, f'{NS}/prompt', reliable)
    pub_image = n.create_publisher(CompressedImage, f'{NS}/image/compressed', reliable)
    reset = n.create_client(Trigger, f'{NS}/reset')

    def spin_until(cond, timeout):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError('node did not answer; log: ' + str(log_dir / 'node.log'))
            rclpy.spin_once(n, timeout_sec=0.05)

    try:
        spin_until(lambda: state['ready'] and pub_prompt.get_subscription_count() > 0
                   and pub_image.get_subscription_count() > 0, 180)
        png = grey_png(5792, 5792)
        msg = CompressedImage(format='png')
        msg.data = array.array('B', png)
        ready_mb, ready_peak_mb = rss_mb(proc.pid), rss_mb(proc.pid, 'VmHWM')
        curve = []
        for i in range(prompts):
            pub_image.publish(msg)
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                rclpy.spin_once(n, timeout_sec=0.02)
            count = len(state['infos'])
            pub_prompt.publish(String(data=f'What do you see, {i}?'))
            spin_until(lambda c=count: len(state['infos']) > c, 120)
            curve.append(round(rss_mb(proc.pid), 1))
        # Sampled right after an answer, a point may catch the video ring still decoding that
        # prompt's frame on the camera thread; 2 s later nothing is in flight.
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            rclpy.spin_once(n, timeout_sec=0.05)
        settled_mb = rss_mb(proc.pid)
        reset.wait_for_service(timeout_sec=10)
        future = reset.call_async(Trigger.Request())
        spin_until(future.done, 30)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            rclpy.spin_once(n, timeout_sec=0.05)
        images = sum(1 for i in state['infos'] if i.get('image'))
        missing = {n: i.get('no_image') for n, i in enumerate(state['infos'])
                   if not i.get('image')}
        return {'prompts': prompts, 'png_kb': round(len(png) / 1024, 1),
                'frame': '5792x5792', 'prompts_with_image': images,
                'no_image': missing,
                'rss_ready_mb': round(ready_mb, 1), 'rss_after_mb': curve[-1] if curve else None,
                'rss_settled_mb': round(settled_mb, 1),
                'rss_peak_ready_mb': round(ready_peak_mb, 1),
                'rss_peak_mb': round(rss_mb(proc.pid, 'VmHWM'), 1),
                'rss_after_reset_mb': round(rss_mb(proc.pid), 1), 'rss_mb_per_prompt': curve}
    finally:
        n.destroy_node()
        rclpy.try_shutdown()
        proc.kill()
        proc.wait()
        log.close()


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    api = result['api']
    axes[0].plot(range(1, len(api['rss_added_mb_per_turn']) + 1), api['rss_added_mb_per_turn'],
                 'o-')
    axes[0].set_xlabel('turn (each with a new 1920x1080 frame)')
    axes[0].set_ylabel('RSS added (MB)')
    axes[0].set_title(f"API: images held {api['images_held_mb']} MB")
    node = result.get('node')
    if node:
        axes[1].plot(range(1, len(node['rss_mb_per_prompt']) + 1), node['rss_mb_per_prompt'],
                     'o-')
        axes[1].axhline(node['rss_ready_mb'], ls='--', c='grey', label='ready')
        axes[1].set_xlabel('prompt (each with a new 5792x5792 PNG)')
        axes[1].set_ylabel('node VmRSS (MB)')
        axes[1].legend()
    fig.suptitle('memory held for conversation images')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--turns', type=int, default=40)
    p.add_argument('--node-prompts', type=int, default=30)
    p.add_argument('--out', type=Path, default=REPO / 'bench' / 'results')
    args = p.parse_args(argv)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp))
        result['api'] = bench_api(ckpt, args.turns)
        if args.node_prompts:
            result['node'] = bench_node(ckpt, args.node_prompts, Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / 'image_memory.json').write_text(json.dumps(result, indent=2))
    try:
        plot(result, args.out / 'image_memory.png')
        result['png'] = str(args.out / 'image_memory.png')
    except ImportError as exc:
        print(f'image_memory: no PNG ({exc})', file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
