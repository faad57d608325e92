# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: how long the node takes to exit after Ctrl-C (SIGINT), in every state.

Starts the node (a subprocess, CPU) once per case and repeat, brings it to a state, sends SIGINT
and times the exit (and records the exit code):

* plain node: starting (its signal handlers installed, still importing torch and building the
  node), while loading the weights, during warm-up, ready and idle, during an answer;
* managed node (``--managed``): starting, unconfigured (built and waiting), during
  ``configure`` (loading, then warm-up), active.

The checkpoint is the embedded demo checkpoint (``--model`` names another), so configure takes
several seconds on a CPU.  Prints JSON (per case: exit seconds of each repeat, median, max and
the exit codes) and writes a PNG (default ``bench/results/signal_exit.png``).  The tests keep
wide margins on these times (test_node.py, test_lifecycle.py); this is where they are measured.

    .venv/bin/python bench/signal_exit.py [--repeats 3] [--model DIR]

Loopback-only discovery and a private ROS_DOMAIN_ID.
"""

import argparse
import json
from pathlib import Path
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from loopback_env import ros_env  # noqa: E402  (sets the loopback environment before rclpy starts)
import rclpy  # noqa: E402  (after the environment above)
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402

from orin_llm_node.cli.chat_client import LLMClient  # noqa: E402
from orin_llm_node.package_files import DEMO_MODEL_DIR  # noqa: E402

NS = '/bench_signal'
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                     reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
# case -> (managed, what to wait for before the signal)
CASES = {
    'plain: starting': (False, 'starting'),
    'plain: loading': (False, 'log:]: loading '),
    'plain: warm-up': (False, 'log:]: loaded in '),
    'plain: ready': (False, 'ready'),
    'plain: answering': (False, 'answering'),
    'managed: starting': (True, 'starting'),
    'managed: unconfigured': (True, 'unconfigured'),
    'managed: configure (loading)': (True, 'configure:]: loading '),
    'managed: configure (warm-up)': (True, 'configure:]: loaded in '),
    'managed: active': (True, 'active'),
}


def handles_sigterm(pid):
    """Whether the node's main() has installed its signal handlers (it does so first)."""
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('SigCgt:'):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def one(case, model, log_dir):
    managed, until = CASES[case]
    log_path = log_dir / 'node.log'
    cmd = [sys.executable, '-m', 'orin_llm_node.ros.main'] + (['--managed'] if managed else [])
    cmd += ['--ros-args', '-r', f'__ns:={NS}', '-p', f'model_path:={model or DEMO_MODEL_DIR}',
            '-p', 'device:=cpu',
            '-p', 'max_new_tokens:=100000']
    with open(log_path, 'w') as log:
        node = subprocess.Popen(cmd, env=ros_env(), stdout=log, stderr=subprocess.STDOUT)
    client = LLMClient(NS, node_name='bench_signal_client')
    change = client.create_client(ChangeState, f'{NS}/orin_llm/change_state')
    latched = []
    client.create_subscription(Bool, f'{NS}/ready', latched.append, LATCHED)

    def in_log(text):
        return text in log_path.read_text()

    def transition(tid, wait=True):
        assert change.wait_for_service(timeout_sec=120)
        req = ChangeState.Request()
        req.transition.id = tid
        future = change.call_async(req)
        if wait:
            client.spin_until(future.done, 300)

    try:
        if until.startswith('log:'):
            ok = client.spin_until(lambda: in_log(until[4:]), 300)
        elif until in ('ready', 'answering'):
            ok = client.wait_ready(300)
            if ok and until == 'answering':
                client.pub_prompt.publish(String(data='Tell me a story.'))
                ok = client.spin_until(lambda: client.deltas, 120)
        elif until == 'starting':
            ok = client.spin_until(lambda: handles_sigterm(node.pid), 300)
        elif until == 'unconfigured':            # the latched ready (false) ends __init__
            ok = client.spin_until(lambda: latched, 300)
        elif until.startswith('configure:'):
            transition(Transition.TRANSITION_CONFIGURE, wait=False)
            ok = client.spin_until(lambda: in_log(until[10:]), 300)
        else:                           # active
            transition(Transition.TRANSITION_CONFIGURE)
            transition(Transition.TRANSITION_ACTIVATE)
            ok = client.wait_ready(300)
        if not ok:
            raise RuntimeError(f'{case}: state not reached:\n' + log_path.read_text()[-2000:])
        t0 = time.monotonic()
        node.send_signal(signal.SIGINT)
        code = node.wait(timeout=120)
        return time.monotonic() - t0, code
    finally:
        client.destroy_node()
        if node.poll() is None:
            node.kill()
            node.wait()


def plot(report, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = list(report['cases'])
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, name in enumerate(names):
        xs = report['cases'][name]['exit_s']
        ax.scatter([i] * len(xs), xs, color='tab:blue')
        ax.bar(i, report['cases'][name]['median_s'], color='tab:blue', alpha=0.3)
    ax.axhline(2.0, color='tab:red', linestyle='--', label='2 s')
    ax.set_xticks(range(len(names)), names, rotation=25, ha='right', fontsize=8)
    ax.set_ylabel('SIGINT -> process exit (s)')
    ax.set_title(f"exit after Ctrl-C, {report['model']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--model', default='', help='checkpoint (default: the demo checkpoint)')
    parser.add_argument('--cases', nargs='*', default=list(CASES), choices=list(CASES))
    parser.add_argument('--out', type=Path,
                        default=Path(__file__).resolve().parent / 'results')
    opts = parser.parse_args()
    rclpy.init()
    report = {'model': opts.model or 'demo checkpoint', 'cases': {}}
    try:
        for case in opts.cases:
            times, codes = [], []
            for _ in range(opts.repeats):
                seconds, code = one(case, opts.model, Path(tempfile.mkdtemp(prefix='bench_sig_')))
                times.append(round(seconds, 2))
                codes.append(code)
            report['cases'][case] = {'exit_s': times, 'median_s': statistics.median(times),
                                     'max_s': max(times), 'exit_codes': codes}
            print(case, report['cases'][case], file=sys.stderr, flush=True)
    finally:
        rclpy.try_shutdown()
    png = opts.out / 'signal_exit.png'
    plot(report, png)
    report['png'] = str(png)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
