# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""launch: a node that cannot start makes the launch end with a non-zero exit code.

``ros2 launch`` returns what ``LaunchService.run()`` returns; this runs the package's launch file
in a LaunchService (as ``ros2 launch`` does) with a missing ``model_path`` and checks both the
node's exit code and the launch's.  Needs the launch stack and the package installed where
launch_ros finds its executable (``colcon build`` + a sourced workspace); skips otherwise.
"""

import os
from pathlib import Path

import pytest

pytest.importorskip('launch_ros')
ament_index = pytest.importorskip('ament_index_python.packages')

from launch import LaunchService  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
import launch.logging  # noqa: E402

from orin_llm_node.package_files import share_dir  # noqa: E402

pytestmark = pytest.mark.ros

def test_missing_model_makes_the_launch_exit_non_zero(tmp_path, capfd):
    try:
        prefix = ament_index.get_package_prefix('orin_llm_node')
    except ament_index.PackageNotFoundError:
        pytest.skip('orin_llm_node is not installed where launch_ros looks (colcon build)')
    if not (Path(prefix) / 'lib' / 'orin_llm_node' / 'orin_llm_node').exists():
        pytest.skip('the orin_llm_node executable is not installed (colcon build)')
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ['ROS_LOCALHOST_ONLY'] = '1'
    # launch's screen handler keeps the stdout it first saw (an earlier test's capture when
    # test_launch.py ran before in this session): start from a fresh one so capfd sees it.
    launch.logging.reset()
    service = LaunchService()
    service.include_launch_description(IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(share_dir() / 'launch' / 'orin_llm.launch.py')),
        launch_arguments={'namespace': 'launch_exit_test', 'device': 'cpu',
                          'model_path': str(tmp_path / 'missing')}.items()))
    assert service.run() == 1
    out = capfd.readouterr()
    log = out.out + out.err
    assert 'FATAL' in log and "'model_path'" in log, log[-3000:]
    assert 'exited with code 2: the VLM node is down' in log, log[-3000:]
