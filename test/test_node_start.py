# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node refuses what it cannot start with, and a failed activation is never silent.

Real node processes over loopback DDS.  Camera names (``image_topics``) that are the node's own
topics or services -- relative, ``~/`` forms, ``NAME/compressed`` twins, or through a remap --
end the start with one FATAL line and exit 2, before a weight is read; a plain node whose
activation fails says so (FATAL) and exits 1; a managed one refuses the transition with the
reason and can be activated again.  Budget: ~1-2 min on 2 busy cores (a start-up each).
"""

import subprocess
import sys

from child_processes import spawn
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import EVENT_TIMEOUT, START_TIMEOUT, Probe, node_command, ros_env, stop  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402

pytestmark = pytest.mark.ros

# A node that refuses its parameters exits within seconds (importing torch is the slow part);
# one that does not would run until killed.
EXIT_TIMEOUT = 90


@pytest.mark.parametrize('names,args,said', [
    ('[prompt]', (), "camera 'prompt' would read /llm_names/prompt, this node's own topic"),
    ('[response]', (), "camera 'response' would read /llm_names/response, this node's own topic"),
    ("['front/compressed', front]", (),
     "camera 'front/compressed' is the CompressedImage topic of camera 'front'"),
    ('[front, orin_llm/transition_event]', (),     # ~/transition_event: the lifecycle's
     "would read /llm_names/orin_llm/transition_event, this node's own topic"),
    ('[orin_llm/get_parameters]', (),              # ~/get_parameters: a service
     "would read /llm_names/orin_llm/get_parameters, this node's own service"),
    ('[front]', ('-r', 'front:=prompt/json'),      # a remap onto the node's own topic
     "camera 'front' would read /llm_names/prompt/json, this node's own topic"),
], ids=['prompt', 'response', 'compressed-twin', 'private-topic', 'private-service', 'remap'])
def test_a_camera_named_like_the_nodes_own_topics_stops_the_start(names, args, said):
    proc = subprocess.run(
        node_command() + ['--ros-args', '-r', '__ns:=/llm_names', '-p', f'image_topics:={names}',
                          *args],
        env=ros_env(), capture_output=True, text=True, timeout=EXIT_TIMEOUT)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, out[-20:]
    assert len(out) == 1 and 'FATAL' in out[0] and "parameter 'image_topics'" in out[0], out
    assert said in out[0], out


# The node as a user runs it, except that opening the cameras fails the first time (a real
# trigger is hard to make on purpose: every name the middleware refuses is refused at start-up
# now).  Everything around it -- rclpy's lifecycle, which swallows an exception from a
# transition without a word, the executor, the exit path -- is the real one.
FAILING_ACTIVATION = """
from orin_llm_node.ros.cameras.intake import ImageIntake
from orin_llm_node.ros.main import main

opened = ImageIntake.subscribe
failures = []


def subscribe(self, *args):
    opened(self, *args)
    if not failures:
        failures.append(1)
        raise OSError('the camera driver went away')


ImageIntake.subscribe = subscribe
main()
"""


def failing_node(tmp_path, ns, tiny_ckpt, *extra):
    script = tmp_path / 'failing_activation.py'
    script.write_text(FAILING_ACTIVATION)
    return [sys.executable, str(script), *extra, '--ros-args', '-r', f'__ns:={ns}',
            '-p', f'model_path:={tiny_ckpt}']


def test_a_plain_node_whose_activation_fails_says_so_and_exits_1(tiny_ckpt, tmp_path):
    proc = subprocess.run(failing_node(tmp_path, '/llm_activation', tiny_ckpt), env=ros_env(),
                          capture_output=True, text=True, timeout=START_TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    fatal = [ln for ln in out.splitlines() if 'FATAL' in ln]
    assert len(fatal) == 1, out[-3000:]
    assert 'failed to activate: the camera driver went away' in fatal[0]
    assert 'Traceback' not in out


def test_a_managed_node_whose_activation_fails_refuses_it_and_can_retry(tiny_ckpt, tmp_path):
    ns = '/llm_activation_managed'
    log_path = tmp_path / 'node.log'
    with open(log_path, 'w') as log:
        proc = spawn(failing_node(tmp_path, ns, tiny_ckpt, '--managed'),
                                env=ros_env(), stdout=log, stderr=subprocess.STDOUT)
    probe = Probe(ns)
    try:
        change = probe.node.create_client(ChangeState, f'{ns}/orin_llm/change_state')

        def transition(tid):
            req = ChangeState.Request()
            req.transition.id = tid
            return probe.call(change, req, timeout=START_TIMEOUT).success

        assert transition(Transition.TRANSITION_CONFIGURE), log_path.read_text()[-3000:]
        assert not transition(Transition.TRANSITION_ACTIVATE)
        probe.spin_until(lambda: any('failed to activate' in e for e in probe.errors),
                         EVENT_TIMEOUT, 'the reason on error')
        assert any('the camera driver went away' in e for e in probe.errors), probe.errors
        assert proc.poll() is None and probe.ready is False
        probe.spin_until(lambda: probe.generation()[2].get('state') == 'inactive',
                         EVENT_TIMEOUT, 'diagnostics: inactive')
        # The cameras' subscriptions opened before the fault were closed again: activating
        # once more opens one best-effort and one reliable subscription, not two of each.
        assert transition(Transition.TRANSITION_ACTIVATE)
        probe.spin_until(lambda: probe.ready is True, EVENT_TIMEOUT, 'ready true')
        probe.spin_until(lambda: probe.pub_image.get_subscription_count() == 2, EVENT_TIMEOUT,
                         'two image subscriptions')
        probe.spin_for(1.0)
        assert probe.pub_image.get_subscription_count() == 2
    finally:
        probe.close()
        stop(proc)
