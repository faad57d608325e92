# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's log lines carry colour codes only where they reach a terminal.

The launch file runs the node on a pseudo-terminal (``emulate_tty``), which rcutils takes for a
terminal: a launch redirected to a file got ANSI codes in it.  Here the node runs as the launch
file runs it, on a pty, with the environment the launch file gives it (log_colour.colour_env)
for an output that is a terminal and one that is not; only the first is coloured.
"""

import os
import pty
import select
import subprocess
import time

import pytest

pytest.importorskip('rclpy')

from _ros_harness import REPO, START_TIMEOUT, node_command, ros_env  # noqa: E402

from orin_llm_node.log_colour import VARIABLE, colour_env  # noqa: E402

pytestmark = pytest.mark.ros

ANSI = b'\x1b['


def test_colour_env_follows_the_output_and_leaves_an_operators_choice():
    assert colour_env(True, {}) == {VARIABLE: '1'}
    assert colour_env(False, {'PATH': '/bin'}) == {VARIABLE: '0'}
    assert colour_env(False, {VARIABLE: '1'}) == {}


def _log_on_a_pty(tiny_ckpt, env):
    """What the node writes on a pty until it is ready (then it is killed)."""
    main, side = pty.openpty()
    cmd = node_command() + ['--ros-args', '-r', '__ns:=/llm_colour', '--params-file',
                            str(REPO / 'config/orin_llm.yaml'), '-p', f'model_path:={tiny_ckpt}']
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=side, stderr=side)
    os.close(side)
    out = b''
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while b'ready: publish a prompt' not in out and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                try:
                    out += os.read(main, 65536)
                except OSError:         # the node went away: its pty closed
                    break
    finally:
        proc.kill()
        proc.wait()
        os.close(main)
    assert b'ready: publish a prompt' in out, out[-3000:]
    return out


@pytest.mark.parametrize('to_terminal', [False, True])
def test_the_node_on_a_pty_colours_its_lines_only_for_a_terminal(tiny_ckpt, to_terminal):
    env = {k: v for k, v in ros_env().items() if k != VARIABLE}
    out = _log_on_a_pty(tiny_ckpt, {**env, **colour_env(to_terminal, env)})
    assert (ANSI in out) == to_terminal, out[:500]
