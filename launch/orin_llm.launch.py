# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Start the Qwen3-VL node.

    ros2 launch orin_llm_node orin_llm.launch.py model_path:=/models/Qwen3-VL-2B-Instruct \
        image_topic:=/camera/color/image_raw

Arguments: ``namespace`` (default ``orin_llm``), ``params_file`` (default the installed
``config/orin_llm.yaml``), ``image_topic`` (remaps ``image`` and ``image/compressed``),
``lifecycle`` (``true``: a managed node, driven here through configure -> activate unless
``autostart:=false`` leaves it unconfigured for ``ros2 lifecycle set``) and one argument per node
parameter, made from the node's parameter table (``model_path``, ``device``,
``max_new_tokens``, ...): empty keeps the value of ``params_file``, anything else overrides it.
A node that exits with an error (missing model, bad parameter) makes the launch exit 1.  Its
log lines carry colour only when the launch's own output is a terminal.
"""

import os
import sys

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare
from lifecycle_msgs.msg import Transition

from orin_llm_node.log_colour import colour_env
from orin_llm_node.parameters import PARAMETERS, from_text

PACKAGE = 'orin_llm_node'


def _flag(context, name):
    text = LaunchConfiguration(name).perform(context).lower()
    if text not in ('true', 'false'):
        raise RuntimeError(f'launch argument {name}:={text!r} must be true or false')
    return text == 'true'


def _launch_node(context):
    overrides = {}
    for spec in PARAMETERS:
        text = LaunchConfiguration(spec.name).perform(context)
        if text != '':
            value = from_text(spec.name, text)
            # ParameterValue(str) keeps e.g. a numeric-looking path or prompt a string.
            overrides[spec.name] = (ParameterValue(value, value_type=str)
                                    if isinstance(value, str) else value)
    image_topic = LaunchConfiguration('image_topic').perform(context)
    common = dict(
        package=PACKAGE, executable='orin_llm_node', name='orin_llm',
        namespace=LaunchConfiguration('namespace'),
        parameters=[LaunchConfiguration('params_file'), overrides],
        remappings=[('image', image_topic), ('image/compressed', image_topic + '/compressed')],
        # A pseudo-terminal keeps the node's lines whole and in order; colour only where they
        # reach one (log_colour.py): a launch redirected to a file gets plain lines.
        output='screen', emulate_tty=True,
        additional_env=colour_env(sys.stdout.isatty(), os.environ))
    managed = _flag(context, 'lifecycle')
    node = LifecycleNode(arguments=['--managed'], **common) if managed else Node(**common)
    actions = [node, RegisterEventHandler(OnProcessExit(target_action=node,
                                                        on_exit=_node_exited))]
    if managed and _flag(context, 'autostart'):
        actions += [
            # Only after configure: a later deactivate (active -> inactive) must stick.
            RegisterEventHandler(OnStateTransition(
                target_lifecycle_node=node, start_state='configuring', goal_state='inactive',
                entities=[EmitEvent(event=ChangeState(
                    lifecycle_node_matcher=matches_action(node),
                    transition_id=Transition.TRANSITION_ACTIVATE))])),
            EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                        transition_id=Transition.TRANSITION_CONFIGURE)),
        ]
    return actions


def _node_exited(event, context):
    """A node that could not start (or died) makes ``ros2 launch`` exit non-zero.

    launch ends with exit code 1 when an event handler raises ("Caught exception in launch"),
    and shuts everything else down, so a supervisor (systemd, a test) learns the VLM is down.
    """
    del context
    if event.returncode != 0:
        raise RuntimeError(f'{event.action.name} exited with code {event.returncode}: the '
                           'VLM node is down (its FATAL line above says why)')


def generate_launch_description():
    """Launch arguments (one per node parameter, from its table) and the node."""
    arguments = [
        DeclareLaunchArgument('namespace', default_value='orin_llm',
                              description='namespace of the node and its topics'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), 'config',
                                                'orin_llm.yaml']),
            description='YAML file with the node parameters'),
        DeclareLaunchArgument('image_topic', default_value='image',
                              description='camera topic (sensor_msgs/Image; <topic>/compressed '
                                          'for sensor_msgs/CompressedImage)'),
        DeclareLaunchArgument('lifecycle', default_value='false',
                              description='true: start a managed (lifecycle) node'),
        DeclareLaunchArgument('autostart', default_value='true',
                              description='with lifecycle:=true, configure and activate it at '
                                          'once (false: leave it unconfigured)'),
    ]
    arguments += [
        DeclareLaunchArgument(spec.name, default_value='',
                              description=f'{spec.description} ({type(spec.default).__name__}; '
                                          'empty = the value in params_file)')
        for spec in PARAMETERS
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=_launch_node)])
