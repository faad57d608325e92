# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""launch_testing: ``lifecycle:=true autostart:=false`` starts an unconfigured managed node.

The test drives it as ``ros2 lifecycle set`` would: configure -> activate (a prompt is
answered) -> deactivate (ready false) -> cleanup -> shutdown, then checks every process exited
cleanly.  Needs the launch_testing stack and the package installed where ``ros2 launch`` finds it;
skips cleanly where launch_testing is absent.  Run with ``launch_test`` or pytest.
"""

from pathlib import Path
import sys
import unittest

import pytest

pytest.importorskip('launch_testing')
# `launch_test FILE` does not put the file's directory on the path (pytest does).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_support import LATCHED, RELIABLE, LaunchProbe, launch_description  # noqa: E402
import launch_testing.asserts  # noqa: E402
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402

pytestmark = [pytest.mark.launch, pytest.mark.ros]

NS = '/launch_lifecycle'


@pytest.mark.launch_test
def generate_test_description():
    """The package's launch file, managed and left unconfigured."""
    return launch_description(namespace=NS.strip('/'), max_new_tokens='4', lifecycle='true',
                              autostart='false')


class TestTransitions(LaunchProbe):
    """Active test: every transition through the node's lifecycle services."""

    def _call(self, client, request):
        self.assertTrue(client.wait_for_service(timeout_sec=60.0), client.srv_name)
        future = client.call_async(request)
        self.spin_until(future.done, client.srv_name)
        return future.result()

    def test_configure_activate_answer_deactivate_cleanup_shutdown(self):
        ready, answers = [], []
        n = self.node
        n.create_subscription(Bool, f'{NS}/ready', lambda m: ready.append(m.data), LATCHED)
        n.create_subscription(String, f'{NS}/response', lambda m: answers.append(m.data),
                              RELIABLE)
        pub = n.create_publisher(String, f'{NS}/prompt', RELIABLE)
        change = n.create_client(ChangeState, f'{NS}/orin_llm/change_state')
        get = n.create_client(GetState, f'{NS}/orin_llm/get_state')

        def transition(tid):
            request = ChangeState.Request()
            request.transition.id = tid
            self.assertTrue(self._call(change, request).success, tid)

        self.assertEqual(self._call(get, GetState.Request()).current_state.id,
                         State.PRIMARY_STATE_UNCONFIGURED)
        self.spin_until(lambda: ready, 'the latched ready')
        self.assertFalse(ready[-1])
        transition(Transition.TRANSITION_CONFIGURE)
        transition(Transition.TRANSITION_ACTIVATE)
        self.spin_until(lambda: ready[-1] and pub.get_subscription_count() > 0, 'ready')
        pub.publish(String(data='Hello there.'))
        self.spin_until(lambda: answers, 'the answer')
        transition(Transition.TRANSITION_DEACTIVATE)
        self.spin_until(lambda: not ready[-1], 'ready false')
        transition(Transition.TRANSITION_CLEANUP)
        self.assertEqual(self._call(get, GetState.Request()).current_state.id,
                         State.PRIMARY_STATE_UNCONFIGURED)
        transition(Transition.TRANSITION_UNCONFIGURED_SHUTDOWN)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """The shutdown transition ended the node with exit code 0."""

    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)
