# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Constrained decoding through LLMEngine: every constrained answer parses and validates.

* the demo checkpoint with images (json_schema: the README's robot schema; json_object);
* random tiny checkpoints (random weights, greedy and sampled): valid JSON or ``length``;
* regex answers match their pattern; ``length`` is never ``valid``;
* the refusals (a schema the library rejects, ``ignore_eos``, the library missing) happen
  before anything changes, and unconstrained answers stay as they were.

The graph path (mask written before the pick graph) is covered in test_kernels_emulated.py
(CPU) and test_cuda_graph.py (GPU).
"""

import json
from pathlib import Path
import re
import sys

from _structured_cases import ROBOT_SCHEMA
import jsonschema
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.engine.structured import StructuredUnavailable
from orin_llm_node.testing import shapes

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
NESTED_SCHEMA = {
    'type': 'object',
    'properties': {
        'objects': {'type': 'array', 'maxItems': 3, 'items': {
            'type': 'object',
            'properties': {'name': {'type': 'string', 'maxLength': 12},
                           'graspable': {'type': 'boolean'},
                           'position': {'type': 'object', 'properties': {
                               'x': {'type': 'number'}, 'y': {'type': 'number'}},
                               'required': ['x', 'y'], 'additionalProperties': False}},
            'required': ['name', 'graspable', 'position'], 'additionalProperties': False}},
        'action': {'enum': ['pick', 'place', 'wait']},
    },
    'required': ['objects', 'action'],
    'additionalProperties': False,
}
REGEX = r'(left|right|ahead), [0-9]{1,3} cm'


def schema_format(schema):
    return {'type': 'json_schema', 'schema': schema}


def check_answer(res, fmt):
    """A constrained answer: complete and valid, or cut by ``length`` and never valid."""
    if res.finish_reason == 'length':
        assert res.valid is False and res.parsed is None
        return False
    assert res.finish_reason == 'stop', res
    assert res.valid is True, res.text
    if fmt['type'] == 'regex':
        assert re.fullmatch(fmt['pattern'], res.text), res.text
        assert res.parsed is None
        return True
    assert res.parsed == json.loads(res.text)
    jsonschema.validate(res.parsed, fmt.get('schema', {'type': 'object'}))
    return True


@pytest.fixture(scope='module')
def demo():
    torch.set_num_threads(2)
    return LLMEngine(EngineConfig(model_path=DEMO, device='cpu', dtype='float32',
                                  enable_cuda_graph=False, block_order_seed=5))


@pytest.mark.parametrize('kind,colour', [('circle', 'red'), ('square', 'blue'),
                                         ('star', 'green')])
def test_demo_robot_schema_with_images(demo, kind, colour):
    scene = shapes.simple_scene(kind, colour, height=160, width=200)
    fmt = schema_format(ROBOT_SCHEMA)
    conv = demo.new_conversation()
    res = demo.chat(conv, 'What colour is the shape?', images=[scene.image],
                    sampling=SamplingParams(max_tokens=48, response_format=fmt))
    assert check_answer(res, fmt)
    assert res.parsed['colour'] == colour
    demo.reset(conv)


def test_demo_json_object_and_a_follow_up_in_the_same_conversation(demo):
    scene = shapes.simple_scene('triangle', 'yellow', height=160, width=160)
    conv = demo.new_conversation()
    fmt = {'type': 'json_object'}
    res = demo.chat(conv, 'What shape is it?', images=[scene.image],
                    sampling=SamplingParams(max_tokens=64, response_format=fmt))
    check_answer(res, fmt)
    assert res.parsed is None or isinstance(res.parsed, dict)
    # The next, unconstrained turn still gets a plain answer from the same history.
    follow = demo.chat(conv, 'And what colour is it?', sampling=SamplingParams(max_tokens=8))
    assert follow.valid is None and follow.text == 'yellow.'
    demo.reset(conv)


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('fmt', [schema_format(ROBOT_SCHEMA), schema_format(NESTED_SCHEMA),
                                 {'type': 'json_object'}, {'type': 'regex', 'pattern': REGEX}],
                         ids=['robot', 'nested', 'json_object', 'regex'])
def test_random_weights_give_valid_answers_or_length(make_ckpt, fmt, seed):
    eng = LLMEngine(EngineConfig(model_path=make_ckpt(f'structured{seed}', seed=seed),
                                 device='cpu', dtype='float32', block_order_seed=seed))
    complete = 0
    for i, sampling in enumerate([SamplingParams(max_tokens=80, response_format=fmt),
                                  SamplingParams(max_tokens=80, temperature=1.0, seed=seed,
                                                 response_format=fmt),
                                  SamplingParams(max_tokens=80, temperature=0.7, top_k=20,
                                                 seed=7, response_format=fmt)]):
        conv = eng.new_conversation('You are a robot.')
        res = eng.chat(conv, f'Report object {i} as asked.', sampling=sampling)
        complete += check_answer(res, fmt)
        eng.reset(conv)
    if fmt['type'] == 'regex' or fmt.get('schema') is ROBOT_SCHEMA:
        assert complete >= 1  # short grammars complete within 80 tokens


def test_length_cut_is_not_valid(demo):
    fmt = schema_format(ROBOT_SCHEMA)
    conv = demo.new_conversation()
    res = demo.chat(conv, 'What colour is the shape?', sampling=SamplingParams(
        max_tokens=3, response_format=fmt))
    assert res.finish_reason == 'length' and res.valid is False and res.parsed is None
    demo.reset(conv)


def test_unconstrained_answers_carry_no_verdict(demo):
    conv = demo.new_conversation()
    res = demo.chat(conv, 'Hello?', sampling=SamplingParams(max_tokens=8))
    assert res.valid is None and res.parsed is None
    demo.reset(conv)


def test_refusals_before_anything_changes(demo):
    conv = demo.new_conversation()
    before = list(conv.token_ids)
    bad = {'type': 'json_schema', 'schema': {'type': 'object', 'properties': {
        'x': {'type': 'string', 'pattern': '(unclosed'}}}}
    with pytest.raises(ValueError, match='response_format'):
        demo.chat(conv, 'Hi', sampling=SamplingParams(response_format=bad))
    assert conv.token_ids == before and demo.stats().used_blocks == 0
    with pytest.raises(ValueError, match='ignore_eos'):
        SamplingParams(ignore_eos=True, response_format={'type': 'json_object'})
    with pytest.raises(ValueError, match='response_format.type'):
        SamplingParams(response_format={'type': 'yaml'})


def test_without_the_library_constrained_requests_are_refused(tiny_ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, 'llguidance', None)  # import llguidance now fails
    eng = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32'))
    eng.warmup(image_sizes=[])  # skips indexing the vocabulary without the library
    conv = eng.new_conversation()
    with pytest.raises(StructuredUnavailable, match='pip install llguidance'):
        eng.chat(conv, 'Hi', sampling=SamplingParams(response_format={'type': 'json_object'}))
    res = eng.chat(conv, 'Hi', sampling=SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(res.token_ids) == 4 and res.valid is None
