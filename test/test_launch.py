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

from pathlib import Path
import sys
import unittest

import pytest

pytest.importorskip('launch_testing')
# `launch_test FILE` does not put the file's directory on the path (pytest does).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_support import LATCHED, RELIABLE, LaunchProbe, launch_description  # noqa: E402
import launch_testing.asserts  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402

pytestmark = [pytest.mark.launch, pytest.mark.ros]

NAMESPACE = 'launch_test'


@pytest.mark.launch_test
def generate_test_description():
    """The package's launch file with a tiny checkpoint and the package's YAML."""
    return launch_description(namespace=NAMESPACE, max_new_tokens='8')


class TestAnswers(LaunchProbe):
    """Active tests: talk to the launched node over its topics."""

    def test_prompt_gets_an_answer(self, proc_output):
        ready, answers, deltas = [], [], []
        ns = f'/{NAMESPACE}'
        self.node.create_subscription(Bool, f'{ns}/ready', lambda m: ready.append(m.data),
                                      LATCHED)
        self.node.create_subscription(String, f'{ns}/response', lambda m: answers.append(m.data),
                                      RELIABLE)
        self.node.create_subscription(String, f'{ns}/response/stream',
                                      lambda m: deltas.append(m.data), RELIABLE)
        pub = self.node.create_publisher(String, f'{ns}/prompt', RELIABLE)
        self.spin_until(lambda: ready and ready[-1] and pub.get_subscription_count() > 0,
                         'the latched ready')
        pub.publish(String(data='What is in front of you?'))
        self.spin_until(lambda: answers, 'the response')
        self.assertTrue(answers[0])
        # The last deltas travel on another topic and may land after the whole answer.
        self.spin_until(lambda: ''.join(deltas) == answers[0], 'the streamed deltas')
        proc_output.assertWaitFor('ready: publish a prompt', timeout=5)
        # The node runs on a pseudo-terminal (emulate_tty) but the launch's output is no
        # terminal here: plain lines, no ANSI colour codes (log_colour.py).
        text = b''.join(output.text for output in proc_output).decode('utf-8', 'replace')
        self.assertIn('ready: publish a prompt', text)
        self.assertNotIn('\x1b[', text)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """After launch sends SIGINT: every process exited cleanly."""

    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info)
