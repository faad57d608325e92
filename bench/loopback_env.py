# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS benches' loopback-only environment, applied to this process on import.

Import it before rclpy: discovery stays on this machine (Kilted/Jazzy and Humble's variable) in
a private ROS_DOMAIN_ID, and ament_index finds the venv's message packages. ``ros_env()`` is the
same environment for the node processes a bench starts.
"""

import os
import sys


def ros_env():
    """A copy of ``os.environ`` for a child node process: loopback only, unbuffered output."""
    env = dict(os.environ)
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env['ROS_LOCALHOST_ONLY'] = '1'
    env.setdefault('ROS_DOMAIN_ID', str(100 + os.getpid() % 50))
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    env['PYTHONUNBUFFERED'] = '1'
    return env


os.environ.update({k: v for k, v in ros_env().items() if k.startswith(('ROS_', 'AMENT_'))})
