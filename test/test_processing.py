# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Image processor, chat template and tokenizer against transformers 5.23.0 (no mocks)."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st
import numpy as np
from PIL import Image
import pytest
import torch
from transformers import AutoTokenizer, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref_resize

from orin_llm_node.processing import (
    ChatTemplate,
    ImageProcessor,
    Tokenizer,
    expand_image_pads,
    smart_resize,
    user_message,
)

SIZES = [(64, 64), (96, 160), (224, 128), (640, 480), (1280, 720), (97, 203)]
# (min_pixels, max_pixels): the tiny checkpoint's own bounds (None), the published Qwen3-VL
# defaults (small images are upscaled), and a robot-like setting.
BOUNDS = [None, (256 * 256, 4096 * 4096), (32 * 32 * 4, 448 * 448)]

# The published Qwen3-VL preprocessor_config.json (its `size` names min/max pixels).
PUBLISHED_PREPROCESSOR = {
    'do_convert_rgb': True, 'do_normalize': True, 'do_rescale': True, 'do_resize': True,
    'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5],
    'image_processor_type': 'Qwen2VLImageProcessorFast', 'merge_size': 2, 'patch_size': 16,
    'resample': 3, 'rescale_factor': 0.00392156862745098,
    'size': {'longest_edge': 16777216, 'shortest_edge': 65536}, 'temporal_patch_size': 2,
}


def make_image(h, w, kind, seed=0):
    """Noise (worst case for bicubic overshoot and clipping) or a smooth colour gradient."""
    rng = np.random.default_rng(seed + h * 7919 + w)
    if kind == 'noise':
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([255 * yy / max(h - 1, 1), 255 * xx / max(w - 1, 1),
                    127 + 127 * np.sin((xx + yy) / 7.0)], axis=-1)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def processors(ckpt, bounds):
    kw = {} if bounds is None else {'min_pixels': bounds[0], 'max_pixels': bounds[1]}
    return ImageProcessor.from_pretrained(ckpt, **kw), Qwen2VLImageProcessorPil.from_pretrained(
        ckpt, **kw)


@pytest.fixture(scope='module')
def ref_tok(tiny_ckpt):
    return AutoTokenizer.from_pretrained(tiny_ckpt)


@pytest.fixture(scope='module')
def tok(tiny_ckpt):
    return Tokenizer.from_pretrained(tiny_ckpt)


@pytest.fixture(scope='module')
def template(tiny_ckpt):
    return ChatTemplate.from_pretrained(tiny_ckpt)


# ---------------------------------------------------------------------------- images


@pytest.mark.parametrize('bounds', BOUNDS, ids=['ckpt', 'published', 'robot'])
@pytest.mark.parametrize('kind', ['noise', 'gradient'])
def test_pixels_equal_reference(tiny_ckpt, bounds, kind):
    ours, ref = processors(tiny_ckpt, bounds)
    resized = 0
    for h, w in SIZES:
        img = make_image(h, w, kind)
        out = ours.preprocess(img)
        expected = ref(images=[Image.fromarray(img)], return_tensors='pt')
        grid = tuple(expected['image_grid_thw'][0].tolist())
        assert out.grid_thw == grid, (h, w)
        assert out.pixel_values.dtype == torch.float32
        assert out.pixel_values.shape == expected['pixel_values'].shape, (h, w)
        # Bit-for-bit, resized or not.
        assert torch.equal(out.pixel_values, expected['pixel_values']), (h, w)
        new_h, new_w = grid[1] * 16, grid[2] * 16
        assert out.num_tokens == new_h * new_w // 1024 == ours.num_tokens(h, w)
        assert out.pixel_values.shape == (grid[1] * grid[2], 3 * 2 * 16 * 16)
        resized += (new_h, new_w) != (h, w)
    assert resized >= 2  # the resize path really ran


def test_pixels_published_config(tmp_path):
    (tmp_path / 'preprocessor_config.json').write_text(json.dumps(PUBLISHED_PREPROCESSOR))
    ours, ref = processors(tmp_path, None)
    assert (ours.min_pixels, ours.max_pixels) == (65536, 16777216)
    for h, w in [(97, 203), (480, 640)]:
        img = make_image(h, w, 'noise', seed=3)
        expected = ref(images=[Image.fromarray(img)], return_tensors='pt')
        out = ours.preprocess(img)
        assert torch.equal(out.pixel_values, expected['pixel_values'])
        assert out.grid_thw == tuple(expected['image_grid_thw'][0].tolist())


def test_patch_layout():
    # A constant-per-position image shows the (C, T, py, px) flatten and the 2x2 window order.
    proc = ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
    img = np.zeros((64, 32, 3), dtype=np.uint8)
    img[..., 0] = np.arange(64)[:, None]  # red = row
    img[..., 1] = np.arange(32)[None, :]  # green = column
    img[..., 2] = 255
    out = proc.preprocess(img)
    assert out.grid_thw == (1, 4, 2) and out.num_tokens == 2
    patches = out.pixel_values.view(8, 3, 2, 16, 16)
    assert torch.equal(patches[:, :, 0], patches[:, :, 1])  # temporal duplicate
    to_val = lambda v: (np.float32(v / 255) - np.float32(0.5)) / np.float32(0.5)  # noqa: E731
    # Patch order: window (0,0) holds patch rows 0-1 x cols 0-1, then window (1,0).
    for k, (pr, pc) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]):
        assert patches[k, 0, 0, 0, 0].item() == pytest.approx(to_val(pr * 16))
        assert patches[k, 1, 0, 0, 0].item() == pytest.approx(to_val(pc * 16))
        assert patches[k, 0, 0, 5, 0].item() == pytest.approx(to_val(pr * 16 + 5))
        assert patches[k, 1, 0, 0, 7].item() == pytest.approx(to_val(pc * 16 + 7))
    assert torch.all(patches[:, 2] == 1.0)


def test_from_pretrained_reads_config(tiny_ckpt, tmp_path):
    proc = ImageProcessor.from_pretrained(tiny_ckpt)
    cfg = json.loads((tiny_ckpt / 'preprocessor_config.json').read_text())
    assert proc.min_pixels == cfg['size']['shortest_edge']
    assert proc.max_pixels == cfg['size']['longest_edge']
    assert (proc.patch_size, proc.temporal_patch_size, proc.merge_size) == (16, 2, 2)
    assert proc.mean == proc.std == (0.5, 0.5, 0.5)
    over = ImageProcessor.from_pretrained(tiny_ckpt, max_pixels=128 * 128)
    assert (over.min_pixels, over.max_pixels) == (cfg['size']['shortest_edge'], 128 * 128)
    # Legacy top-level min/max_pixels win over `size`, as in the reference.
    legacy = dict(PUBLISHED_PREPROCESSOR, min_pixels=1024, max_pixels=96 * 96)
    (tmp_path / 'preprocessor_config.json').write_text(json.dumps(legacy))
    ours, ref = processors(tmp_path, None)
    assert (ours.min_pixels, ours.max_pixels) == (1024, 96 * 96)
    img = make_image(200, 300, 'noise')
    assert torch.equal(ours.preprocess(img).pixel_values,
                       ref(images=[Image.fromarray(img)], return_tensors='pt')['pixel_values'])
    with pytest.raises(ValueError, match='preprocessor_config.json'):
        ImageProcessor.from_pretrained(tmp_path / 'missing')


def test_capped_bounds_never_raise_the_checkpoint_maximum(tiny_ckpt):
    proc = ImageProcessor.from_pretrained(tiny_ckpt)
    assert (proc.min_pixels, proc.max_pixels) == (64 * 64, 256 * 256)
    assert proc.capped() == proc
    # The node's default cap (640x480) is above this checkpoint's maximum: the checkpoint wins.
    assert proc.capped(max_pixels=640 * 480).target_size(480, 640) == proc.target_size(480, 640)
    lower = proc.capped(max_pixels=128 * 128)
    assert (lower.min_pixels, lower.max_pixels) == (64 * 64, 128 * 128)
    assert math.prod(lower.target_size(480, 640)) <= 128 * 128
    below_min = proc.capped(max_pixels=48 * 48)
    assert below_min.min_pixels == below_min.max_pixels == 48 * 48
    assert proc.capped(min_pixels=100 * 100).min_pixels == 100 * 100


@pytest.mark.parametrize('image, reason', [
    (np.zeros((0, 10, 3), np.uint8), 'zero size'),
    (np.zeros((10, 0, 3), np.uint8), 'zero size'),
    (np.zeros((2, 500, 3), np.uint8), 'aspect ratio'),
    (np.zeros((500, 2, 3), np.uint8), 'aspect ratio'),
    (np.zeros((32, 32, 3), np.float32), 'uint8'),
    (np.zeros((32, 32, 3), np.uint16), 'uint8'),
    (np.zeros((32, 32, 4), np.uint8), r'H x W x 3'),
    (np.zeros((32, 32, 1), np.uint8), r'H x W x 3'),
    (np.zeros((32, 32), np.uint8), r'H x W x 3'),
    ([[0, 0, 0]], 'numpy array'),
])
def test_bad_images_raise(image, reason):
    with pytest.raises(ValueError, match=reason):
        ImageProcessor().preprocess(image)


def test_bad_processor_config_raises():
    with pytest.raises(ValueError, match='min_pixels'):
        ImageProcessor(min_pixels=128 * 128, max_pixels=64 * 64)
    with pytest.raises(ValueError, match='max_pixels'):
        ImageProcessor(min_pixels=1, max_pixels=16 * 16)
    with pytest.raises(ValueError, match='std'):
        ImageProcessor(std=(0.5, 0.0, 0.5))


@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 5000), w=st.integers(1, 5000),
       lo=st.integers(1, 512 * 512), span=st.integers(0, 2000 * 2000))
def test_smart_resize_matches_reference_and_bounds(h, w, lo, span):
    factor = 32
    hi = max(lo, factor * factor) + span
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(ValueError, match='aspect ratio'):
            smart_resize(h, w, factor, lo, hi)
        return
    nh, nw = smart_resize(h, w, factor, lo, hi)
    assert (nh, nw) == ref_resize(h, w, factor, lo, hi)
    assert nh % factor == 0 and nw % factor == 0 and nh >= factor and nw >= factor
    area = nh * nw
    # The reference keeps the bounds only when they leave room for rounding both sides to
    # multiples of the factor: a range of at least 4x and an image whose short side, scaled to
    # min_pixels, is still a merged patch (two for the lower bound, as floor() may shrink it).
    short = min(h, w) * (lo / (h * w)) ** 0.5
    if hi >= 4 * lo and short >= factor:
        assert area <= hi
    if hi >= 4 * lo and short >= 2 * factor:
        assert area >= lo


# ---------------------------------------------------------------------------- chat + tokens


CONVERSATIONS = {
    'system_user_image': [
        {'role': 'system', 'content': 'You are a helpful robot.'},
        user_message('What is in front of you?', 1),
    ],
    'multi_image': [
        {'role': 'system', 'content': 'You are a helpful robot.'},
        user_message('Compare the two pictures. What colour is the shape?', 2),
    ],
    'multi_turn': [
        {'role': 'system', 'content': 'You are a helpful robot.'},
        user_message('What is in front of you?', 1),
        {'role': 'assistant', 'content': 'A red circle on a grey floor.'},
        user_message('And now? How many shapes are there?', 1),
        {'role': 'assistant', 'content': [{'type': 'text', 'text': 'Two shapes.'}]},
        {'role': 'user', 'content': 'Thanks! 12345 ünïcödé 日本 \t tabs\n\nnew lines'},
    ],
    'no_system_string_content': [{'role': 'user', 'content': 'Hello robot', 'name': None}],
}


@pytest.mark.parametrize('name', list(CONVERSATIONS))
def test_chat_render_and_ids_equal_reference(template, tok, ref_tok, name):
    messages = CONVERSATIONS[name]
    text = template.render(messages, add_generation_prompt=True)
    assert text == ref_tok.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)
    assert text.endswith('<|im_start|>assistant\n')
    ids = tok.encode(text)
    assert ids == ref_tok.apply_chat_template(messages, tokenize=True, return_dict=False,
                                              add_generation_prompt=True)
    assert ids == ref_tok(text)['input_ids']
    no_prompt = template.render(messages, add_generation_prompt=False)
    assert no_prompt == ref_tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == ref_tok.decode(ids, skip_special_tokens=True)


def test_template_errors_are_raised(tiny_ckpt):
    bad = ChatTemplate("{{ raise_exception('no ' + messages[0].role) }}")
    with pytest.raises(Exception, match='no user'):
        bad.render([{'role': 'user', 'content': 'x'}])
    with pytest.raises(ValueError, match='empty'):
        ChatTemplate.from_pretrained(tiny_ckpt).render([])
    js = ChatTemplate('{{ messages[0].content | tojson }}')
    assert js.render([{'role': 'user', 'content': '<b>é</b>'}]) == '"<b>é</b>"'


def test_template_from_tokenizer_config(tiny_ckpt, tmp_path, ref_tok):
    # Without chat_template.jinja the tokenizer_config.json entry is used.
    for name in ('tokenizer.json', 'tokenizer_config.json'):
        (tmp_path / name).write_bytes((tiny_ckpt / name).read_bytes())
    cfg = json.loads((tmp_path / 'tokenizer_config.json').read_text())
    cfg['chat_template'] = (tiny_ckpt / 'chat_template.jinja').read_text()
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps(cfg))
    messages = CONVERSATIONS['multi_turn']
    assert ChatTemplate.from_pretrained(tmp_path).render(messages) == \
        ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError, match='no chat template'):
        ChatTemplate.from_pretrained(tmp_path / 'nowhere')


@pytest.mark.parametrize('text', [
    'What is in front of you?',
    '  leading spaces and trailing  ',
    'digits 3.14159 and 2026-01-01',
    'ünïcödé, 日本語, emoji 🤖 and\r\nwindows lines',
    '<|im_start|>user\ninline <|image_pad|> specials<|im_end|>',
    '',
])
def test_encode_decode_equal_reference(tok, ref_tok, text):
    ids = tok.encode(text)
    assert ids == ref_tok.encode(text, add_special_tokens=False)
    assert ids == ref_tok(text)['input_ids']  # no BOS either way
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == ref_tok.decode(
            ids, skip_special_tokens=skip)


def test_special_ids_from_checkpoint(tiny_ckpt, tok, ref_tok):
    config = json.loads((tiny_ckpt / 'config.json').read_text())
    gen = json.loads((tiny_ckpt / 'generation_config.json').read_text())
    assert tok.image_pad_id == config['image_token_id'] == ref_tok.convert_tokens_to_ids(
        '<|image_pad|>')
    assert tok.video_pad_id == config['video_token_id']
    assert tok.vision_start_id == config['vision_start_token_id']
    assert tok.vision_end_id == config['vision_end_token_id']
    assert tok.im_start_id == ref_tok.convert_tokens_to_ids('<|im_start|>')
    assert tok.im_end_id == ref_tok.convert_tokens_to_ids('<|im_end|>')
    eos = gen['eos_token_id']
    assert list(tok.eos_ids) == (eos if isinstance(eos, list) else [eos])
    assert ref_tok.eos_token_id in tok.eos_ids
    # The tiny tokenizer's ids differ from the real ones (151655 & co), so nothing is hard-coded.
    assert tok.image_pad_id != 151655 and tok.im_end_id != 151645
    assert tok.token_id('<|endoftext|>') == ref_tok.convert_tokens_to_ids('<|endoftext|>')
    assert tok.vocab_size == len(ref_tok)
    with pytest.raises(ValueError, match='no token'):
        tok.token_id('<|not_a_token|>')


def test_config_id_mismatch_raises(tiny_ckpt, tmp_path):
    for f in tiny_ckpt.iterdir():
        if f.suffix in ('.json', '.jinja'):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / 'config.json').read_text())
    config['image_token_id'] += 1
    (tmp_path / 'config.json').write_text(json.dumps(config))
    with pytest.raises(ValueError, match='image_token_id'):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match='tokenizer.json'):
        Tokenizer.from_pretrained(tmp_path / 'missing')


def test_full_prompt_equals_reference_processor_ids(tiny_ckpt, template, tok, ref_tok):
    """What Qwen3VLProcessor does: expand each <|image_pad|> in the text, then tokenize."""
    ours_img, ref_img = processors(tiny_ckpt, None)
    images = [make_image(97, 203, 'gradient'), make_image(640, 480, 'noise')]
    messages = [{'role': 'system', 'content': 'You are a helpful robot.'},
                user_message('Compare the two pictures.', len(images))]
    processed = [ours_img.preprocess(im) for im in images]
    ids = tok.expand_image_pads(tok.encode(template.render(messages)),
                                [p.num_tokens for p in processed])

    ref = ref_img(images=[Image.fromarray(im) for im in images], return_tensors='pt')
    text = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    merge = ref_img.merge_size ** 2
    pad = '<|image_pad|>'
    parts = text.split(pad)
    assert len(parts) == len(images) + 1
    expanded = parts[0]
    for grid, rest in zip(ref['image_grid_thw'], parts[1:], strict=True):
        expanded += pad * (int(grid.prod()) // merge) + rest
    assert ids == ref_tok(expanded)['input_ids']
    assert torch.equal(torch.cat([p.pixel_values for p in processed]), ref['pixel_values'])
    assert ids.count(tok.image_pad_id) == sum(p.num_tokens for p in processed)


def test_expand_image_pads():
    pad = 7
    assert expand_image_pads([1, pad, 2, pad, 3], [2, 3], pad) == [1, pad, pad, 2, pad, pad,
                                                                   pad, 3]
    assert expand_image_pads([1, 2], [], pad) == [1, 2]
    with pytest.raises(ValueError, match='1 image pad'):
        expand_image_pads([1, pad], [2, 2], pad)
    with pytest.raises(ValueError, match='more image pads'):
        expand_image_pads([pad, pad], [2], pad)
