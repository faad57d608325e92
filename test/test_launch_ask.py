# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""launch_testing: the launched node answers one goal of its ``ask`` action.

The package's launch file on a tiny checkpoint (launch_support.py); an rclpy ActionClient
sends a goal and gets its stages as feedback, its text and its result.  Against the colcon
install, ``orin_llm_node.action`` is the install's generated type.  Skips cleanly where
``launch_testing`` is absent; run it with ``launch_test test/test_launch_ask.py`` or pytest.
"""

import json
from pathlib import Path
import sys

import pytest

pytest.importorskip('launch_testing')
# `launch_test FILE` does not put the file's directory on the path (pytest does).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from action_msgs.msg import GoalStatus  # noqa: E402
from launch_support import LATCHED, LaunchProbe, launch_description  # noqa: E402
from rclpy.action import ActionClient  # noqa: E402
from std_msgs.msg import Bool  # noqa: E402

from orin_llm_node.action import Ask  # noqa: E402

pytestmark = [pytest.mark.launch, pytest.mark.ros]

NAMESPACE = 'launch_ask_test'


@pytest.mark.launch_test
def generate_test_description():
    """The package's launch file with a tiny checkpoint and the package's YAML."""
    return launch_description(namespace=NAMESPACE, max_new_tokens='8')


class TestAsk(LaunchProbe):
    """Active test: one goal to the launched node's ask action."""

    def test_a_goal_gets_its_stages_and_its_answer(self, proc_output):
        ns, ready, feedback = f'/{NAMESPACE}', [], []
        self.node.create_subscription(Bool, f'{ns}/ready', lambda m: ready.append(m.data),
                                      LATCHED)
        client = ActionClient(self.node, Ask, f'{ns}/ask')
        self.spin_until(lambda: ready and ready[-1] and client.server_is_ready(),
                        'the latched ready and the ask server')
        sent = client.send_goal_async(Ask.Goal(prompt='What is in front of you?', tag='l1'),
                                      feedback_callback=lambda m: feedback.append(m.feedback))
        self.spin_until(sent.done, 'the goal response')
        handle = sent.result()
        self.assertTrue(handle.accepted)
        result = handle.get_result_async()
        self.spin_until(result.done, 'the result')
        answer = result.result()
        self.assertEqual(answer.status, GoalStatus.STATUS_SUCCEEDED, answer.result.error)
        self.assertTrue(answer.result.text)
        self.assertEqual(json.loads(answer.result.info)['tag'], 'l1')
        # Feedback and result travel apart: the last text may land after the result.
        self.spin_until(lambda: ''.join(f.text_delta for f in feedback) == answer.result.text,
                        'the streamed text')
        self.assertEqual(feedback[0].stage, Ask.Feedback.STAGE_QUEUED)
        self.assertIn(Ask.Feedback.STAGE_DECODING, [f.stage for f in feedback])
        client.destroy()
