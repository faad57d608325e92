# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""config/orin_llm.yaml and the launch file follow the node's one parameter table.

The launch file is read with ``ast`` (no ``launch`` needed); the node is constructed in-process
(its worker, which loads the model, is never started), so its real declarations are checked.
"""

import ast
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip('rclpy')

from rclpy.parameter import Parameter  # noqa: E402

from orin_llm_node import parameters  # noqa: E402
from orin_llm_node.ros.node import OrinLLMNode  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
YAML_PATH = REPO / 'config' / 'orin_llm.yaml'
LAUNCH_PATH = REPO / 'launch' / 'orin_llm.launch.py'
SPEC = {p.name: p for p in parameters.PARAMETERS}


def _yaml_params():
    data = yaml.safe_load(YAML_PATH.read_text())
    assert list(data) == ['/**'], 'one wildcard section, so it applies under any namespace'
    return data['/**']['ros__parameters']


def _launch_tree():
    return ast.parse(LAUNCH_PATH.read_text())


def _launch_arguments():
    """Literal DeclareLaunchArgument(name, default_value=...) calls of the launch file."""
    args = {}
    for node in ast.walk(_launch_tree()):
        if isinstance(node, ast.Call) and getattr(node.func, 'id', '') == \
                'DeclareLaunchArgument' and isinstance(node.args[0], ast.Constant):
            kw = {k.arg: k.value for k in node.keywords}
            default = kw.get('default_value')
            args[node.args[0].value] = (ast.literal_eval(default)
                                        if isinstance(default, ast.Constant) else default)
    return args


def test_yaml_lists_every_parameter_with_the_node_default_and_type():
    params = _yaml_params()
    assert list(params) == list(SPEC), 'same parameters, same order as parameters.PARAMETERS'
    for name, value in params.items():
        default = SPEC[name].default
        assert type(value) is type(default), f'{name}: YAML type differs from the node'
        assert value == default, f'{name}: YAML {value!r} != node default {default!r}'
        assert parameters.check_parameter(name, value) is None


def test_every_yaml_parameter_has_a_comment():
    lines = YAML_PATH.read_text().splitlines()
    for i, line in enumerate(lines):
        key = line.strip().split(':')[0]
        if key in SPEC and line.startswith('    '):
            assert lines[i - 1].strip().startswith('#'), f'{key} has no comment above it'


def test_the_launch_file_makes_its_arguments_from_the_parameter_table():
    tree = _launch_tree()
    imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names}
    assert ('orin_llm_node.parameters', 'PARAMETERS') in imports
    # No parameter name is spelled out in the launch file: they all come from the table.
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not literals & set(SPEC), literals & set(SPEC)
    args = _launch_arguments()
    assert args['namespace'] == 'orin_llm'
    assert args['image_topic'] == 'image'
    assert args['lifecycle'] == 'false' and args['autostart'] == 'true'
    assert 'params_file' in args
    assert parameters.from_text('max_new_tokens', '64') == 64
    assert parameters.from_text('enable_cuda_graph', 'False') is False
    with pytest.raises(parameters.ParameterError, match='top_k'):
        parameters.from_text('top_k', 'many')
    assert parameters.from_text('image_topics', '[front, "wrist/image"]') == [
        'front', 'wrist/image']
    assert parameters.from_text('image_topics', 'front,wrist') == ['front', 'wrist']


@pytest.fixture
def make_node():
    context = rclpy.context.Context()
    rclpy.init(context=context)
    made = []

    def factory(**overrides):
        params = [Parameter(k, value=v) for k, v in overrides.items()]
        made.append(OrinLLMNode(context=context, parameter_overrides=params))
        return made[-1]

    yield factory
    for n in made:
        n.destroy_node()
    rclpy.try_shutdown(context=context)


@pytest.mark.ros
def test_declared_parameters_match(make_node):
    node = make_node()
    declared = node.get_parameters_by_prefix('')
    # rclpy's own: use_sim_time, and start_type_description_service from Jazzy on.
    assert set(declared) - set(SPEC) <= {'use_sim_time', 'start_type_description_service'}
    assert set(SPEC) <= set(declared)
    for name, spec in SPEC.items():
        descriptor = node.describe_parameter(name)
        assert descriptor.description, name
        assert descriptor.read_only == (not spec.runtime), name
        assert declared[name].value == spec.default
    assert set(parameters.RUNTIME_PARAMETERS) == {
        'max_new_tokens', 'temperature', 'top_p', 'top_k', 'seed', 'system_prompt',
        'video_window_s', 'response_format', 'tools', 'image_wait_s'}
    assert node.params['image_topics'] == ['image']


@pytest.mark.ros
@pytest.mark.parametrize('name,value', [
    ('top_p', 1.5), ('top_p', 0.0), ('temperature', -0.1), ('max_new_tokens', 0),
    ('device', 'gpu'), ('dtype', 'int8'), ('conversation_mode', 'multi'), ('queue_size', 0),
    ('kv_cache_memory_mb', -1.0), ('diagnostics_period_s', 0.0), ('pool_warn_fraction', 1.5),
    ('image_max_age_s', 0.0), ('max_generation_s', -1.0), ('model_path', '/nonexistent/model'),
    ('kv_block_size', 0), ('seed', -2), ('temperature', 1),
    ('image_topics', ['front', 'front']), ('image_topics', ['front', 'bad name']),
    ('image_topics', ['x'] * 9), ('image_topics', 'image'), ('camera_sync_s', 0.0),
    ('video_fps', 0.0), ('video_buffer_s', -1.0), ('video_window_s', 9.0),
    ('video_max_pixels', -1),
    ('response_format', 'json'), ('response_format', '[1]'),
    ('response_format', '{"type": "yaml"}'), ('response_format', '{"type": "regex"}'),
])
def test_bad_values_fail_with_one_line_naming_the_parameter(make_node, name, value):
    with pytest.raises(parameters.ParameterError) as err:
        make_node(**{name: value})
    text = str(err.value)
    assert f"'{name}'" in text and '\n' not in text


@pytest.mark.ros
def test_cross_parameter_check(make_node):
    with pytest.raises(parameters.ParameterError, match='image_min_pixels'):
        make_node(image_min_pixels=500000, image_max_pixels=1000)


@pytest.mark.ros
def test_a_camera_list_is_declared_as_a_string_array(make_node):
    node = make_node(image_topics=['front', '/robot/wrist/image_raw'], video_window_s=4.0)
    assert node.params['image_topics'] == ['front', '/robot/wrist/image_raw']
    assert node.get_parameter('image_topics').type_ == Parameter.Type.STRING_ARRAY
    bad = node.set_parameters([Parameter('video_window_s', value=8.5)])[0]
    assert not bad.successful and 'video_buffer_s' in bad.reason


@pytest.mark.ros
def test_runtime_parameters_are_validated_when_set(make_node):
    node = make_node()
    ok = node.set_parameters([Parameter('temperature', value=0.7),
                              Parameter('system_prompt', value='Be terse.')])
    assert all(r.successful for r in ok)
    assert node.get_parameter('temperature').value == 0.7
    bad = node.set_parameters([Parameter('top_p', value=2.0)])[0]
    assert not bad.successful and 'top_p' in bad.reason
    assert node.get_parameter('top_p').value == 1.0
    ro = node.set_parameters([Parameter('queue_size', value=9)])[0]
    assert not ro.successful
    assert node.get_parameter('queue_size').value == 4


@pytest.mark.ros
def test_engine_values_are_checked_by_the_engine_alone(make_node):
    # The engine's own names are accepted because the engine is the one that checks them.
    assert make_node(dtype='bf16').params['dtype'] == 'bf16'
    with pytest.raises(parameters.ParameterError, match="'kv_block_size' = -3: block_size"):
        make_node(kv_block_size=-3)


@pytest.mark.ros
def test_an_unknown_parameter_is_said_and_ignored(make_node, capfd):
    node = make_node(max_new_token=5)             # a typo of max_new_tokens
    assert not node.has_parameter('max_new_token')
    assert node.params['max_new_tokens'] == SPEC['max_new_tokens'].default
    assert "unknown parameter 'max_new_token' ignored (typo?)" in capfd.readouterr().err


@pytest.mark.ros
def test_number_parameters_declare_their_ranges(make_node):
    node = make_node()
    for name, spec in SPEC.items():
        descriptor = node.describe_parameter(name)
        ranges = [*descriptor.floating_point_range, *descriptor.integer_range]
        if spec.bounds is None:
            assert not ranges, name
            continue
        high = spec.bounds.high if isinstance(spec.default, float) else min(spec.bounds.high,
                                                                              2**63 - 1)
        assert [(r.from_value, r.to_value) for r in ranges] == [(spec.bounds.low, high)], name
    refused = node.set_parameters([Parameter('top_p', value=1.5)])[0]
    assert not refused.successful and 'out of range' in refused.reason
    assert 'one of: chat, single' in node.describe_parameter('conversation_mode').description
