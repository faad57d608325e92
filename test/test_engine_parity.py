# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""LLMEngine greedy output == transformers generate, token for token (CPU, fp32, tiny model).

Paged KV with block sizes 16 and 4 and a permuted free queue (block tables are never the
identity), so slot mapping, block-table gathers, block boundaries and the bottom-right mask
all have to be right for the tokens to match.
"""

from _engine_reference import Reference, random_image
import numpy as np
import pytest
from transformers import AutoTokenizer

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def make_engine(ckpt, block_size, **kw):
    kw.setdefault('num_kv_blocks', 4096 // block_size)
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', block_size=block_size,
                                  block_order_seed=100 + block_size, **kw))


@pytest.fixture(scope='module', params=[16, 4], ids=lambda b: f'block{b}')
def engine(request, tiny_ckpt):
    eng = make_engine(tiny_ckpt, request.param)
    yield eng
    eng.reset()


def check_turn(engine, ref, conv, text, images=(), max_tokens=24, ignore_eos=False):
    res = engine.chat(conv, text, images=list(images),
                      sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))
    assert res.finish_reason in ('stop', 'length')
    expected = ref.generate(res.prompt_token_ids, res.prompt_images, max_tokens, ignore_eos)
    assert res.token_ids == expected
    return res


def test_text_only(engine, ref):
    conv = engine.new_conversation()
    res = check_turn(engine, ref, conv, 'What is in front of you?')
    assert len(res.token_ids) >= 4  # a degenerate one-token answer would prove little
    assert res.prompt_images == [] and res.cached_tokens == 0
    assert conv.block_table != sorted(conv.block_table)  # permuted free queue
    engine.reset(conv)


def test_one_image(engine, ref):
    conv = engine.new_conversation('You are a helpful assistant running on a robot.')
    img = random_image(1, 100, 130)
    res = check_turn(engine, ref, conv, 'Describe the image.', [img])
    # The conversation keeps the image at the size the model sees, not the frame.
    resize = engine.prompts.image_processor.resize
    assert len(res.prompt_images) == 1
    assert np.array_equal(res.prompt_images[0], resize(img))
    assert res.prompt_token_ids.count(engine.model.config.image_token_id) == \
        ref.tokens_per_image(img)
    engine.reset(conv)


def test_two_images(engine, ref):
    conv = engine.new_conversation()
    imgs = [random_image(2, 64, 200), random_image(3, 150, 90)]
    res = check_turn(engine, ref, conv, 'How many shapes are there?', imgs)
    resize = engine.prompts.image_processor.resize
    assert all(np.array_equal(im, resize(orig))
               for im, orig in zip(res.prompt_images, imgs, strict=True))
    engine.reset(conv)


def test_150_tokens_cross_many_blocks(engine, ref):
    # An image before the answer makes decode positions depend on the rope delta too.
    conv = engine.new_conversation()
    res = check_turn(engine, ref, conv, 'Turn left at the shelf.', [random_image(4, 96, 96)],
                     max_tokens=150, ignore_eos=True)
    assert res.finish_reason == 'length' and len(res.token_ids) == 150
    engine.reset(conv)


def _split_assistant(ids, header, im_end):
    """(non-assistant ids, [assistant spans]) of a rendered conversation."""
    other, spans, i = [], [], 0
    while i < len(ids):
        if ids[i:i + len(header)] == header:
            other.extend(header)
            j = i + len(header)
            k = ids.index(im_end, j) if im_end in ids[j:] else len(ids)
            spans.append(ids[j:k])
            i = k
        else:
            other.append(ids[i])
            i += 1
    return other, spans


def test_three_turns_with_images_and_history_render(engine, ref, tiny_ckpt):
    system = 'You are a helpful assistant running on a robot. Answer briefly.'
    conv = engine.new_conversation(system)
    img1, img3 = random_image(5, 128, 128), random_image(6, 70, 180)
    turns = [('What is in front of you?', [img1]), ('And what colour is it?', []),
             ('Is the path clear now?', [img3])]
    results = []
    for text, imgs in turns:
        res = check_turn(engine, ref, conv, text, imgs, max_tokens=16)
        if results:
            prev = results[-1]
            # The history keeps the generated ids exactly (closed with <|im_end|>).
            assert res.prompt_token_ids[:len(prev.prompt_token_ids)] == prev.prompt_token_ids
            n = len(prev.prompt_token_ids)
            assert res.prompt_token_ids[n:n + len(prev.token_ids)] == prev.token_ids
            assert res.cached_tokens >= n  # turn N+1 reuses turn N's blocks
        results.append(res)
    assert [len(r.prompt_images) for r in results] == [1, 1, 2]

    # An independent render of the same conversation through transformers. The generated ids
    # may be a non-canonical BPE of the answer text (re-encoding the text can split it
    # differently), so the assistant spans are compared as decoded text and everything else
    # token for token; the decoded text of the whole prompt must match exactly.
    tok = AutoTokenizer.from_pretrained(tiny_ckpt, local_files_only=True)
    messages = [{'role': 'system', 'content': system}]
    for (text, imgs), res in zip(turns, results, strict=True):
        content = [{'type': 'image'} for _ in imgs] + [{'type': 'text', 'text': text}]
        messages.append({'role': 'user', 'content': content})
        if res is not results[-1]:
            messages.append({'role': 'assistant', 'content': res.text})
    hf_ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                     return_dict=False)
    image_pad = tok.convert_tokens_to_ids('<|image_pad|>')
    counts = iter(ref.tokens_per_image(im) for im in results[-1].prompt_images)
    expanded = []
    for t in hf_ids:
        expanded.extend([t] * next(counts) if t == image_pad else [t])
    ours = results[-1].prompt_token_ids
    header = tok.encode('<|im_start|>assistant\n', add_special_tokens=False)
    im_end = tok.convert_tokens_to_ids('<|im_end|>')
    our_other, our_spans = _split_assistant(ours, header, im_end)
    hf_other, hf_spans = _split_assistant(expanded, header, im_end)
    assert our_other == hf_other
    assert [tok.decode(s) for s in our_spans] == [tok.decode(s) for s in hf_spans]
    assert tok.decode(ours) == tok.decode(expanded)
    engine.reset(conv)
