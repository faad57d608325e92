# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A test run killed with SIGTERM leaves no server or node process behind (child_processes)."""

import os
import signal
import subprocess
import sys
import time

from conftest import REPO
import psutil
import pytest

pytest.importorskip('httpx')
pytest.importorskip('fastapi')
pytest.importorskip('rclpy')

pytestmark = pytest.mark.ros

#: A server and a node starting on a loaded machine (each waits up to 120 s for itself).
HELD_WITHIN_S = 300


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigterm_to_pytest_ends_the_server_and_the_node_it_started(tmp_path):
    pids_file = tmp_path / 'pids'
    # A domain of its own: the node must not meet this session's nodes.
    env = {**os.environ, 'ORIN_HELD_PIDS': str(pids_file),
           'ROS_DOMAIN_ID': str((int(os.environ['ROS_DOMAIN_ID']) + 35) % 90 + 10)}
    with open(tmp_path / 'pytest.log', 'wb') as log:
        run = subprocess.Popen([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                                f'--basetemp={tmp_path / "base"}', 'test/held_children.py'],
                               cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    held = []
    try:
        deadline = time.monotonic() + HELD_WITHIN_S
        while not pids_file.exists():
            assert run.poll() is None, (tmp_path / 'pytest.log').read_text()[-3000:]
            assert time.monotonic() < deadline, 'the server and the node did not start'
            time.sleep(0.5)
        time.sleep(0.5)  # the file is written in one call; let it land
        held = [int(pid) for pid in pids_file.read_text().split()]
        assert len(held) == 2 and not any(_gone(pid) for pid in held)
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == -signal.SIGTERM  # pytest still dies of it
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in held) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in held), [psutil.Process(p).cmdline() for p in held
                                                 if not _gone(p)]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in held:  # what a failure left: this test's own leftovers
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
