# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""M-RoPE positions against transformers' Qwen3VLModel.get_rope_index (5.23.0)."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache, Qwen3VLForConditionalGeneration

from orin_llm_node.processing import (
    ChatTemplate,
    ImageProcessor,
    Tokenizer,
    rope_delta,
    rope_positions,
    user_message,
)

SYSTEM = {'role': 'system', 'content': 'You are a helpful robot.'}


@pytest.fixture(scope='module')
def ref_model(tiny_ckpt):
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_ckpt, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope='module')
def pipeline(tiny_ckpt):
    return (ChatTemplate.from_pretrained(tiny_ckpt), Tokenizer.from_pretrained(tiny_ckpt),
            ImageProcessor.from_pretrained(tiny_ckpt))


def prompt(pipeline, messages, sizes, add_generation_prompt=True):
    """Token ids (pads expanded) and image grids of a rendered conversation."""
    template, tok, proc = pipeline
    grids, counts = [], []
    for h, w in sizes:
        new_h, new_w = proc.target_size(h, w)
        grids.append((1, new_h // proc.patch_size, new_w // proc.patch_size))
        counts.append(proc.num_tokens(h, w))
    text = template.render(messages, add_generation_prompt=add_generation_prompt)
    return tok.expand_image_pads(tok.encode(text), counts), grids


def reference(ref_model, tok, ids, grids):
    input_ids = torch.tensor([ids])
    mm_types = (input_ids == tok.image_pad_id).int()
    grid_thw = torch.tensor(grids, dtype=torch.long) if grids else None
    with torch.no_grad():
        pos, delta = ref_model.model.get_rope_index(input_ids, mm_token_type_ids=mm_types,
                                                    image_grid_thw=grid_thw)
    return pos[:, 0].numpy(), int(delta.item())


def image_spans(ids, pad):
    """(start, end) of every run of image pads."""
    arr = np.asarray(ids) == pad
    edges = np.flatnonzero(np.diff(np.concatenate(([0], arr.astype(np.int8), [0]))))
    return list(zip(edges[::2], edges[1::2], strict=True))


CASES = {
    'text_only': ([SYSTEM, user_message('What is in front of you?')], []),
    'one_image': ([SYSTEM, user_message('What is in front of you?', 1)], [(96, 160)]),
    'two_images': ([SYSTEM, user_message('Compare the two pictures.', 2)],
                   [(224, 128), (97, 203)]),
    'tall_and_wide': ([user_message('Which is taller?', 3)], [(640, 480), (64, 64),
                                                              (1280, 720)]),
}


@pytest.mark.parametrize('name', list(CASES))
def test_positions_equal_get_rope_index(ref_model, pipeline, name):
    tok = pipeline[1]
    messages, sizes = CASES[name]
    ids, grids = prompt(pipeline, messages, sizes)
    ours, next_start = rope_positions(ids, grids, tok.image_pad_id, 2)
    ref, ref_delta = reference(ref_model, tok, ids, grids)
    assert ours.dtype == np.int64 and ours.shape == (3, len(ids))
    np.testing.assert_array_equal(ours, ref)
    assert next_start == ours.max() + 1
    assert rope_delta(ours) == ref_delta == next_start - len(ids)
    if grids:
        assert ref_delta < 0  # images really compress positions, so the test can see it


def test_two_turns_incremental_equals_whole(ref_model, pipeline):
    template, tok, _ = pipeline
    turn1 = [SYSTEM, user_message('What is in front of you?', 1)]
    sizes1 = [(224, 128)]
    answer = 'A red circle on a grey floor.'
    turn2 = [*turn1, {'role': 'assistant', 'content': answer},
             user_message('And now? How many shapes are there?', 2)]
    sizes2 = sizes1 + [(640, 480), (96, 160)]

    ids1, grids1 = prompt(pipeline, turn1, sizes1)
    ids_all, grids_all = prompt(pipeline, turn2, sizes2)
    # The engine keeps the generated ids; here they are the tokens of the answer + <|im_end|>.
    generated = tok.encode(answer) + [tok.im_end_id]
    assert ids_all[:len(ids1) + len(generated)] == ids1 + generated

    pos1, start = rope_positions(ids1, grids1, tok.image_pad_id, 2)
    # Decode tokens continue at next_start, i.e. sequence index + rope delta.
    delta = rope_delta(pos1)
    gen_pos, start = rope_positions(generated, [], tok.image_pad_id, 2, start=start)
    np.testing.assert_array_equal(
        gen_pos, np.broadcast_to(np.arange(len(generated)) + len(ids1) + delta, gen_pos.shape))
    rest = ids_all[len(ids1) + len(generated):]
    pos2, end = rope_positions(rest, grids_all[1:], tok.image_pad_id, 2, start=start)

    ref, ref_delta = reference(ref_model, tok, ids_all, grids_all)
    np.testing.assert_array_equal(np.concatenate([pos1, gen_pos, pos2], axis=1), ref)
    assert end - len(ids_all) == ref_delta
    assert rope_delta(pos2, seq_len=len(ids_all)) == ref_delta


def test_any_split_outside_images_is_incremental(pipeline):
    tok = pipeline[1]
    ids, grids = prompt(pipeline, *CASES['two_images'])
    whole, whole_next = rope_positions(ids, grids, tok.image_pad_id, 2)
    spans = image_spans(ids, tok.image_pad_id)
    assert len(spans) == 2
    for cut in range(len(ids) + 1):
        if any(lo < cut < hi for lo, hi in spans):
            continue
        n_before = sum(hi <= cut for _, hi in spans)
        a, mid = rope_positions(ids[:cut], grids[:n_before], tok.image_pad_id, 2)
        b, end = rope_positions(ids[cut:], grids[n_before:], tok.image_pad_id, 2, start=mid)
        np.testing.assert_array_equal(np.concatenate([a, b], axis=1), whole)
        assert end == whole_next


def test_decode_positions_equal_reference_cache_path(ref_model, pipeline):
    """Decode step as transformers does it: arange(past_len, ...) + rope_deltas, all axes."""
    tok = pipeline[1]
    ids, grids = prompt(pipeline, *CASES['two_images'])
    pos, next_start = rope_positions(ids, grids, tok.image_pad_id, 2)
    inner = ref_model.model
    _, deltas = reference(ref_model, tok, ids, grids)
    text_cfg = ref_model.config.text_config
    cache = DynamicCache(config=ref_model.config)
    kv = torch.zeros(1, text_cfg.num_key_value_heads, len(ids), text_cfg.head_dim)
    for layer in range(text_cfg.num_hidden_layers):
        cache.update(kv, kv, layer)
    inner.rope_deltas = torch.tensor([[deltas]])
    try:
        step = inner.compute_3d_position_ids(
            input_ids=torch.tensor([[tok.im_end_id]]),
            inputs_embeds=torch.zeros(1, 1, text_cfg.hidden_size),
            past_key_values=cache,
        )
    finally:
        inner.rope_deltas = None
    assert step.shape == (3, 1, 1)
    assert step.flatten().tolist() == [len(ids) + rope_delta(pos)] * 3 == [next_start] * 3


def test_mismatched_pads_raise():
    pad = 5
    with pytest.raises(ValueError, match='needs 4 pad tokens'):
        rope_positions([1, pad, pad, 2], [(1, 4, 4)], pad, 2)
    with pytest.raises(ValueError, match='more image pad tokens'):
        rope_positions([1, pad, 2], [], pad, 2)
    with pytest.raises(ValueError, match='cover only 1'):
        rope_positions([1, pad, 2], [(1, 2, 2), (1, 2, 2)], pad, 2)
    with pytest.raises(ValueError, match='not divisible'):
        rope_positions([pad] * 3, [(1, 2, 3)], pad, 2)


def test_adjacent_images_and_empty_input():
    pad = 5
    # Two images whose pads touch are still told apart by their grids.
    ids = [1] + [pad] * 6 + [pad] * 4 + [2]
    pos, nxt = rope_positions(ids, [(1, 4, 6), (1, 4, 4)], pad, 2)
    first, mid = rope_positions([1] + [pad] * 6, [(1, 4, 6)], pad, 2)
    second, end = rope_positions([pad] * 4 + [2], [(1, 4, 4)], pad, 2, start=mid)
    np.testing.assert_array_equal(pos, np.concatenate([first, second], axis=1))
    assert nxt == end == 1 + 3 + 2 + 1
    empty, start = rope_positions([], [], pad, 2, start=7)
    assert empty.shape == (3, 0) and start == 7
    assert rope_delta(empty, seq_len=0) == 0
