# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""valid_text / valid_value: what UTF-8 cannot encode becomes U+FFFD, nothing else changes."""

import json

from orin_llm_node.ros.contract import AnswerInfo
from orin_llm_node.valid_text import valid_text, valid_value


def test_lone_surrogates_become_the_replacement_character():
    assert valid_text('cup \ud83d') == 'cup \ufffd'
    assert valid_text('\udfff\ud800') == '\ufffd\ufffd'
    assert valid_text('\ud83d\ude00!') == '\U0001f600!'     # a pair held as two code points
    text = 'plain, ñ, 中文, \U0001f600'
    assert valid_text(text) is text


def test_json_values_keys_included_at_any_depth():
    deep = ['\ud800']
    for _ in range(500):
        deep = [deep]
    fixed = valid_value({'k\udc00': [1, 2.5, None, True, {'x': '\ud83d'}], 'deep': deep})
    assert fixed['k\ufffd'] == [1, 2.5, None, True, {'x': '\ufffd'}]
    json.dumps(fixed, ensure_ascii=False).encode('utf-8')
    value = {'a': ['b']}
    assert valid_value(value) is value


def test_response_info_is_always_valid_unicode():
    info = AnswerInfo('refused', 1, 'what is \ud800?', 'refused', error='bad \udfff',
                      tag='t\udc00')
    text = info.to_json()
    text.encode('utf-8')
    assert json.loads(text)['prompt'] == 'what is \ufffd?'
