# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""launch_testing: ``lifecycle:=true autostart:=false`` starts an unconfigured managed node.

The test drives it as ``ros2 lifecycle set`` would: configure -> activate (a prompt is
answered) -> deactivate (ready false) -> cleanup -> shutdown, then checks every process exited
cleanly.  Needs the launch_testing stack and the package installed where ``ros2 launch`` finds it;
skips cleanly where launch_testing is absent.  Run with ``launch_test`` or pytest.
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
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
import rclpy  # noqa: E402
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402

from orin_llm_node.testing import make_tiny_checkpoint  # noqa: E402

pytestmark = [pytest.mark.launch, pytest.mark.ros]

REPO = Path(__file__).resolve().parents[1]
NS = '/launch_lifecycle'
TIMEOUT_S = 120.0


@pytest.mark.launch_test
def generate_test_description():
    """The package's launch file, managed and left unconfigured."""
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ['ROS_LOCALHOST_ONLY'] = '1'
    os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
    ckpt = make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix='orin_llm_launch_')) / 'tiny')
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(REPO / 'launch' / 'orin_llm.launch.py')),
        launch_arguments={
            'namespace': NS.strip('/'), 'params_file': str(REPO / 'config' / 'orin_llm.yaml'),
            'model_path': str(ckpt), 'device': 'cpu', 'max_new_tokens': '4',
            'lifecycle': 'true', 'autostart': 'false',
        }.items())
    return LaunchDescription([include, launch_testing.actions.ReadyToTest()])


class TestTransitions(unittest.TestCase):
    """Active test: every transition through the node's lifecycle services."""

    @classmethod
    def setUpClass(cls):
        cls.context = rclpy.context.Context()
        rclpy.init(context=cls.context)
        cls.node = rclpy.create_node('orin_llm_lifecycle_probe', context=cls.context)
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

    def _call(self, client, request):
        self.assertTrue(client.wait_for_service(timeout_sec=TIMEOUT_S), client.srv_name)
        future = client.call_async(request)
        self._spin_until(future.done, client.srv_name)
        return future.result()

    def test_configure_activate_answer_deactivate_cleanup_shutdown(self):
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                              reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        ready, answers = [], []
        n = self.node
        n.create_subscription(Bool, f'{NS}/ready', lambda m: ready.append(m.data), latched)
        n.create_subscription(String, f'{NS}/response', lambda m: answers.append(m.data),
                              reliable)
        pub = n.create_publisher(String, f'{NS}/prompt', reliable)
        change = n.create_client(ChangeState, f'{NS}/orin_llm/change_state')
        get = n.create_client(GetState, f'{NS}/orin_llm/get_state')

        def transition(tid):
            request = ChangeState.Request()
            request.transition.id = tid
            self.assertTrue(self._call(change, request).success, tid)

        self.assertEqual(self._call(get, GetState.Request()).current_state.id,
                         State.PRIMARY_STATE_UNCONFIGURED)
        self._spin_until(lambda: ready, 'the latched ready')
        self.assertFalse(ready[-1])
        transition(Transition.TRANSITION_CONFIGURE)
        transition(Transition.TRANSITION_ACTIVATE)
        self._spin_until(lambda: ready[-1] and pub.get_subscription_count() > 0, 'ready')
        pub.publish(String(data='Hello there.'))
        self._spin_until(lambda: answers, 'the answer')
        transition(Transition.TRANSITION_DEACTIVATE)
        self._spin_until(lambda: not ready[-1], 'ready false')
        transition(Transition.TRANSITION_CLEANUP)
        self.assertEqual(self._call(get, GetState.Request()).current_state.id,
                         State.PRIMARY_STATE_UNCONFIGURED)
        transition(Transition.TRANSITION_UNCONFIGURED_SHUTDOWN)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """The shutdown transition ended the node with exit code 0."""

    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)
