# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Run by test_child_processes.py alone (not collected: not a test_*.py file).

One test that holds an orin_llm_serve process (the ``tiny_server`` fixture) and a node process
(``_ros_harness.start_node``), writes their pids to ``$ORIN_HELD_PIDS`` and waits to be killed.
"""

import os
from pathlib import Path
import time

import pytest


def test_hold_a_server_and_a_node(tiny_server, tiny_ckpt, tmp_path):
    pytest.importorskip('rclpy')
    from _ros_harness import start_node, stop

    node = start_node(tiny_ckpt, '/held_children', tmp_path)
    try:
        Path(os.environ['ORIN_HELD_PIDS']).write_text(f'{tiny_server.proc.pid} {node.pid}')
        time.sleep(600)
    finally:
        stop(node)
