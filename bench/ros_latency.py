# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: what the ROS layer costs -- image transfer over DDS, conversion, prompt->answer.

1. DDS transfer of a 640x480 rgb8 sensor_msgs/Image (0.92 MB) between two processes on one
   machine: the node's sensor QoS (best effort, keep-last 1) and reliable with Fast DDS's
   defaults, and best effort with an 8 MB shared-memory segment (a profile like
   config/fastdds_large_images.xml, here shared memory only): frames received, one-way latency
   from just before ``publish()`` to the subscriber's callback, the time to build the message
   from a numpy array and the ``publish()`` call itself.  With the defaults, best-effort
   samples larger than the 512 KB shared-memory segment are lost.
2. ``ros_image`` conversion of that frame for a few encodings (what the worker pays per prompt).
3. Prompt -> response through the real node (subprocess) on a tiny random checkpoint on the CPU,
   ``conversation_mode=single``, 16 new tokens: time to the first streamed delta and to the
   full answer, text-only and with a new 640x480 image each time (~300 vision tokens; run with
   the shared-memory profile so that the frames arrive), plus the node's own TTFT and vision
   time from /diagnostics.

Prints JSON on stdout and writes a PNG (default ``bench/results/ros_latency.png``).

    .venv/bin/python bench/ros_latency.py [--frames 60] [--prompts 8] [--out DIR]

Loopback-only discovery and a private ROS_DOMAIN_ID. On a shared CPU the figures move a lot
from run to run; report medians.
"""

import argparse
import array
import json
import os
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

W, H = 640, 480
MAX_NEW_TOKENS = 16


from loopback_env import ros_env  # noqa: E402  (sets the loopback environment before rclpy starts)
import rclpy  # noqa: E402  (after the environment above)
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

QOS = {
    'best_effort': QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                              reliability=ReliabilityPolicy.BEST_EFFORT),
    'reliable': QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                           reliability=ReliabilityPolicy.RELIABLE),
}


def frame():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (H, W, 3), dtype=np.uint8)


def stats(xs):
    xs = sorted(xs)
    if not xs:
        return {}
    return {'n': len(xs), 'median_ms': round(1e3 * statistics.median(xs), 3),
            'p90_ms': round(1e3 * xs[int(0.9 * (len(xs) - 1))], 3),
            'min_ms': round(1e3 * xs[0], 3), 'max_ms': round(1e3 * xs[-1], 3)}


def sink(qos_name, count):
    """Child process: receive images, print one-way latencies (s) as JSON."""
    rclpy.init()
    node = rclpy.create_node('bench_sink')
    got = []
    node.create_subscription(
        Image, '/bench/image',
        lambda m: got.append(time.time_ns() - (m.header.stamp.sec * 10**9
                                               + m.header.stamp.nanosec)),
        QOS[qos_name])
    deadline = time.monotonic() + 20 + 0.1 * count
    last = None
    while len(got) < count and time.monotonic() < deadline:
        n = len(got)
        rclpy.spin_once(node, timeout_sec=0.1)
        if len(got) != n:
            last = time.monotonic()
        elif last is not None and time.monotonic() - last > 3.0:
            break           # the publisher is done (best effort may have dropped some)
    print(json.dumps([g / 1e9 for g in got]))
    node.destroy_node()
    rclpy.try_shutdown()


def transfer(qos_name, count):
    """Publish ``count`` 640x480 rgb8 frames to a sink process; latency, build, publish."""
    child = subprocess.Popen([sys.executable, __file__, '--sink', qos_name, str(count)],
                             env=ros_env(), stdout=subprocess.PIPE, text=True)
    context = rclpy.context.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('bench_source', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    pub = node.create_publisher(Image, '/bench/image', QOS[qos_name])
    deadline = time.monotonic() + 60
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    time.sleep(1.0)
    rgb = frame()
    build, publish = [], []
    for _ in range(count + 5):      # a few extra: best effort may drop one
        t0 = time.perf_counter()
        msg = Image(height=H, width=W, encoding='rgb8', step=W * 3)
        msg.data = array.array('B', rgb.tobytes())
        t1 = time.perf_counter()
        now = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = now // 10**9, now % 10**9
        pub.publish(msg)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        publish.append(t2 - t1)
        time.sleep(0.05)
        if child.poll() is not None:
            break
    out, _ = child.communicate(timeout=120)
    node.destroy_node()
    rclpy.try_shutdown(context=context)
    latencies = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
    return {'one_way': stats(latencies), 'build_msg': stats(build),
            'publish_call': stats(publish), 'bytes': W * H * 3,
            'received': len(latencies), 'sent': len(publish)}, latencies


SHM_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns="http://www.eprosima.com"><profiles>
  <transport_descriptors><transport_descriptor>
    <transport_id>shm_8mb</transport_id><type>SHM</type>
    <segment_size>8388608</segment_size><maxMessageSize>4194304</maxMessageSize>
  </transport_descriptor></transport_descriptors>
  <participant profile_name="bench_shm_only" is_default_profile="true"><rtps>
    <userTransports><transport_id>shm_8mb</transport_id></userTransports>
    <useBuiltinTransports>false</useBuiltinTransports>
  </rtps></participant>
</profiles></dds>
"""


def in_child(args, profile=None):
    """Run this script with ``args`` in a new process; its last stdout line as JSON.

    A fresh process because Fast DDS reads its XML profile once per process.
    """
    env = ros_env()
    if profile is not None:
        # Shared memory only: the bench cannot reach the network whatever the profile says.
        env['FASTDDS_DEFAULT_PROFILES_FILE'] = env['FASTRTPS_DEFAULT_PROFILES_FILE'] = profile
    out = subprocess.run([sys.executable, __file__, *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def conversions(repeat=20):
    from orin_llm_node.ros.cameras import ros_image

    rgb = frame()
    cases = {
        'rgb8': (rgb.tobytes(), 3), 'bgr8': (rgb[..., ::-1].tobytes(), 3),
        'yuv422': (rgb[..., :2].tobytes(), 2), 'bayer_rggb8': (rgb[..., 0].tobytes(), 1),
    }
    out = {}
    for enc, (data, ch) in cases.items():
        msg = Image(height=H, width=W, encoding=enc, step=W * ch)
        msg.data = array.array('B', data)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            ros_image.image_to_rgb(msg)
            times.append(time.perf_counter() - t0)
        out[enc] = stats(times)
    return out


def prompts(count):
    """Prompt -> first delta / full answer through the node process on a tiny checkpoint."""
    from orin_llm_node.cli.chat_client import LLMClient
    from orin_llm_node.ros.cameras.ros_image import rgb_to_image
    from orin_llm_node.testing import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix='bench_ros_')) / 'tiny')
    cmd = [sys.executable, '-m', 'orin_llm_node.ros.main']
    cmd += ['--ros-args', '-r', '__ns:=/bench_llm', '-p', f'model_path:={ckpt}',
            '-p', 'device:=cpu', '-p', f'max_new_tokens:={MAX_NEW_TOKENS}',
            '-p', 'conversation_mode:=single', '-p', 'image_max_age_s:=60.0',
            '-p', 'diagnostics_period_s:=0.2']
    node_proc = subprocess.Popen(cmd, env=ros_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    from diagnostic_msgs.msg import DiagnosticArray

    rclpy.init()
    client = LLMClient('/bench_llm', node_name='bench_client')
    gen = {}
    client.create_subscription(DiagnosticArray, '/diagnostics', lambda m: gen.update(
        {kv.key: kv.value for st in m.status if st.name.endswith('generation')
         for kv in st.values}), 10)
    results = {}
    done = 0
    try:
        t0 = time.monotonic()
        if not client.wait_ready(300):
            raise RuntimeError('node not ready')
        results['start_to_ready_s'] = round(time.monotonic() - t0, 2)
        for label, image in (('text_only', None), ('with_640x480_image', frame())):
            first, full, ttft, vision, stamps = [], [], [], [], set()
            for i in range(count):
                if image is not None:
                    # A new image each time (no vision-cache hit), stamped on receipt.
                    image = image.copy()
                    image[0, 0, 0] = i
                    client.send_image(rgb_to_image(image, Image))
                marks = {}
                client.on_delta = lambda d, m=marks: m.setdefault('first', time.perf_counter())
                t_send = time.perf_counter()
                answer = client.ask(f'Question number {i}: what do you see?', 120)
                t_done = time.perf_counter()
                if answer is None:
                    raise RuntimeError('no answer')
                first.append(marks.get('first', t_done) - t_send)
                full.append(t_done - t_send)
                # Deltas travel on another topic than the answer: let stragglers land first.
                client.spin_until(lambda a=answer: ''.join(client.deltas) == a, 2.0)
                client.on_delta = None
                done += 1
                client.spin_until(lambda n=done: gen.get('requests') == str(n), 5.0)
                ttft.append(float(gen['last_ttft_ms']) / 1e3)
                vision.append(float(gen['last_vision_ms']) / 1e3)
                stamps.add(gen['last_image_stamp'])
            results[label] = {'first_delta': stats(first), 'full_answer': stats(full),
                              'node_ttft': stats(ttft), 'node_vision': stats(vision),
                              'images_used': len(stamps - {'n/a'}),
                              'max_new_tokens': MAX_NEW_TOKENS}
    finally:
        client.destroy_node()
        rclpy.try_shutdown()
        node_proc.send_signal(2)
        node_proc.wait(timeout=30)
    results['node_exit_code'] = node_proc.returncode
    return results


def plot(report, latencies, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, xs in latencies.items():
        a.hist(np.array(xs) * 1e3, bins=30, alpha=0.6, label=f'{name}: {len(xs)} received')
    a.set_xlabel('one-way latency (ms)')
    a.set_title(f'640x480 rgb8 Image between processes ({W * H * 3 / 1e6:.2f} MB)', fontsize=9)
    a.legend(fontsize=7)
    labels, med = [], []
    for key in ('text_only', 'with_640x480_image'):
        for part in ('first_delta', 'full_answer'):
            labels.append(f'{key}\n{part}')
            med.append(report['prompt_to_response'][key][part]['median_ms'])
    b.bar(range(len(med)), med)
    b.set_xticks(range(len(med)), labels, fontsize=7)
    b.set_ylabel('median ms')
    b.set_title(f'prompt -> answer, tiny checkpoint, CPU, {MAX_NEW_TOKENS} tokens')
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == '--sink':
        sink(sys.argv[2], int(sys.argv[3]))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == '--prompts':
        print(json.dumps(prompts(int(sys.argv[2]))))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == '--transfer':
        report, latencies = transfer(sys.argv[2], int(sys.argv[3]))
        print(json.dumps({'report': report, 'latencies': latencies}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--frames', type=int, default=60)
    parser.add_argument('--prompts', type=int, default=8)
    parser.add_argument('--out', type=Path,
                        default=Path(__file__).resolve().parent / 'results')
    opts = parser.parse_args()
    report = {'dds_transfer_640x480_rgb8': {}, 'rmw': os.environ.get('RMW_IMPLEMENTATION',
                                                                     'default')}
    latencies = {}
    with tempfile.NamedTemporaryFile('w', suffix='.xml', delete=False) as f:
        f.write(SHM_PROFILE)
    cases = {'best_effort (Fast DDS defaults)': ('best_effort', None),
             'reliable (Fast DDS defaults)': ('reliable', None),
             'best_effort (8 MB shared-memory segment)': ('best_effort', f.name)}
    for label, (qos_name, profile) in cases.items():
        result = in_child(['--transfer', qos_name, opts.frames], profile)
        report['dds_transfer_640x480_rgb8'][label] = result['report']
        latencies[label] = result['latencies']
    report['ros_image_conversion_640x480'] = conversions()
    # With the shared-memory profile, so that the 640x480 frames reach the node.
    report['prompt_to_response'] = in_child(['--prompts', opts.prompts], f.name)
    os.unlink(f.name)
    png = opts.out / 'ros_latency.png'
    plot(report, latencies, png)
    report['png'] = str(png)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
