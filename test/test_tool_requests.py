# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The tool and grounding keys of ``prompt/json``: checks, refusals, the answer's shape.

Over the real parts without a node: the envelope table (request_envelope.py, llguidance
compiling each tool's schema), the ``tools`` parameter's checks (parameters.py), the sampling a
request gets (``SamplingParams`` validating it), results checked against a conversation's real
calls, and ``Detection2DArray`` where ``vision_msgs`` imports. (Over real rclpy:
test_tools_node.py.)
"""

from fractions import Fraction
import json

import pytest

from orin_llm_node import parameters
from orin_llm_node.engine import SamplingParams
from orin_llm_node.parameters import ParameterError, check_parameter
from orin_llm_node.ros import tool_requests
from orin_llm_node.ros.request_envelope import EnvelopeError, parse_envelope, sampling_overrides

POINT = {'name': 'point_at', 'description': 'Point the arm at a shape.',
         'parameters': {'type': 'object',
                        'properties': {'colour': {'enum': ['red', 'blue']},
                                       'shape': {'enum': ['circle', 'square']}},
                        'required': ['colour', 'shape'], 'additionalProperties': False}}
STOP = {'name': 'stop'}
TOOLS = [POINT, STOP]
BAD_SCHEMA = {'name': 'bad', 'parameters': {
    'type': 'object', 'properties': {'x': {'type': 'string', 'pattern': '(unclosed'}}}}


def envelope(**keys):
    return json.dumps({'tag': 't', **keys})


@pytest.mark.parametrize(('keys', 'reason'), [
    ({'prompt': 'x', 'tools': {'name': 'f'}}, 'tools must be a list'),
    ({'prompt': 'x', 'tools': [{'name': 'two words'}]}, 'tools[0].name must be 1-64'),
    ({'prompt': 'x', 'tools': [POINT, POINT]}, "'point_at' is declared twice"),
    ({'prompt': 'x', 'tools': [BAD_SCHEMA]}, "the parameters of tool 'bad'"),
    ({'prompt': 'x', 'tools': [{'name': 'f', 'parameters': {'type': 'array'}}]},
     'must describe an object'),
    ({'prompt': 'x', 'tools': TOOLS, 'tool_choice': {'name': 'jump'}},
     "tool_choice names 'jump', which is not among the tools (point_at, stop)"),
    ({'prompt': 'x', 'tools': TOOLS, 'tool_choice': 'always'}, 'tool_choice must be one of'),
    ({'prompt': 'x', 'tool_choice': 'required'}, "tool_choice 'required' needs tools"),
    ({'prompt': 'x', 'tool_choice': 3}, 'tool_choice must be a string or an object'),
    ({'tools': TOOLS, 'tool_results': [{'id': 'call_1', 'name': 'jump', 'content': 'ok'}]},
     "tool_results[0] names 'jump', which is not a declared tool (point_at, stop)"),
    ({'tool_results': [{'id': 'call_1', 'name': 'stop', 'content': 'ok'}]},
     "names 'stop', which is not a declared tool (no tools)"),
    ({'tool_results': []}, 'tool_results must be a non-empty list'),
    ({'tool_results': [{'id': 'call_1'}]}, 'must be an object with "id", "content"'),
    ({'tool_results': [{'id': 'a', 'content': 'x', 'extra': 1}]}, 'optionally "name"'),
    ({'tool_results': [{'id': '', 'content': 'x'}]}, 'tool_results[0].id must be a non-empty'),
    ({'tool_results': [{'id': 'a', 'content': 5}]}, 'tool_results[0].content must be a string'),
    ({'tool_results': [{'id': 'a', 'content': 'x'}, {'id': 'a', 'content': 'y'}]},
     "answer 'a' twice"),
    ({'detect': []}, 'detect must be a phrase or a non-empty list'),
    ({'detect': ['cup', 'cup']}, 'detect names a label twice'),
    ({'detect': ['say "cup"']}, 'without a double quote'),
    ({'detect': ['cup'], 'response_format': {'type': 'json_object'}},
     'cannot be combined'),
    ({'detect': ['cup'], 'tools': TOOLS}, 'cannot be combined'),
    ({'detect': ['cup'], 'tool_choice': 'none'}, 'detect cannot be combined with tool_choice'),
    ({'detect': 'the cup', 'video_s': 2}, 'detect takes single frames'),
    ({'prompt': 'x', 'tools': TOOLS, 'response_format': {'type': 'json_object'}},
     'response_format and tools cannot be combined'),
    ({'tool_choice': 'auto'}, "'prompt' is required"),
])
def test_tool_keys_are_refused_with_the_reason_and_the_tag(keys, reason):
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(envelope(**keys))
    assert reason in str(err.value), str(err.value)
    assert err.value.tag == 't'


def test_too_many_tools_are_refused_by_size():
    many = [{'name': f'tool_{i}', 'description': 'x' * 400} for i in range(100)]
    with pytest.raises(EnvelopeError, match='tools are too long'):
        parse_envelope(envelope(prompt='x', tools=many))
    assert check_parameter('tools', json.dumps(many)).endswith(
        f'is too long ({len(json.dumps(many))} characters, limit {parameters.MAX_TOOLS_CHARS})')


def test_the_tools_parameter_is_what_a_request_without_tools_may_name():
    tools_text = json.dumps(TOOLS)
    taken = parse_envelope(envelope(prompt='x', tool_choice={'name': 'stop'}), tools_text)
    assert taken['tool_choice'] == {'name': 'stop'}
    results = [{'id': 'call_1', 'name': 'point_at', 'content': 'done'}]
    assert parse_envelope(envelope(tool_results=results), tools_text)['tool_results'] == results
    # An envelope's own tools replace the parameter's; a shaping key leaves no tools.
    with pytest.raises(EnvelopeError, match="names 'point_at', which is not a declared"):
        parse_envelope(envelope(tools=[STOP], tool_results=results), tools_text)
    with pytest.raises(EnvelopeError, match="tool_choice 'required' needs tools"):
        parse_envelope(envelope(prompt='x', tool_choice='required',
                                response_format={'type': 'json_object'}), tools_text)


def test_a_prompt_may_be_left_out_with_detect_or_tool_results():
    env = parse_envelope(envelope(detect=['red cup', 'gripper']))
    assert tool_requests.request_text(env) == (
        'Locate every instance that belongs to the following categories: "red cup, gripper". '
        'Report bbox coordinates in JSON format.')
    env = parse_envelope(envelope(detect='the cup', prompt='Where is the cup?'))
    assert tool_requests.request_text(env) == 'Where is the cup?'
    env = parse_envelope(envelope(tool_results=[{'id': 'c', 'content': 'ok'}]))
    assert tool_requests.request_text(env) == '' and 'prompt' not in env


def sampling_for(values, raw):
    env = parse_envelope(raw, values['tools'])
    return tool_requests.request_sampling(parameters.sampling_params(values), env,
                                          sampling_overrides(env))


def test_the_sampling_a_request_gets():
    values = {p.name: p.default for p in parameters.PARAMETERS}
    values['tools'] = json.dumps(TOOLS)
    plain = sampling_for(values, envelope(prompt='x', max_new_tokens=7))
    assert [t['function']['name'] for t in plain.tools] == ['point_at', 'stop']
    assert plain.max_tokens == 7 and plain.tool_choice is None
    named = sampling_for(values, envelope(prompt='x', tool_choice={'name': 'stop'}))
    assert named.tool_choice == {'name': 'stop'} and len(named.tools) == 2
    boxes = sampling_for(values, envelope(detect=['cup'], temperature=1.0))
    assert (boxes.detect, boxes.tools, boxes.temperature) == (['cup'], None, 1.0)
    fmt = sampling_for(values, envelope(prompt='x', response_format={'type': 'json_object'}))
    assert fmt.tools is None and fmt.response_format == {'type': 'json_object'}
    own = sampling_for(values, envelope(prompt='x', tools=[STOP], tool_choice='required'))
    assert [t['function']['name'] for t in own.tools] == ['stop']
    assert own.tool_choice == 'required'
    none = sampling_for(values, envelope(prompt='x', tools=[]))
    assert none.tools is None
    assert isinstance(none, SamplingParams)


def test_the_tools_parameter_is_checked_like_response_format():
    assert check_parameter('tools', '') is None
    assert check_parameter('tools', json.dumps(TOOLS)) is None
    assert "the parameters of tool 'bad'" in check_parameter('tools', json.dumps([BAD_SCHEMA]))
    assert 'not JSON' in check_parameter('tools', '[{')
    assert 'tools must be a list' in check_parameter('tools', '{"name": "f"}')
    assert 'tools must be a list' in check_parameter('tools', '0')
    assert check_parameter('tools', '[]') is None
    values = {p.name: p.default for p in parameters.PARAMETERS}
    values.update(tools=json.dumps(TOOLS), response_format='{"type": "json_object"}')
    with pytest.raises(ParameterError, match='response_format and tools cannot be combined'):
        parameters.check_parameters(values)


def test_results_are_checked_against_the_calls_they_answer(tiny_ckpt):
    from orin_llm_node.engine import EngineConfig, LLMEngine
    with LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32')) as eng:
        conv = eng.new_conversation()
        res = eng.chat(conv, 'Point at the red circle.', sampling=SamplingParams(
            max_tokens=64, tools=TOOLS, tool_choice={'name': 'point_at'}))
        assert res.finish_reason == 'tool_calls' and res.tool_calls, res
        call = res.tool_calls[0]
        pending = conv.pending_tool_calls()
        named = [{'id': call['id'], 'name': 'point_at', 'content': 'pointed'}]
        assert tool_requests.engine_results(named, pending) == [
            {'id': call['id'], 'content': 'pointed'}]
        with pytest.raises(ValueError, match=f"names 'stop', but call '{call['id']}' called "
                                             "'point_at'"):
            tool_requests.engine_results([{**named[0], 'name': 'stop'}], pending)
        # An id of no call: the engine's own refusal, before anything changes.
        with pytest.raises(ValueError, match='which is not a call of the last answer'):
            eng.chat(conv, None, tool_results=tool_requests.engine_results(
                [{'id': 'call_x', 'content': 'x'}], pending))


def test_detection2darray_holds_the_boxes_in_the_frames_pixels():
    msgs = pytest.importorskip('vision_msgs.msg', reason='vision_msgs is not installed')
    from std_msgs.msg import Header

    from orin_llm_node.ros.detections_topic import detection_array
    header = Header(frame_id='front_camera')
    header.stamp.sec, header.stamp.nanosec = 12, 345
    entries = [{'label': 'red cup', 'bbox': [float(Fraction(3 * 640, 10)), 48.0, 400.0, 96.5]}]
    out = detection_array(msgs, header, entries)
    assert out.header == header and len(out.detections) == 1
    det = out.detections[0]
    assert det.header == header
    assert (det.bbox.center.position.x, det.bbox.center.position.y) == (296.0, 72.25)
    assert (det.bbox.size_x, det.bbox.size_y) == (208.0, 48.5)
    assert det.results[0].hypothesis.class_id == 'red cup'
