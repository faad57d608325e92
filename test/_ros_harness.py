# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS process harness of the node tests: a node process and the test's side of its wire.

:func:`start_node` runs the node (``python -m orin_llm_node.ros.main``) on a checkpoint with
the repository's YAML, :class:`Probe` is the test's rclpy node (publishers, subscriptions and
service clients of the node's topics; :class:`JsonProbe` adds ``prompt/json`` requests matched
by their tag), :func:`connect` waits until the node is ready and
matched.  Every process gets this session's loopback-only domain (:func:`ros_env`, from
conftest.py).
"""

import array
import json
import os
from pathlib import Path
import subprocess
import sys
import time

from builtin_interfaces.msg import Time
from child_processes import spawn
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from orin_llm_node.ros.dds_profile import PROFILE_VARIABLES
from orin_llm_node.ros.diagnostics import level_of

REPO = Path(__file__).resolve().parents[1]
SYSTEM = 'You are a test robot.'
START_TIMEOUT = 120.0
ANSWER_TIMEOUT = 60.0
# Waits for what normally takes well under a second (a diagnostics period, a latched flag):
# wide, so that a loaded machine cannot break them; a wait costs this long only when it fails.
EVENT_TIMEOUT = 30.0
# Ctrl-C ends the node within 2 s (bench/signal_exit.py measures it, e.g. 0.1-1.2 s); tests
# allow five times that, and still far less than what they guard against (a whole load).
EXIT_WITHIN_S = 10.0

RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=50,
                      reliability=ReliabilityPolicy.RELIABLE)
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                     reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
STREAM = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                    reliability=ReliabilityPolicy.RELIABLE)


def ros_env():
    """The environment of a node or client process: this session's loopback-only domain."""
    env = dict(os.environ)
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1',
               ROS_DOMAIN_ID=os.environ['ROS_DOMAIN_ID'],
               AMENT_PREFIX_PATH=os.environ.get('AMENT_PREFIX_PATH', sys.prefix),
               PYTHONUNBUFFERED='1')
    return env


def node_command():
    """The node, run as a module (whatever console scripts an old install left)."""
    return [sys.executable, '-m', 'orin_llm_node.ros.main']


class Probe:
    """The test's side of the wire: publishers, subscriptions, services of the node."""

    def __init__(self, ns):
        self.context = rclpy.context.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node('orin_llm_probe', context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        n = self.node
        self.ready = None
        self.responses, self.deltas, self.errors, self.infos = [], [], [], []
        self.diag = {}                  # status name -> (level, message, {key: value})
        self.diag_log = []
        self.pub_prompt = n.create_publisher(String, f'{ns}/prompt', RELIABLE)
        self.pub_image = n.create_publisher(Image, f'{ns}/image', RELIABLE)
        self.pub_compressed = n.create_publisher(CompressedImage, f'{ns}/image/compressed',
                                                 RELIABLE)
        self.pub_clock = n.create_publisher(Clock, '/clock', RELIABLE)
        n.create_subscription(Bool, f'{ns}/ready', self._on_ready, LATCHED)
        n.create_subscription(String, f'{ns}/response', lambda m: self.responses.append(m.data),
                              RELIABLE)
        n.create_subscription(String, f'{ns}/response/stream',
                              lambda m: self.deltas.append(m.data), STREAM)
        n.create_subscription(String, f'{ns}/error', lambda m: self.errors.append(m.data),
                              RELIABLE)
        n.create_subscription(String, f'{ns}/response/info',
                              lambda m: self.infos.append(json.loads(m.data)), RELIABLE)
        n.create_subscription(DiagnosticArray, '/diagnostics', self._on_diag, RELIABLE)
        self.reset_client = n.create_client(Trigger, f'{ns}/reset')
        self.cancel_client = n.create_client(Trigger, f'{ns}/cancel')
        self.param_client = n.create_client(SetParameters, f'{ns}/orin_llm/set_parameters')

    def _on_ready(self, msg):
        self.ready = msg.data

    def _on_diag(self, msg):
        for s in msg.status:
            entry = (level_of(s), s.message, {kv.key: kv.value for kv in s.values})
            self.diag[s.name] = entry
            self.diag_log.append((s.name, entry))

    def pool(self):
        return self.diag.get('orin_llm: kv_block_pool', (None, '', {}))

    def generation(self):
        return self.diag.get('orin_llm: generation', (None, '', {}))

    def spin_until(self, cond, timeout, what):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f'timed out after {timeout:g} s waiting for {what}')
            self.executor.spin_once(timeout_sec=0.05)

    def spin_for(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)

    def image(self, rgb, stamp_ns=None):
        msg = Image()
        if stamp_ns is not None:
            msg.header.stamp = Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
        msg.height, msg.width = rgb.shape[:2]
        msg.encoding, msg.step = 'rgb8', rgb.shape[1] * 3
        msg.data = array.array('B', rgb.tobytes())
        return msg

    def send_image(self, msg):
        pub = self.pub_compressed if isinstance(msg, CompressedImage) else self.pub_image
        pub.publish(msg)
        self.spin_for(0.3)          # lands before the prompt (another topic)

    def ask(self, text, timeout=ANSWER_TIMEOUT):
        n_resp, n_err = len(self.responses), len(self.errors)
        self.deltas.clear()
        self.pub_prompt.publish(String(data=text))
        self.spin_until(lambda: len(self.responses) > n_resp or any(
            'rejected' in e and e.startswith('prompt') for e in self.errors[n_err:]),
            timeout, f'an answer to {text[:40]!r}')
        assert len(self.responses) > n_resp, f'prompt rejected: {self.errors[n_err:]}'
        answer = self.responses[n_resp]
        # The last deltas travel on another topic and may land after the whole answer.
        deadline = time.monotonic() + 5.0
        while ''.join(self.deltas) != answer and time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.05)
        return answer

    def ask_info(self, text, timeout=ANSWER_TIMEOUT):
        """Publish ``text``; the node's ``response/info`` for it."""
        n_info = len(self.infos)
        self.pub_prompt.publish(String(data=text))

        def mine():
            return [i for i in self.infos[n_info:] if i['prompt'] == text]

        self.spin_until(mine, timeout, f'response/info for {text[:40]!r}')
        return mine()[0]

    def expect_error(self, publish, needle, timeout=20.0):
        n_err = len(self.errors)
        publish()
        self.spin_until(lambda: any(needle in e for e in self.errors[n_err:]), timeout,
                        f'an error containing {needle!r} (got {self.errors[n_err:]})')

    def call(self, client, request, timeout=20.0):
        assert client.wait_for_service(timeout_sec=timeout), client.srv_name
        future = client.call_async(request)
        self.spin_until(future.done, timeout, f'{client.srv_name} reply')
        return future.result()

    def set_params(self, **values):
        req = SetParameters.Request()
        for name, value in values.items():
            pv = ParameterValue()
            if isinstance(value, bool):
                pv.type, pv.bool_value = ParameterType.PARAMETER_BOOL, value
            elif isinstance(value, int):
                pv.type, pv.integer_value = ParameterType.PARAMETER_INTEGER, value
            elif isinstance(value, float):
                pv.type, pv.double_value = ParameterType.PARAMETER_DOUBLE, value
            else:
                pv.type, pv.string_value = ParameterType.PARAMETER_STRING, value
            req.parameters.append(Parameter(name=name, value=pv))
        return self.call(self.param_client, req).results

    def reset(self):
        assert self.call(self.reset_client, Trigger.Request()).success
        self.spin_until(lambda: self.pool()[2].get('used_blocks') == '0', 20.0,
                        'used_blocks == 0 after reset')

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)



class JsonProbe(Probe):
    """A Probe with a ``prompt/json`` publisher; each envelope is matched by its tag.

    Tags are ``tag_prefix`` and a count; ``timeout``: how long :meth:`send` waits.
    """

    def __init__(self, ns, tag_prefix='t', timeout=ANSWER_TIMEOUT):
        super().__init__(ns)
        self.pub_json = self.node.create_publisher(String, f'{ns}/prompt/json', RELIABLE)
        self.tag_prefix, self.timeout, self.sent = tag_prefix, timeout, 0

    def hello(self, period_s=2.0, tries=10):
        """Whether a refused envelope's ``response/info`` came back within ``tries``.

        Until one does, an answer's ``response/info`` may be lost (the subscription is not
        matched yet): ``{"tag": "hello"}`` (refused, nothing generated) every ``period_s``.
        """
        for _ in range(tries):
            self.pub_json.publish(String(data='{"tag": "hello"}'))
            self.spin_for(period_s)
            if self.infos_of('hello'):
                return True
        return False

    def publish(self, envelope):
        """Publish ``envelope`` with a fresh tag; returns the tag."""
        self.sent += 1
        tag = f'{self.tag_prefix}{self.sent}'
        self.pub_json.publish(String(data=json.dumps({**envelope, 'tag': tag})))
        return tag

    def infos_of(self, tag):
        """The ``response/info`` messages that carry ``tag``."""
        return [i for i in self.infos if i.get('tag') == tag]

    def wait_info(self, tag, timeout=None):
        """The first ``response/info`` of ``tag``."""
        self.spin_until(lambda: self.infos_of(tag), timeout or self.timeout,
                        f'response/info of {tag}')
        return self.infos_of(tag)[0]

    def send(self, envelope, timeout=None):
        """Publish ``envelope``; the ``response/info`` that carries its tag."""
        return self.wait_info(self.publish(envelope), timeout)


def start_node(ckpt, ns, log_dir, *params, managed=False, command=None, env=None):
    """The node process with the repo YAML + overrides; its log in ``log_dir/node.log``.

    ``command``: what runs the node (default :func:`node_command`); ``env``: its environment
    (default :func:`ros_env`).
    """
    log_path = log_dir / 'node.log'
    cmd = (command or node_command()) + (['--managed'] if managed else []) + [
        '--ros-args', '-r', f'__ns:={ns}', '--params-file', str(REPO / 'config/orin_llm.yaml'),
        '-p', f'model_path:={ckpt}', '-p', f'system_prompt:={SYSTEM}',
        '-p', 'diagnostics_period_s:=0.5', '-p', 'image_max_age_s:=30.0']
    for p in params:
        cmd += ['-p', p]
    with open(log_path, 'w') as log:
        proc = spawn(cmd, env=env or ros_env(), stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def connect(proc, ns):
    """A Probe on ``ns`` once the node is ready and matched."""
    p = Probe(ns)
    try:
        p.spin_until(lambda: p.ready or proc.poll() is not None, START_TIMEOUT, 'ready')
        assert proc.poll() is None, 'node died:\n' + proc.log_path.read_text()[-3000:]
        assert p.ready is True
        p.spin_until(lambda: p.pub_prompt.get_subscription_count() > 0 and
                     p.pub_image.get_subscription_count() > 0 and p.pool()[0] is not None,
                     20.0, 'subscriptions and the first diagnostics')
    except BaseException:
        p.close()
        raise
    return p


def stop(proc):
    """Kill the node process if it still runs."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def memory_mb(proc, field):
    """A memory figure of the process in MB: ``VmHWM`` (peak resident) or ``VmRSS`` (now)."""
    for line in Path(f'/proc/{proc.pid}/status').read_text().splitlines():
        if line.startswith(f'{field}:'):
            return int(line.split()[1]) / 1024
    raise AssertionError(f'no {field}')


def defaults_env():
    """The test's ROS isolation, and no Fast DDS profile: every process at its defaults."""
    env = ros_env()
    for var in PROFILE_VARIABLES:
        env.pop(var, None)
    return env
