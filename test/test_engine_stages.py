# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``chat_stream(on_stage=...)``: the stages of a turn, told in order, on a real tiny engine.

The callback sees encoding images (only when the vision tower or its cache has work for the
turn), prefill and decoding; the stream itself is untouched (one event per token, the same
answer); a ``cancel()`` from the callback stops the turn before its first token.
"""

from _image_samples import red_disc
import pytest

from orin_llm_node.engine import EngineConfig, FinishReason, LLMEngine, SamplingParams, Stage

GREEDY = SamplingParams(max_tokens=5, ignore_eos=True)


@pytest.fixture(scope='module')
def engine(tiny_ckpt):
    return LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32'))


def _run(engine, conv, text, images=(), on_stage=None, sampling=GREEDY):
    return list(engine.chat_stream(conv, text, images=list(images), sampling=sampling,
                                   on_stage=on_stage))


def test_the_stages_come_in_order_and_leave_the_stream_as_it_was(engine, tiny_ckpt):
    image = red_disc(96, 128)
    told, conv = [], engine.new_conversation()
    events = _run(engine, conv, 'What is this?', [image], told.append)
    # The same turn without a callback, on an engine of its own (nothing cached).
    other = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32'))
    expected = _run(other, other.new_conversation(), 'What is this?', [image])
    assert told == [Stage.ENCODING_IMAGES, Stage.PREFILL, Stage.DECODING]
    assert [(e.delta, e.token_id) for e in events] == [(e.delta, e.token_id) for e in expected]
    assert events[-1].result.token_ids == expected[-1].result.token_ids
    # Text alone: no image stage.
    told.clear()
    _run(engine, conv, 'And now?', on_stage=told.append)
    assert told == [Stage.PREFILL, Stage.DECODING]
    engine.reset(conv)


def test_an_image_in_the_cached_prefix_is_not_encoded_again(engine):
    image = red_disc(64, 64)
    conv = engine.new_conversation()
    _run(engine, conv, 'Look.', [image])
    engine.reset(conv)              # its blocks stay as prefix cache
    told, again = [], engine.new_conversation()
    result = _run(engine, again, 'Look.', [image], told.append)[-1].result
    assert result.cached_tokens > 0 and told == [Stage.PREFILL, Stage.DECODING]
    engine.reset(again)


@pytest.mark.parametrize('stage', [Stage.ENCODING_IMAGES, Stage.PREFILL])
def test_a_cancel_from_the_callback_stops_the_turn_before_its_first_token(engine, stage):
    engine.reset()
    conv = engine.new_conversation()

    def on_stage(name):
        if name == stage:
            engine.cancel()

    events = _run(engine, conv, 'What is this?', [red_disc(80, 80)], on_stage)
    result = events[-1].result
    assert result.finish_reason == FinishReason.CANCELLED and result.token_ids == []
    assert len(events) == 1
    # The engine answers the next turn as ever.
    assert _run(engine, conv, 'Again?')[-1].result.finish_reason == FinishReason.LENGTH
    engine.reset(conv)


def test_the_openai_backend_tells_the_stages_a_client_can_see(tiny_ckpt, tmp_path):
    pytest.importorskip('httpx')
    pytest.importorskip('fastapi')
    from serve_support import Server

    from orin_llm_node.backends import OpenAIBackend, OpenAIConfig
    server = Server(tiny_ckpt, tmp_path / 'serve.log', '--max-model-len', '2048').start()
    backend = OpenAIBackend(OpenAIConfig(server.url, tiny_ckpt.name,
                                         processor_path=str(tiny_ckpt)))
    try:
        told, seen = [], []
        for event in backend.chat_stream(backend.new_conversation(), 'What is this?',
                                         images=[red_disc(64, 64)], sampling=GREEDY,
                                         on_stage=told.append):
            seen.append((list(told), event.delta))
        # The server encodes and prefills out of sight: prefill once sent, decoding before
        # the first text.
        assert told == [Stage.PREFILL, Stage.DECODING]
        assert seen[0][0] == told and ''.join(d for _, d in seen) == event.result.text
    finally:
        backend.close()
        server.stop()
