# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Start the Qwen3-VL node.

    ros2 launch orin_llm_node orin_llm.launch.py model_path:=/models/Qwen3-VL-2B-Instruct \
        image_topic:=/camera/color/image_raw

Arguments: ``namespace`` (default ``orin_llm``), ``params_file`` (default the installed
``config/orin_llm.yaml``), ``image_topic`` (remaps ``image`` and ``image/compressed``) and one
argument per node parameter (``model_path``, ``device``, ``max_new_tokens``, ...): empty keeps the
value of ``params_file``, anything else overrides it.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'orin_llm_node'

# Every parameter of the node and its type (test/test_params_agree.py keeps this in step with
# the node and config/orin_llm.yaml).
PARAMETER_TYPES = {
    'model_path': str,
    'device': str,
    'dtype': str,
    'quantization': str,
    'max_new_tokens': int,
    'temperature': float,
    'top_p': float,
    'top_k': int,
    'seed': int,
    'system_prompt': str,
    'kv_block_size': int,
    'kv_cache_memory_mb': float,
    'max_model_len': int,
    'enable_cuda_graph': bool,
    'enable_prefix_cache': bool,
    'image_max_pixels': int,
    'image_min_pixels': int,
    'image_qos_reliable': bool,
    'image_max_age_s': float,
    'queue_size': int,
    'diagnostics_period_s': float,
    'pool_warn_fraction': float,
    'conversation_mode': str,
    'max_generation_s': float,
}

_TRUE = ('true', '1', 'yes', 'on')
_FALSE = ('false', '0', 'no', 'off')


def _convert(name, text, kind):
    """Turn a launch argument string into the parameter's type, or fail naming it."""
    try:
        if kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if kind is str:
            # ParameterValue(str) keeps e.g. a numeric-looking path or prompt a string.
            return ParameterValue(text, value_type=str)
        return kind(text)
    except ValueError:
        raise RuntimeError(
            f'launch argument {name}:={text!r} is not a valid {kind.__name__}') from None


def _launch_node(context):
    overrides = {}
    for name, kind in PARAMETER_TYPES.items():
        text = LaunchConfiguration(name).perform(context)
        if text != '':
            overrides[name] = _convert(name, text, kind)
    image_topic = LaunchConfiguration('image_topic').perform(context)
    return [Node(
        package=PACKAGE,
        executable='orin_llm_node',
        name='orin_llm',
        namespace=LaunchConfiguration('namespace'),
        parameters=[LaunchConfiguration('params_file'), overrides],
        remappings=[('image', image_topic), ('image/compressed', image_topic + '/compressed')],
        output='screen',
        emulate_tty=True,
    )]


def generate_launch_description():
    """Launch arguments and the node."""
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
    ]
    arguments += [
        DeclareLaunchArgument(name, default_value='',
                              description=f'override the {name} parameter ({kind.__name__}); '
                                          'empty = the value in params_file')
        for name, kind in PARAMETER_TYPES.items()
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=_launch_node)])
