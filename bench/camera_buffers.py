# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Measurement: memory of one camera's video ring (ros/frame_ring.py) over a long stream.

For each camera resolution a 30 Hz stream of ``--minutes`` minutes of stamped frames goes
through the ring object exactly as the node's intake drives it (only frames due at
``video_fps`` are "decoded" and resized to the size the model sees, by the Qwen3-VL processors
at the node's default ``image_max_pixels``); the bytes held are sampled every simulated
second, Python's traced allocations (numpy's included) every minute, and the time to resize a
kept frame is measured.  No ROS needed.  Prints JSON and writes ``camera_buffers.json`` /
``.png`` to ``--out`` (default bench/results).

    .venv/bin/python bench/camera_buffers.py [--minutes 10] [--fps 2] [--seconds 8]
"""

import argparse
import json
from pathlib import Path
import sys
import time
import tracemalloc

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orin_llm_node.parameters import PARAMS_BY_NAME  # noqa: E402
from orin_llm_node.processing.image import ImageProcessor  # noqa: E402
from orin_llm_node.ros.cameras.frame_ring import FrameRing, FrameSizer, resize_for_model  # noqa: E402

CAMERA_HZ = 30
RESOLUTIONS = ((640, 480), (1280, 720), (1920, 1080))


def sizer():
    """The node's frame sizer for a Qwen3-VL checkpoint at the default image_max_pixels."""
    image = ImageProcessor().capped(PARAMS_BY_NAME['image_max_pixels'].default)
    try:
        from orin_llm_node.processing.video import VideoProcessor
        video = VideoProcessor()
    except ImportError:                 # an engine without video: image sizes only
        video = None
    return FrameSizer(image, video)


def run(width, height, minutes, fps, seconds, frame_sizer):
    """One camera: bytes held per simulated second, traced memory per minute, resize times."""
    ring = FrameRing(fps, seconds)
    full = np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8)
    # The samples live in arrays allocated up front: the traced memory is the ring's alone.
    resize_s = np.zeros(int(minutes * 60 * fps) + 2)
    held = np.zeros(minutes * 60, np.int64)
    traced = np.zeros(minutes, np.int64)
    kept = [0]

    def decode_and_resize():
        decoded = full.copy()           # a decoder hands over a fresh array per frame
        t0 = time.perf_counter()
        out = resize_for_model(decoded, frame_sizer)
        resize_s[kept[0]] = time.perf_counter() - t0
        kept[0] += 1
        return out

    period = 1_000_000_000 // CAMERA_HZ
    tracemalloc.start()
    try:
        for i in range(minutes * 60 * CAMERA_HZ):
            ring.offer(i * period, decode_and_resize)
            if i % CAMERA_HZ == CAMERA_HZ - 1:
                held[i // CAMERA_HZ] = ring.nbytes
            if i % (60 * CAMERA_HZ) == 60 * CAMERA_HZ - 1:
                traced[i // (60 * CAMERA_HZ)] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    resize_s, held, traced = resize_s[:kept[0]], held.tolist(), traced.tolist()
    h, w = ring.frame_shape[:2]
    return {'camera': f'{width}x{height}', 'kept_size': f'{w}x{h}',
            'frame_bytes': h * w * 3, 'full_frame_bytes': width * height * 3,
            'capacity_frames': ring.capacity, 'frames_offered': minutes * 60 * CAMERA_HZ,
            'frames_decoded': len(resize_s), 'limit_bytes': ring.limit_bytes(h, w),
            'held_bytes_final': held[-1], 'held_bytes_max': max(held),
            'held_bytes_per_s': held,
            'traced_bytes_per_min': traced,
            'traced_growth_after_min1_bytes': max(traced) - traced[0],
            'resize_ms_median': round(1000 * float(np.median(resize_s)), 3)}


def plot(result, path):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for cam in result['cameras']:
        held = np.asarray(cam['held_bytes_per_s']) / 2**20
        axes[0].plot(np.arange(1, len(held) + 1), held,
                     label=f"{cam['camera']} (kept {cam['kept_size']})")
        traced = np.asarray(cam['traced_bytes_per_min']) / 2**20
        axes[1].plot(np.arange(1, len(traced) + 1), traced, 'o-', label=cam['camera'])
    axes[0].set_xscale('log')
    axes[0].set_xlabel('simulated seconds of a 30 Hz camera')
    axes[0].set_ylabel('ring pixels held (MiB)')
    axes[0].legend()
    axes[1].set_xlabel('simulated minute')
    axes[1].set_ylabel('Python traced memory (MiB)')
    axes[1].legend()
    fig.suptitle(f"one camera's video ring: video_fps {result['video_fps']:g}, "
                 f"video_buffer_s {result['video_buffer_s']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--minutes', type=int, default=10)
    p.add_argument('--fps', type=float, default=PARAMS_BY_NAME['video_fps'].default)
    p.add_argument('--seconds', type=float, default=PARAMS_BY_NAME['video_buffer_s'].default)
    p.add_argument('--out', type=Path, default=REPO / 'bench' / 'results')
    args = p.parse_args(argv)
    frame_sizer = sizer()
    result = {'video_fps': args.fps, 'video_buffer_s': args.seconds, 'camera_hz': CAMERA_HZ,
              'minutes': args.minutes, 'video_processor': frame_sizer.video is not None,
              'cameras': [run(w, h, args.minutes, args.fps, args.seconds, frame_sizer)
                          for w, h in RESOLUTIONS]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / 'camera_buffers.json').write_text(json.dumps(result, indent=2))
    try:
        plot(result, args.out / 'camera_buffers.png')
        result['png'] = str(args.out / 'camera_buffers.png')
    except ImportError as exc:
        print(f'camera_buffers: no PNG ({exc})', file=sys.stderr)
    brief = {k: v for k, v in result.items() if k != 'cameras'}
    brief['cameras'] = [{k: v for k, v in c.items() if not k.endswith(('_per_s', '_per_min'))}
                        for c in result['cameras']]
    print(json.dumps(brief, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
