# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node on the embedded demo checkpoint calls its tool and finds the shape, over real DDS.

A node process on the demo checkpoint (trained on ``shapes.TOOLS`` and on
``detect="the shape"``): camera frames much larger and much smaller than the 160x160 the model
sees get a ``response/info`` detection whose box, in each frame's own pixels, overlaps the
drawn shape (IoU >= 0.5) with its colour and kind as the label; "Point at the shape." with the
tool in the envelope comes back as one ``point_at`` call with the shape's colour and kind, and
the tool's result goes back through the prefix cache and is answered.
"""

import time

import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import START_TIMEOUT, JsonProbe, start_node, stop  # noqa: E402

from orin_llm_node.package_files import DEMO_MODEL_DIR  # noqa: E402
from orin_llm_node.testing import shapes  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/demo_tools_test'


@pytest.fixture(scope='module')
def probe(tmp_path_factory):
    # One of the system prompts the demo model was trained with.
    proc = start_node(DEMO_MODEL_DIR, NS, tmp_path_factory.mktemp('demo_tools'),
                      f'system_prompt:={shapes.SYSTEM_PROMPTS[0]}', 'max_new_tokens:=72')
    p = JsonProbe(NS, tag_prefix='demo_', timeout=120.0)
    try:
        p.spin_until(lambda: p.ready or proc.poll() is not None, START_TIMEOUT, 'ready')
        assert proc.poll() is None, 'node died:\n' + proc.log_path.read_text()[-3000:]
        p.spin_until(lambda: p.pub_json.get_subscription_count() > 0
                     and p.pub_image.get_subscription_count() > 0, 20.0, 'subscribed')
        p.hello()
        yield p
    finally:
        p.close()
        stop(proc)


@pytest.mark.parametrize('height,width,shape', [
    (480, 640, shapes.Shape('circle', 'red', 420.0, 170.0, 90.0)),     # scaled down
    (96, 128, shapes.Shape('square', 'blue', 45.0, 55.0, 22.0)),       # scaled up
])
def test_detect_the_shape_gives_its_box_in_the_frames_pixels(probe, height, width, shape):
    scene = shapes.Scene(shapes.render_scene(height, width, [shape]), (shape,))
    probe.send_image(probe.image(scene.image, stamp_ns=time.time_ns()))
    info = probe.send({'detect': shapes.WHERE_PHRASE})
    assert info['error'] is None and info['finish_reason'] == 'stop', info
    (det,) = info['detections']
    assert det['label'] == f'{shape.colour} {shape.kind}'
    x1, y1, x2, y2 = det['bbox']
    assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, det
    assert shapes.iou(det['bbox'], shapes.shape_box(scene)) >= 0.5, (det, shapes.shape_box(scene))


def test_point_at_the_shape_is_a_call_and_its_result_is_answered(probe):
    shape = shapes.Shape('star', 'green', 150.0, 110.0, 60.0)
    scene = shapes.Scene(shapes.render_scene(240, 320, [shape]), (shape,))
    probe.send_image(probe.image(scene.image, stamp_ns=time.time_ns()))
    info = probe.send({'prompt': 'Point at the shape.', 'conversation': 'new',
                       'tools': shapes.TOOLS})
    assert info['finish_reason'] == 'tool_calls', info
    assert [(c['name'], c['arguments']) for c in info['tool_calls']] == [
        ('point_at', {'colour': 'green', 'shape': 'star'})]
    done = probe.send({'tools': shapes.TOOLS, 'tool_results': [
        {'id': info['tool_calls'][0]['id'], 'content': shapes.POINTED}]})
    assert done['error'] is None and done['text'] == shapes.AFTER_POINTING, done
    assert done['cached_tokens'] >= info['prompt_tokens'] // 16 * 16 > 0, (info, done)
