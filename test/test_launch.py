# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""launch_testing: launch/orin_llm.launch.py on a tiny checkpoint answers a prompt, exits 0.

Needs the package installed where ``ros2 launch`` finds it (``colcon build`` and a sourced
workspace, or an ament prefix that holds ``lib/orin_llm_node/orin_llm_node``) and the
``launch_testing`` stack; skips cleanly where ``launch_testing`` is absent.  Run it with
``launch_test test/test_launch.py`` or through pytest (the launch_testing plugin collects it).
It tests the copy of the package it imports: the installed one after ``source
install/setup.bash``, the checkout's with the checkout first on ``PYTHONPATH`` (README).
"""

import os
from pathlib import Path
import tempfile
import time
import unittest

import pytest

pytest.importorskip('launch_testing')

from launch import LaunchDescription  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402

from orin_llm_node.package_files import share_dir  # noqa: E402
from orin_llm_node.testing import make_tiny_checkpoint  # noqa: E402

pytestmark = [pytest.mark.launch, pytest.mark.ros]

NAMESPACE = 'launch_test'
TIMEOUT_S = 120.0


@pytest.mark.launch_test
def generate_test_description():
    """The package's launch file with a tiny checkpoint and the package's YAML."""
    # Same isolation as test/conftest.py, for runs through `launch_test` without it.
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ['ROS_LOCALHOST_ONLY'] = '1'
    os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
    ckpt = make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix='orin_llm_launch_')) / 'tiny')
    # The files of the copy under test: the checkout's when orin_llm_node is imported from it,
    # the install's share/ when only the colcon-built package is on the path.
    share = share_dir()
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(share / 'launch' / 'orin_llm.launch.py')),
        launch_arguments={
            'namespace': NAMESPACE,
            'params_file': str(share / 'config' / 'orin_llm.yaml'),
            'model_path': str(ckpt),
            'device': 'cpu',
            'max_new_tokens': '8',
        }.items())
    return LaunchDescription([include, launch_testing.actions.ReadyToTest()])


class TestAnswers(unittest.TestCase):
    """Active tests: talk to the launched node over its topics."""

    @classmethod
    def setUpClass(cls):
        cls.context = rclpy.context.Context()
        rclpy.init(context=cls.context)
        cls.node = rclpy.create_node('orin_llm_launch_probe', context=cls.context)
        cls.executor = rclpy.executors.SingleThreadedExecutor(context=cls.context)
        cls.executor.add_node(cls.node)

    @classmethod
    def tearDownClass(cls):
        cls.executor.shutdown()
        cls.node.destroy_node()
        rclpy.try_shutdown(context=cls.context)

    def _spin_until(self, cond, what):
        deadline = time.monotonic() + TIMEOUT_S
        while not cond():
            self.assertLess(time.monotonic(), deadline, f'timed out waiting for {what}')
            self.executor.spin_once(timeout_sec=0.1)

    def test_prompt_gets_an_answer(self, proc_output):
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                              reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        ready, answers, deltas = [], [], []
        ns = f'/{NAMESPACE}'
        self.node.create_subscription(Bool, f'{ns}/ready', lambda m: ready.append(m.data),
                                      latched)
        self.node.create_subscription(String, f'{ns}/response', lambda m: answers.append(m.data),
                                      reliable)
        self.node.create_subscription(String, f'{ns}/response/stream',
                                      lambda m: deltas.append(m.data), reliable)
        pub = self.node.create_publisher(String, f'{ns}/prompt', reliable)
        self._spin_until(lambda: ready and ready[-1] and pub.get_subscription_count() > 0,
                         'the latched ready')
        pub.publish(String(data='What is in front of you?'))
        self._spin_until(lambda: answers, 'the response')
        self.assertTrue(answers[0])
        self.assertEqual(''.join(deltas), answers[0])
        proc_output.assertWaitFor('ready: publish a prompt', timeout=5)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """After launch sends SIGINT: every process exited cleanly."""

    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)
