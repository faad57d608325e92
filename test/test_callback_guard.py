# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""No exception from a subscription or service callback ends the node, over real loopback DDS.

The node process runs with two callbacks of the test's own that fail as a bug would: a
subscription that parses its message with ``json.loads`` (4 KB of brackets: RecursionError,
the way deep JSON used to kill the node) and a service that divides by zero.  Each fault is
said on ``error`` (at most once a second per callback and kind), logged with its traceback,
counted in ``/diagnostics`` (``callback_faults``, WARN), the service answers ``success:
false``, and the node answers a prompt afterwards as the same engine in this process does.
Budget: ~1 min on 2 busy cores.
"""

import sys
import time

import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import RELIABLE, SYSTEM, connect, start_node, stop  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_guard'
MAX_NEW = 6
DEEP = '[' * 2000 + ']' * 2000

FAULTY_NODE = '''
import json
import sys

from std_msgs.msg import String
from std_srvs.srv import Trigger

from orin_llm_node.ros import main, node


class FaultyNode(node.OrinLLMNode):
    """The node plus two callbacks that raise, registered as the node registers its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.create_subscription(String, 'fault', lambda msg: json.loads(msg.data), 100)
        self.create_service(Trigger, 'fault', lambda request, response: 1 / 0)


node.OrinLLMNode = FaultyNode
main.main(sys.argv[1:])
'''


@pytest.fixture(scope='module')
def faulty(tiny_ckpt, tmp_path_factory):
    script = tmp_path_factory.mktemp('guard') / 'faulty_node.py'
    script.write_text(FAULTY_NODE)
    proc = start_node(tiny_ckpt, NS, script.parent, f'max_new_tokens:={MAX_NEW}',
                      command=[sys.executable, str(script)])
    try:
        p = connect(proc, NS)
    except BaseException:
        stop(proc)
        raise
    p.pub_fault = p.node.create_publisher(String, f'{NS}/fault', RELIABLE)
    p.fault_client = p.node.create_client(Trigger, f'{NS}/fault')
    p.spin_until(lambda: p.pub_fault.get_subscription_count() > 0, 20.0, 'the fault topic')
    yield proc, p
    p.close()
    stop(proc)


def test_a_raising_callback_is_said_counted_and_the_node_serves_on(faulty, tiny_ckpt):
    proc, probe = faulty
    n_err = len(probe.errors)
    probe.pub_fault.publish(String(data=DEEP))
    probe.spin_until(lambda: any('RecursionError' in e for e in probe.errors[n_err:])
                     or proc.poll() is not None, 30.0, 'the fault on error')
    assert proc.poll() is None, 'node died:\n' + proc.log_path.read_text()[-3000:]
    said = [e for e in probe.errors[n_err:] if 'RecursionError' in e]
    assert said[0].startswith('internal error in the fault callback, the node serves on: '
                              'RecursionError: maximum recursion depth exceeded')
    probe.spin_until(lambda: probe.generation()[2].get('callback_faults') == '1', 30.0,
                     'callback_faults == 1 in /diagnostics')
    level, message, _ = probe.generation()
    assert level == 1 and '1 callback fault(s)' in message, message
    reply = probe.call(probe.fault_client, Trigger.Request())
    assert not reply.success and reply.message.startswith('internal error: ZeroDivisionError')
    probe.spin_until(lambda: probe.generation()[2].get('callback_faults') == '2', 30.0,
                     'callback_faults == 2')
    assert proc.poll() is None
    reference = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu'))
    conv = reference.new_conversation(SYSTEM)
    expected = reference.chat(conv, 'Still there?', sampling=SamplingParams(max_tokens=MAX_NEW))
    probe.reset()
    assert probe.ask('Still there?') == expected.text
    log = proc.log_path.read_text()
    assert 'fault callback failed:' in log and 'Traceback (most recent call last)' in log


def test_a_flood_of_faults_is_counted_in_full_and_said_rarely(faulty):
    proc, probe = faulty
    before = int(probe.generation()[2]['callback_faults'])
    n_err = len(probe.errors)
    t0 = time.monotonic()
    for i in range(50):
        probe.pub_fault.publish(String(data='{not json' + str(i)))
    probe.spin_until(lambda: probe.generation()[2].get('callback_faults') == str(before + 50),
                     60.0, f'callback_faults == {before + 50}')
    said = [e for e in probe.errors[n_err:] if 'JSONDecodeError' in e]
    # One per second and kind at most (wide margin for a slow machine's spread of arrivals).
    assert 1 <= len(said) <= 2 + (time.monotonic() - t0), said
    assert int(probe.generation()[2]['unsaid_errors']) >= 50 - len(said)
    assert proc.poll() is None
