# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The official ``openai`` Python client as a client of orin_llm_serve (what agent stacks use).

A round trip with an image as a data URL, streamed and not, and a JSON-schema answer: the
client parses every response, and the answers are the local engine's.
"""

import base64
import io
from pathlib import Path

import pytest
from serve_support import Server
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.testing import shapes

openai = pytest.importorskip('openai')
from PIL import Image  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
SCHEMA = {'type': 'object', 'properties': {
    'colour': {'type': 'string', 'enum': list(shapes.COLOURS)},
    'shape': {'type': 'string', 'enum': list(shapes.SHAPES)}},
    'required': ['colour', 'shape'], 'additionalProperties': False}


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    torch.set_num_threads(2)
    srv = Server(DEMO, tmp_path_factory.mktemp('serve') / 'serve.log').start()
    client = openai.OpenAI(base_url=srv.url, api_key='unused', max_retries=0, timeout=120)
    local = LLMEngine(EngineConfig(model_path=DEMO, device='cpu', dtype='float32'))
    yield client, local
    client.close()
    srv.stop()


def _data_url(rgb):
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format='PNG')
    return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode()


def _messages(image, question):
    return [{'role': 'user', 'content': [
        {'type': 'image_url', 'image_url': {'url': _data_url(image)}},
        {'type': 'text', 'text': question}]}]


def test_models_list(served):
    client, _ = served
    assert [m.id for m in client.models.list()] == ['demo_model']


@pytest.mark.parametrize('stream', [False, True], ids=['whole', 'streamed'])
def test_round_trip_with_an_image(served, stream):
    client, local = served
    scene = shapes.simple_scene('triangle', 'yellow', height=160, width=160)
    want = local.chat(local.new_conversation(), 'What shape is it?', images=[scene.image],
                      sampling=SamplingParams(max_tokens=16))
    reply = client.chat.completions.create(
        model='demo_model', messages=_messages(scene.image, 'What shape is it?'),
        max_tokens=16, temperature=0, stream=stream,
        **({'stream_options': {'include_usage': True}} if stream else {}))
    if stream:
        chunks = list(reply)
        text = ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
    else:
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        usage = reply.usage
    assert text == want.text and 'triangle' in text
    assert finish == want.finish_reason
    assert usage.completion_tokens == len(want.token_ids)
    assert usage.prompt_tokens == len(want.prompt_token_ids)


def test_a_json_schema_answer(served):
    client, local = served
    scene = shapes.simple_scene('square', 'blue', height=160, width=160)
    fmt = {'type': 'json_schema', 'schema': SCHEMA}
    want = local.chat(local.new_conversation(), 'Describe the shape.', images=[scene.image],
                      sampling=SamplingParams(max_tokens=48, response_format=fmt))
    reply = client.chat.completions.create(
        model='demo_model', messages=_messages(scene.image, 'Describe the shape.'),
        max_tokens=48, response_format={'type': 'json_schema', 'json_schema': {
            'name': 'shape', 'schema': SCHEMA, 'strict': True}})
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == 'stop' and want.parsed['colour'] == 'blue'


def test_errors_arrive_as_the_client_s_exceptions(served):
    client, _ = served
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model='gpt-4o', messages=[
            {'role': 'user', 'content': 'hi'}])
    with pytest.raises(openai.BadRequestError, match='tools is not supported'):
        client.chat.completions.create(model='demo_model', messages=[
            {'role': 'user', 'content': 'hi'}], tools=[{'type': 'function', 'function': {
                'name': 'move', 'parameters': {'type': 'object'}}}])
