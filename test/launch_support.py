# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the launch_testing tests share: the package's launch file on a tiny checkpoint, a probe.

Imported by test/test_launch*.py only after they have checked that launch_testing is present.
"""

import atexit
import os
from pathlib import Path
import shutil
import tempfile
import time
import unittest

from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
import launch_testing.actions
import rclpy
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from orin_llm_node.package_files import share_dir
from orin_llm_node.testing import make_tiny_checkpoint

TIMEOUT_S = 120.0
RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                      reliability=ReliabilityPolicy.RELIABLE)
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                     reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)


def launch_description(**arguments):
    """The package's launch file with a tiny checkpoint, the package's YAML and ``arguments``."""
    # Same isolation as test/conftest.py, for runs through `launch_test` without it.
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ['ROS_LOCALHOST_ONLY'] = '1'
    os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
    scratch = tempfile.mkdtemp(prefix='orin_llm_launch_')  # outside pytest's tmp_path: ours
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    ckpt = make_tiny_checkpoint(Path(scratch) / 'tiny')
    # The files of the copy under test: the checkout's when orin_llm_node is imported from it,
    # the install's share/ when only the colcon-built package is on the path.
    share = share_dir()
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(share / 'launch' / 'orin_llm.launch.py')),
        launch_arguments={'params_file': str(share / 'config' / 'orin_llm.yaml'),
                          'model_path': str(ckpt), 'device': 'cpu', **arguments}.items())
    return LaunchDescription([include, launch_testing.actions.ReadyToTest()])


class LaunchProbe(unittest.TestCase):
    """A test case with its own rclpy context, node and executor (the launched node's peer)."""

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

    def spin_until(self, cond, what):
        """Spin until ``cond()`` holds; fail after TIMEOUT_S naming ``what``."""
        deadline = time.monotonic() + TIMEOUT_S
        while not cond():
            self.assertLess(time.monotonic(), deadline, f'timed out waiting for {what}')
            self.executor.spin_once(timeout_sec=0.1)
