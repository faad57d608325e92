# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Grounding: the box arithmetic, the request checks and ``detect`` through LLMEngine.

* ``box_to_frame`` is exact for boxes on the model's 0-1000 grid, whatever the frame size;
* through the real resize (the engine's image processor, Pillow's bicubic), a rectangle drawn
  in a camera frame and read back off the image the model sees maps back onto itself, within
  one pixel of the model image, for frames scaled up, scaled down and of any aspect ratio,
  several cameras of different sizes side by side;
* ``detect`` answers on random tiny checkpoints follow the box-list schema (or ``length``),
  and ``detections`` are their boxes in the caller's frame.
"""

from fractions import Fraction

from _engine_reference import random_image
import jsonschema
import numpy as np
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.processing import ImageProcessor
from orin_llm_node.processing.grounding import (
    MAX_BOXES,
    box_list_schema,
    box_to_frame,
    check_detect,
    detections,
    grounding_prompt,
)

# (height, width) of camera frames; with the tiny checkpoint's bounds (64x64 .. 256x256
# pixels) the first two are scaled down, the middle ones up, and all change aspect slightly.
CAMERAS = [(480, 640), (720, 1280), (40, 50), (33, 170), (100, 300), (250, 90)]


@pytest.mark.parametrize('frame', CAMERAS)
def test_grid_boxes_map_exactly(frame):
    height, width = frame
    rng = np.random.default_rng(height * 10_000 + width)
    for _ in range(200):
        box = [int(v) for v in rng.integers(0, 1001, 4)]
        x1, x2 = sorted(Fraction(v * width, 1000) for v in box[0::2])
        y1, y2 = sorted(Fraction(v * height, 1000) for v in box[1::2])
        assert box_to_frame(box, frame) == [float(x1), float(y1), float(x2), float(y2)]
    assert box_to_frame([0, 0, 1000, 1000], frame) == [0.0, 0.0, float(width), float(height)]
    # Out of range coordinates are clamped to the frame; corners given backwards ordered.
    assert box_to_frame([1200, -5, 500, 1000], frame) == [width / 2, 0.0, width, height]


def rectangle_frame(frame, box):
    """A black frame with a white rectangle covering pixels [x1, x2) x [y1, y2)."""
    img = np.zeros((*frame, 3), np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = 255
    return img


def seen_box(image):
    """What a perfect model answers about the white rectangle: 0-1000 relative to ``image``."""
    ys, xs = np.nonzero(image[..., 0] > 127)
    h, w = image.shape[:2]
    return [round(1000 * xs.min() / w), round(1000 * ys.min() / h),
            round(1000 * (xs.max() + 1) / w), round(1000 * (ys.max() + 1) / h)]


def test_boxes_through_the_real_resize_map_back_onto_each_camera(tiny_ckpt):
    processor = ImageProcessor.from_pretrained(tiny_ckpt)
    rng = np.random.default_rng(7)
    directions = set()
    for frame in CAMERAS:
        height, width = frame
        model = processor.target_size(height, width)
        directions.add('down' if model[0] * model[1] < height * width else 'up')
        for _ in range(5):
            x1, x2 = sorted(int(v) for v in rng.choice(np.arange(1, width), 2, replace=False))
            y1, y2 = sorted(int(v) for v in rng.choice(np.arange(1, height), 2, replace=False))
            truth = [x1, y1, x2, y2]
            seen = processor.preprocess(rectangle_frame(frame, truth)).image
            assert seen.shape[:2] == model
            mapped = box_to_frame(seen_box(seen), frame)
            # One pixel of the model's image (the resize blurs an edge by about that much),
            # plus the 0-1000 grid's rounding.
            tol_x = 1.5 * width / model[1] + width / 1000
            tol_y = 1.5 * height / model[0] + height / 1000
            assert abs(mapped[0] - x1) <= tol_x and abs(mapped[2] - x2) <= tol_x, (frame, truth)
            assert abs(mapped[1] - y1) <= tol_y and abs(mapped[3] - y2) <= tol_y, (frame, truth)
    assert directions == {'up', 'down'}


def test_several_cameras_each_box_in_its_own_frame():
    parsed = [{'bbox_2d': [100, 200, 300, 400], 'label': 'cup'}]
    for frame in CAMERAS:
        (det,) = detections(parsed, frame)
        height, width = frame
        assert det == {'label': 'cup', 'bbox_2d': [100, 200, 300, 400],
                       'bbox': [width / 10, height / 5, 3 * width / 10, 2 * height / 5]}


def test_detect_requests_prompts_and_schema():
    assert check_detect(None) is None
    assert check_detect(['red cup', 'gripper']) == ['red cup', 'gripper']
    assert check_detect('the red cup') == 'the red cup'
    for bad in ([], [''], ['a', 'a'], ['say "hi"'], 7, ['x' * 101], 'two\nlines'):
        with pytest.raises(ValueError):
            check_detect(bad)
    assert grounding_prompt(['red cup', 'gripper']) == (
        'Locate every instance that belongs to the following categories: "red cup, gripper". '
        'Report bbox coordinates in JSON format.')
    assert 'the red cup' in grounding_prompt('the red cup')
    schema = {k: v for k, v in box_list_schema(['cup']).items() if k != 'x-guidance'}
    jsonschema.validate([{'bbox_2d': [0, 10, 1000, 20], 'label': 'cup'}], schema)
    for bad in ([{'bbox_2d': [0, 10, 1001, 20], 'label': 'cup'}],
                [{'bbox_2d': [0, 10, 20], 'label': 'cup'}],
                [{'bbox_2d': [0, 1, 2, 3], 'label': 'mug'}],
                [{'bbox_2d': [0, 1, 2, 3], 'label': 'cup'}] * (MAX_BOXES + 1)):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    with pytest.raises(ValueError, match='cannot be combined'):
        SamplingParams(detect=['cup'], tools=[{'name': 'f'}])


@pytest.fixture(scope='module')
def engine(tiny_ckpt):
    torch.set_num_threads(1)  # see test_tools.make_engine
    return LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', dtype='float32',
                                  block_order_seed=2))


@pytest.mark.parametrize('detect', [['red cup', 'gripper'], 'the cup left of the arm'])
def test_detect_answers_follow_the_box_schema(engine, detect):
    schema = {k: v for k, v in box_list_schema(detect).items() if k != 'x-guidance'}
    complete = 0
    for seed in range(8):
        frame = random_image(seed, *CAMERAS[seed % len(CAMERAS)])
        conv = engine.new_conversation()
        res = engine.chat(conv, images=[frame], sampling=SamplingParams(
            max_tokens=120, temperature=1.0, seed=seed, detect=detect))
        assert res.finish_reason in ('stop', 'length'), res
        if res.finish_reason == 'length':
            assert res.valid is False and res.detections == []
        else:
            complete += 1
            jsonschema.validate(res.parsed, schema)
            assert res.detections == detections(res.parsed, frame.shape[:2])
            for det in res.detections:
                x1, y1, x2, y2 = det['bbox']
                assert 0 <= x1 <= x2 <= frame.shape[1] and 0 <= y1 <= y2 <= frame.shape[0]
        # The turn asked the grounding prompt about the one frame.
        assert engine.tokenizer.decode(res.prompt_token_ids).endswith(
            grounding_prompt(detect) + '\nassistant\n')
        engine.reset(conv)
    assert complete >= 1


def test_detect_takes_exactly_one_image(engine):
    conv = engine.new_conversation()
    frame = random_image(1, 64, 64)
    for images in ([], [frame, frame]):
        with pytest.raises(ValueError, match='exactly one image'):
            engine.chat(conv, images=images, sampling=SamplingParams(detect=['cup']))
    # An image among the parts counts; the caller's own text replaces the grounding prompt.
    res = engine.chat(conv, ['Where is the cup?', frame], sampling=SamplingParams(
        max_tokens=8, detect=['cup']))
    assert engine.tokenizer.decode(res.prompt_token_ids).endswith('Where is the cup?\nassistant\n')
    assert conv.num_turns == 1
    engine.reset(conv)
