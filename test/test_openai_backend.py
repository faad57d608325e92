# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-API backend against orin_llm_serve on loopback: the local engine's answers.

Both sides are real: the backend's httpx client and SSE stream, the server's FastAPI/uvicorn
stack in a subprocess, the same checkpoint. A multi-turn conversation with a system prompt,
images, sampled and JSON answers gives token for token what ``LLMEngine`` gives in-process;
a conversation the server no longer keeps is rebuilt from its messages and still hits the
prefix cache.
"""

from pathlib import Path

import numpy as np
import pytest
from serve_support import Server, free_port
import torch

from orin_llm_node.backends import OpenAIBackend, OpenAIConfig
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.testing import shapes

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
MAX_MODEL_LEN = 2048
ROBOT_SCHEMA = {
    'type': 'object',
    'properties': {'colour': {'type': 'string', 'enum': list(shapes.COLOURS)},
                   'shape': {'type': 'string', 'enum': list(shapes.SHAPES)},
                   'count': {'type': 'integer', 'minimum': 1, 'maximum': 3}},
    'required': ['colour', 'shape', 'count'], 'additionalProperties': False,
}


@pytest.fixture(scope='module', params=['tiny', 'demo'])
def pair(request, make_ckpt, tmp_path_factory):
    """(checkpoint, local engine, backend on a server of the same checkpoint)."""
    torch.set_num_threads(2)
    ckpt = make_ckpt('default') if request.param == 'tiny' else DEMO
    server = Server(ckpt, tmp_path_factory.mktemp('serve') / 'serve.log',
                    '--max-model-len', str(MAX_MODEL_LEN), '--max-conversations', '1').start()
    local = LLMEngine(EngineConfig(model_path=ckpt, device='cpu', dtype='float32',
                                   max_model_len=MAX_MODEL_LEN, block_order_seed=3))
    backend = OpenAIBackend(OpenAIConfig(server.url, ckpt.name, return_token_ids=True,
                                         processor_path=str(ckpt)))
    yield request.param, local, backend
    backend.close()
    server.stop()


def _turns():
    rng = np.random.default_rng(5)
    scene = shapes.simple_scene('circle', 'red', height=160, width=200)
    other = shapes.simple_scene('square', 'blue', height=120, width=160)
    noise = rng.integers(0, 256, (90, 140, 3), dtype=np.uint8)
    return [
        ('What is in front of you?', [scene.image], SamplingParams(max_tokens=12)),
        ('And what colour is it?', [], SamplingParams(max_tokens=12)),
        (['left camera:', other.image, 'right camera:', noise, 'What moved?'], [],
         SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=3)),
        ('Report the shape as JSON.', [scene.image],
         SamplingParams(max_tokens=48, response_format={'type': 'json_schema',
                                                        'schema': ROBOT_SCHEMA})),
        ('Any JSON object, please.', [], SamplingParams(max_tokens=32,
                                                        response_format={'type': 'json_object'})),
    ]


def _remote(backend, conv, text, images, sampling):
    deltas, result = [], None
    for event in backend.chat_stream(conv, text, images=images, sampling=sampling):
        deltas.append(event.delta)
        result = event.result
    return ''.join(deltas), result


def test_answers_are_token_identical_to_the_local_engine(pair):
    which, local, backend = pair
    lconv = local.new_conversation('You are a careful robot.')
    rconv = backend.new_conversation('You are a careful robot.')
    finishes = []
    for i, (text, images, sampling) in enumerate(_turns()):
        want = local.chat(lconv, text, images=images, sampling=sampling)
        streamed, got = _remote(backend, rconv, text, images, sampling)
        assert got.error is None, got.error
        assert got.token_ids == want.token_ids, (which, i)
        assert got.text == want.text == streamed
        assert got.prompt_token_ids == want.prompt_token_ids
        assert got.finish_reason == want.finish_reason
        assert (got.valid, got.parsed) == (want.valid, want.parsed)
        assert got.prompt_tokens == len(want.prompt_token_ids)
        assert got.completion_tokens == len(want.token_ids)
        assert len(got.prompt_images) == len(want.prompt_images)
        for a, b in zip(got.prompt_images, want.prompt_images, strict=True):
            np.testing.assert_array_equal(a, b)     # sent at the size the model sees
        # The server continued the conversation as the local engine did: the same prefix hit.
        assert got.cached_tokens == want.cached_tokens
        if i:
            assert got.cached_tokens > 0
        assert got.model == backend.model and got.ttft_s > 0
        finishes.append(got.finish_reason)
    assert rconv.num_turns == len(_turns())
    if which == 'demo':     # the trained checkpoint answers the schema in full
        assert finishes[3] == 'stop'
    stats = backend.stats()
    assert stats.reachable and stats.errors == 0 and stats.requests >= len(_turns())
    assert stats.last_ttft_s > 0 and stats.server_model == backend.model


def test_a_conversation_the_server_dropped_is_rebuilt_from_its_messages(pair):
    # The server keeps one conversation (--max-conversations 1): B's turn evicts A, so A's
    # second turn is rebuilt from the messages; its blocks are still in the prefix cache.
    which, local, backend = pair
    scene = shapes.simple_scene('star', 'green', height=160, width=160)
    greedy = SamplingParams(max_tokens=10)
    la, ra = local.new_conversation(), backend.new_conversation()
    rb = backend.new_conversation('Be brief.')
    first = local.chat(la, 'What is this?', images=[scene.image], sampling=greedy)
    assert backend.chat(ra, 'What is this?', images=[scene.image],
                        sampling=greedy).token_ids == first.token_ids
    assert backend.chat(rb, 'Hello', sampling=greedy).error is None
    retokenized = local.tokenizer.encode_text(first.text)
    want = local.chat(la, 'What colour is it?', sampling=greedy)
    got = backend.chat(ra, 'What colour is it?', sampling=greedy)
    assert got.error is None
    # The rebuilt history holds the answer as the template renders it: the same tokens as
    # the kept one wherever the answer tokenizes back to what was generated.
    if which == 'demo':
        assert retokenized + [local.tokenizer.im_end_id] == first.token_ids
        assert got.prompt_token_ids == want.prompt_token_ids
        assert got.token_ids == want.token_ids
    assert got.cached_tokens >= 16     # at least the image's blocks came from the cache


@pytest.mark.parametrize('ask', [
    {'sampling': SamplingParams(tools=[{'name': 'stop'}])},
    {'sampling': SamplingParams(detect='the shape')},
    {'tool_results': [{'id': 'call_0', 'content': 'done'}]},
], ids=['tools', 'detect', 'tool_results'])
def test_tools_detect_and_tool_results_are_refused_before_anything_is_sent(ask):
    # No server at all: the refusal comes before any connection is tried.
    backend = OpenAIBackend(OpenAIConfig(f'http://127.0.0.1:{free_port()}/v1', 'm'))
    conv = backend.new_conversation()
    with pytest.raises(ValueError, match='backend openai sends no tools, tool results or detect'):
        backend.chat(conv, 'Point at the shape.', **ask)
    assert backend.stats().requests == 0 and conv.num_turns == 0
    backend.close()
