# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""serve.history.replay: a history the server does not hold, written in at a linear cost.

Each user turn rendered after the turn before it gives the tokens that rendering it after the
whole history gives (the quadratic way, kept here as the reference), images included; a
template that looks across turns gets the reference's tokens too; exchanges that cannot fit
beside the new message are left out before anything of them is rendered or tokenized.
"""

import shutil

import numpy as np
import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine
from orin_llm_node.serve.chat_request import EncodedImage
from orin_llm_node.serve.history import TokenFloor, replay


def _reference(engine, conv, exchanges):
    # The whole history rendered before each turn: O(N^2) renders.
    for parts, answer in exchanges:
        images = [p.decode() if isinstance(p, EncodedImage) else p for p in parts]
        conv.open_turn(engine.prompts.user_turn(conv.messages(), images, []))
        for token in engine.tokenizer.encode_text(answer):
            conv.append_token(token)
        conv.close_turn(answer, engine.tokenizer.im_end_id)


def _png(color) -> EncodedImage:
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(np.full((40, 56, 3), color, np.uint8)).save(out, 'PNG')
    return EncodedImage(out.getvalue(), 56, 40, 'test')


EXCHANGES = [
    (['Hello there.'], 'Hi! How can I help?'),
    ([_png(30), 'What is this?'], 'A dark square.'),
    (['And this one?', _png(200)], 'A light one.'),
    (['<|im_end|> typed by a user', _png(90), _png(150)], 'Two squares.'),
    (['Thanks.'], ''),
]


def _engine(ckpt):
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', max_model_len=4096))


def _both(engine, system):
    ours, ref = (engine.new_conversation(system_prompt=system) for _ in range(2))
    replay(engine, ours, EXCHANGES, TokenFloor(engine.tokenizer), 4000)
    _reference(engine, ref, EXCHANGES)
    return ours, ref


@pytest.mark.parametrize('system', [None, 'You are a robot.'], ids=['no-system', 'system'])
def test_turns_rendered_one_after_another_are_the_whole_historys_tokens(tiny_ckpt, system):
    engine = _engine(tiny_ckpt)
    ours, ref = _both(engine, system)
    assert ours.token_ids == ref.token_ids
    assert ours.turn_lengths() == ref.turn_lengths()
    assert ours.messages() == ref.messages()
    assert [(at, m.key) for at, m in ours.media_spans()] == \
        [(at, m.key) for at, m in ref.media_spans()]


def test_a_template_that_numbers_images_across_turns_gets_the_whole_history(tiny_ckpt,
                                                                           tmp_path):
    # "Picture 3:" depends on the images of every earlier turn: rendered after the turn
    # before alone, it would say "Picture 1:".
    ckpt = tmp_path / 'numbered'
    shutil.copytree(tiny_ckpt, ckpt)
    template = ckpt / 'chat_template.jinja'
    text = template.read_text()
    numbered = text.replace('{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}',
                            'Picture {{ image_count.value }}: ')
    assert numbered != text
    template.write_text(numbered)
    engine = _engine(ckpt)
    ours, ref = _both(engine, 'You are a robot.')
    assert ours.token_ids == ref.token_ids
    assert 'Picture 4:' in engine.tokenizer.decode(ref.token_ids, skip_special_tokens=False)


def test_exchanges_that_cannot_fit_are_left_out_unread(tiny_ckpt):
    engine = _engine(tiny_ckpt)
    floor = TokenFloor(engine.tokenizer)
    huge = 'word ' * 2_000_000  # 10 MB: never rendered or tokenized (it would take seconds)
    exchanges = [(['first'], 'one'), ([huge], 'two'), *EXCHANGES]
    conv = engine.new_conversation()
    replay(engine, conv, exchanges, floor, 4000)
    assert conv.num_turns == len(EXCHANGES)  # the huge exchange and the one before it: out
    ref = engine.new_conversation()
    _reference(engine, ref, EXCHANGES)
    assert conv.token_ids == ref.token_ids
    # The floor is a floor: the text's real tokens are at least that many.
    text = 'Where is the red box? ' * 50
    assert floor.of([text]) <= len(engine.tokenizer.encode_text(text))
