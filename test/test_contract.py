# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The wire contract: ``response/info`` as the README documents it, and the topics' QoS.

Every ``response/info`` is an :class:`AnswerInfo`; its JSON keeps the keys and their order for
each kind (answered, failed, refused) and is strict.  No DDS here: the node sends these
(test_node.py and beside it), the session builds them (test_session.py).
"""

from dataclasses import replace
import json
from types import SimpleNamespace

import pytest

from orin_llm_node.ros import contract
from orin_llm_node.ros.cameras.camera_report import camera_report
from orin_llm_node.ros.cameras.camera_views import CameraView, Request
from orin_llm_node.ros.contract import AnswerInfo

CAMERA_KEYS = ['cameras', 'camera_sync', 'video']


def _request(envelope=None):
    return Request(3, 'What?', [CameraView('image', missing='no image received yet')], True,
                   0.0, envelope)


def _result(**changes):
    values = dict(text='red.', error=None, finish_reason='stop', token_ids=[1, 2, 3],
                  cached_tokens=16, prompt_token_ids=list(range(40)), ttft_s=0.0412345,
                  decode_tok_s=88.54321, valid=None, parsed=None, tool_calls=[])
    values.update(changes)
    return SimpleNamespace(**values)


def _keys(info):
    return list(json.loads(info.to_json()))


def test_an_answer_has_the_readme_keys_in_order():
    request = _request()
    info = AnswerInfo.answered(request, _result(), camera_report(request), 'bfloat16')
    out = json.loads(info.to_json())
    assert list(out) == ['request_id', 'prompt', 'text', 'image', 'no_image', *CAMERA_KEYS,
                         'finish_reason', 'error', 'generated_tokens', 'cached_tokens',
                         'prompt_tokens', 'ttft_ms', 'decode_tok_s', 'weight_format',
                         'backend', 'model']
    assert out['no_image'] == 'no image received yet' and out['image'] is None
    assert (out['generated_tokens'], out['cached_tokens'], out['prompt_tokens']) == (3, 16, 40)
    assert (out['ttft_ms'], out['decode_tok_s']) == (41.234, 88.543)
    assert out['cameras'][0] == {'name': 'image', 'image': None, 'video': None,
                                 'missing': 'no image received yet'}


def test_a_constrained_answer_adds_tag_valid_and_json():
    request = _request({'tag': 'pick-1'})
    result = _result(text='{"a": 1}', valid=True, parsed={'a': 1})
    out = json.loads(AnswerInfo.answered(request, result, camera_report(request), 'x')
                     .to_json())
    assert list(out)[-3:] == ['tag', 'valid', 'json']
    assert (out['tag'], out['valid'], out['json']) == ('pick-1', True, {'a': 1})


def test_an_engine_refusal_is_an_answer_without_text():
    request = _request()
    result = _result(error='prompt too long', finish_reason='context_full')
    out = json.loads(AnswerInfo.answered(request, result, camera_report(request), 'x')
                     .to_json())
    assert out['text'] is None and out['error'] == 'prompt too long'


def test_failed_and_refused_have_no_answer_keys():
    request = _request({'tag': 't'})
    failed = AnswerInfo.failed(request, 'request failed: boom', camera_report(request))
    assert _keys(failed) == ['request_id', 'prompt', 'text', 'image', *CAMERA_KEYS,
                             'finish_reason', 'error', 'tag']
    assert json.loads(failed.to_json())['finish_reason'] == 'error'
    refused = AnswerInfo.refused(4, 'hi', 'queue full', tag='q')
    assert _keys(refused) == ['request_id', 'prompt', 'text', 'image', 'finish_reason',
                              'error', 'tag']
    assert json.loads(refused.to_json()) == {'request_id': 4, 'prompt': 'hi', 'text': None,
                                             'image': None, 'finish_reason': 'refused',
                                             'error': 'queue full', 'tag': 'q'}
    clip = AnswerInfo.refused(5, 'hi', 'zero frames', cameras=camera_report(request))
    assert _keys(clip) == ['request_id', 'prompt', 'text', 'image', *CAMERA_KEYS,
                           'finish_reason', 'error']


def test_the_json_is_strict():
    request = _request()
    info = AnswerInfo.answered(request, _result(valid=True, parsed={'x': float('nan')}),
                               camera_report(request), 'x')
    with pytest.raises(ValueError):
        info.to_json()
    with pytest.raises(ValueError):
        replace(info, parsed=None, ttft_ms=float('inf')).to_json()
    assert '\u00e9' in AnswerInfo.refused(1, 'caf\u00e9', 'r').to_json()    # not escaped


def test_the_topics_qos():
    pytest.importorskip('rclpy')
    from rclpy.qos import DurabilityPolicy, ReliabilityPolicy

    assert contract.PROMPT.qos().depth == 1000
    assert contract.READY.qos().durability == DurabilityPolicy.TRANSIENT_LOCAL
    assert contract.INFO.qos().reliability == ReliabilityPolicy.RELIABLE
    assert contract.image_qos(False).reliability == ReliabilityPolicy.BEST_EFFORT
    assert contract.image_qos(True).depth == 1
