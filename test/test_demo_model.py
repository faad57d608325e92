# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The embedded demo checkpoint answers questions about synthetic shapes through LLMEngine."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.models.loader import checkpoint_names, load_model
from orin_llm_node.testing import shapes
from orin_llm_node.testing.tiny_checkpoint import tensor_shapes

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
FILES = ('config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json',
         'chat_template.jinja', 'generation_config.json', 'preprocessor_config.json')
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope='module')
def engine():
    torch.set_num_threads(2)
    return LLMEngine(EngineConfig(model_path=DEMO, device='cpu', dtype='float32',
                                  block_size=16, enable_cuda_graph=False, block_order_seed=3))


def ask(engine, conv, text, image=None):
    res = engine.chat(conv, text, images=None if image is None else [image], sampling=GREEDY)
    assert res.finish_reason == 'stop', res
    return res


def test_checkpoint_is_complete_and_small():
    for name in FILES:
        assert (DEMO / name).is_file(), name
    assert (DEMO / 'model.safetensors').stat().st_size < 8 * 2**20
    cfg = json.loads((DEMO / 'config.json').read_text())
    assert cfg['architectures'] == ['Qwen3VLForConditionalGeneration']
    model = load_model(DEMO)
    names = {hf for n, _ in model.named_parameters() for hf in checkpoint_names(n)}
    assert len(names) >= len(tensor_shapes(cfg)) - 1  # lm_head is tied to the embeddings
    pre = json.loads((DEMO / 'preprocessor_config.json').read_text())
    # Every image is resized to about 160 x 160 pixels (tools/train_demo_model.py).
    assert pre['size'] == {'shortest_edge': 160 * 160, 'longest_edge': 160 * 160}


@pytest.mark.parametrize('kind,colour,background', [
    ('circle', 'red', (255, 255, 255)),  # the `make demo` picture
    ('circle', 'red', (0, 0, 0)),
    ('square', 'blue', (128, 128, 128)),
    ('triangle', 'yellow', (40, 40, 40)),
    ('star', 'green', (230, 230, 230)),
])
def test_clean_single_shapes(engine, kind, colour, background):
    scene = shapes.simple_scene(kind, colour, height=160, width=200, background=background)
    conv = engine.new_conversation()
    assert ask(engine, conv, 'What colour is the shape?', scene.image).text == f'{colour}.'
    assert ask(engine, conv, 'And what shape is it?').text == f'{kind}.'
    engine.reset(conv)
    conv = engine.new_conversation()
    assert ask(engine, conv, 'What shape is it?', scene.image).text == f'{kind}.'
    assert ask(engine, conv, 'How many shapes are there?').text == 'one.'
    engine.reset(conv)


@pytest.mark.parametrize('count', [2, 3])
def test_counts_separated_shapes(engine, count):
    placed = [shapes.Shape('circle', 'red', 40, 50, 22),
              shapes.Shape('square', 'blue', 150, 60, 22),
              shapes.Shape('star', 'green', 95, 125, 22)][:count]
    image = shapes.render_scene(160, 200, placed, background=(255, 255, 255))
    conv = engine.new_conversation()
    res = ask(engine, conv, 'How many shapes are there?', image)
    assert res.text == shapes.COUNT_WORDS[count - 1] + '.'
    engine.reset(conv)


def test_random_scenes_colour_and_shape(engine):
    rng = np.random.default_rng(123)
    for _ in range(4):
        scene = shapes.random_scene(rng, num_shapes=1)
        for kind in ('colour', 'shape'):
            conv = engine.new_conversation()
            res = ask(engine, conv, shapes.QUESTIONS[kind][0], scene.image)
            assert res.text == shapes.answer(kind, scene), scene.shapes
            engine.reset(conv)


def test_follow_up_uses_the_previous_turn_from_the_cache(engine):
    scene = shapes.simple_scene('triangle', 'purple', height=96, width=224,
                                background=(200, 200, 190))
    conv = engine.new_conversation(system_prompt='You are a helpful assistant.')
    ask(engine, conv, 'What shape is it?', scene.image)
    second = ask(engine, conv, 'And what colour is it?')
    assert second.text == 'purple.'
    assert second.cached_tokens > 0
    assert len(second.prompt_images) == 1
    # A new image in the same conversation: the answer follows the newest image.
    other = shapes.simple_scene('square', 'orange', background=(30, 30, 30))
    third = ask(engine, conv, 'What colour is the shape?', other.image)
    assert third.text == 'orange.'
    assert third.cached_tokens >= second.cached_tokens
    engine.reset(conv)


def test_answers_equal_transformers_greedy(engine):
    transformers = pytest.importorskip('transformers')
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        str(DEMO), dtype=torch.float32).eval()
    scene = shapes.draw_scene(7, num_shapes=1)
    conv = engine.new_conversation()
    res = ask(engine, conv, 'What shape is it?', scene.image)
    engine.reset(conv)
    proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(DEMO))
    pix = proc(images=[scene.image], return_tensors='pt')
    ids = torch.tensor([res.prompt_token_ids])
    image_id = json.loads((DEMO / 'config.json').read_text())['image_token_id']
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=8, pixel_values=pix['pixel_values'],
                             image_grid_thw=pix['image_grid_thw'],
                             mm_token_type_ids=(ids == image_id).long())
    assert out[0, ids.shape[1]:].tolist() == res.token_ids


def test_camera_sized_frame_is_seen_at_the_trained_resolution():
    """The node's default cap (640x480) must not enlarge images past the checkpoint's maximum."""
    eng = LLMEngine(EngineConfig(model_path=DEMO, device='cpu', dtype='float32',
                                 enable_cuda_graph=False, image_max_pixels=640 * 480))
    scene = shapes.simple_scene('triangle', 'orange', height=480, width=640,
                                background=(90, 90, 90))
    conv = eng.new_conversation()
    assert ask(eng, conv, 'What colour is the shape?', scene.image).text == 'orange.'
    assert ask(eng, conv, 'And what shape is it?').text == 'triangle.'
    assert ask(eng, conv, 'And how many shapes are there?').text == 'one.'
    # 640x480 is resized to about 160x160: 5 x 4 merged cells, not ~300 image tokens.
    assert eng.prompts.image_processor.num_tokens(480, 640) <= 30


def test_an_empty_model_path_is_the_demo_checkpoint():
    """``EngineConfig(model_path='')`` loads the embedded demo, as the node's empty parameter."""
    from orin_llm_node import package_files

    cfg = EngineConfig(model_path='', device='cpu', dtype='float32', block_size=16,
                       enable_cuda_graph=False, block_order_seed=3)
    assert cfg.model_path == package_files.DEMO_MODEL_DIR
    assert cfg.model_path.resolve() == DEMO.resolve()
    assert EngineConfig(model_path='~/ckpt').model_path == Path.home() / 'ckpt'
    with LLMEngine(cfg) as demo:
        scene = shapes.simple_scene('circle', 'red', height=160, width=200,
                                    background=(255, 255, 255))
        assert ask(demo, demo.new_conversation(), 'What colour is the shape?',
                   scene.image).text == 'red.'


def test_one_chat_template_in_the_package(tiny_ckpt):
    """The demo checkpoint's template is the one copy; tiny checkpoints are written from it."""
    from orin_llm_node import package_files

    found = sorted(package_files.PACKAGE_DIR.rglob('chat_template*'))
    assert found == [package_files.DEMO_MODEL_DIR / 'chat_template.jinja']
    assert (tiny_ckpt / 'chat_template.jinja').read_bytes() == found[0].read_bytes()


@pytest.mark.parametrize('kind,colour,background', [
    ('circle', 'red', (255, 255, 255)),
    ('square', 'blue', (128, 128, 128)),
    ('star', 'green', (230, 230, 230)),
])
def test_points_at_the_shape_with_a_tool_call_and_takes_the_result(engine, kind, colour,
                                                                   background):
    scene = shapes.simple_scene(kind, colour, height=160, width=200, background=background)
    tools = SamplingParams(max_tokens=72, tools=shapes.TOOLS)
    conv = engine.new_conversation()
    res = engine.chat(conv, 'Point at the shape.', images=[scene.image], sampling=tools)
    assert res.finish_reason == 'tool_calls', res
    assert [(c['name'], c['arguments']) for c in res.tool_calls] == [
        ('point_at', {'colour': colour, 'shape': kind})]
    done = engine.chat(conv, tool_results=[{'id': res.tool_calls[0]['id'],
                                            'content': shapes.POINTED}], sampling=tools)
    assert done.text == shapes.AFTER_POINTING and done.cached_tokens > 0
    # With the tool declared, a question is still answered, not turned into a call.
    assert engine.chat(conv, 'What colour is the shape?', images=[scene.image],
                       sampling=tools).text == f'{colour}.'
    engine.reset(conv)


@pytest.mark.parametrize('kind,colour,box', [
    ('circle', 'red', (40, 30, 120, 110)),
    ('square', 'blue', (90, 50, 190, 150)),
    ('triangle', 'yellow', (20, 60, 110, 150)),
])
def test_gives_the_box_of_the_shape_in_the_frame(engine, kind, colour, box):
    x1, y1, x2, y2 = box
    shape = shapes.Shape(kind, colour, (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2)
    scene = shapes.Scene(shapes.render_scene(160, 200, [shape], background=(250, 250, 250)),
                         (shape,))
    conv = engine.new_conversation()
    res = engine.chat(conv, images=[scene.image], sampling=SamplingParams(
        max_tokens=72, detect=shapes.WHERE_PHRASE))
    assert res.finish_reason == 'stop' and res.valid, res
    (det,) = res.detections
    assert det['label'] == f'{colour} {kind}'
    truth = shapes.shape_box(scene)
    assert shapes.iou(det['bbox'], truth) >= 0.5, (det, truth)
    engine.reset(conv)
