# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ``prompt/json`` envelope's one table of keys: what it takes, what it refuses and why.

(The node's refusals over real rclpy: test_structured_node.py.)
"""

import json

import pytest

from orin_llm_node.ros.request_envelope import KEYS, EnvelopeError, parse_envelope

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def test_a_full_envelope_is_taken_as_it_is():
    env = {"prompt": "What colour?", "response_format": {"type": "json_schema",
                                                          "schema": SCHEMA},
           "max_new_tokens": 64, "temperature": 0.0, "conversation": "new", "tag": "t-1",
           "video_s": 4}
    assert parse_envelope(json.dumps(env)) == env
    assert parse_envelope('{"prompt": "hi"}') == {"prompt": "hi"}
    assert set(KEYS) == set(env)  # the table lists every key the README documents


@pytest.mark.parametrize(("text", "reason", "tag"), [
    ("not json", "not JSON", None),
    ('["prompt"]', "must be a JSON object, got list", None),
    ('{"tag": "a"}', "'prompt' is required", "a"),
    ('{"prompt": "  ", "tag": "b"}', "prompt must not be empty", "b"),
    ('{"prompt": 3}', "prompt must be a string", None),
    ('{"prompt": "x", "max_tokens": 5, "tag": "c"}', "unknown key(s) 'max_tokens'", "c"),
    ('{"prompt": "x", "max_new_tokens": 0}', "max_new_tokens must be a positive integer",
     None),
    ('{"prompt": "x", "max_new_tokens": true}', "max_new_tokens must be a positive integer",
     None),
    ('{"prompt": "x", "max_new_tokens": 2.5}', "max_new_tokens must be a positive integer",
     None),
    ('{"prompt": "x", "temperature": -1}', "temperature must be >= 0", None),
    ('{"prompt": "x", "temperature": "hot"}', "temperature must be a number", None),
    ('{"prompt": "x", "conversation": "old"}', "conversation must be one of 'new'", None),
    ('{"prompt": "x", "tag": 7}', "tag must be a string", None),
    ('{"prompt": "x", "video_s": -1}', "video_s must be >= 0", None),
    ('{"prompt": "x", "video_s": "4"}', "video_s must be a number", None),
    ('{"prompt": "x", "response_format": "json"}', "response_format must be an object", None),
    ('{"prompt": "x", "response_format": {"type": "yaml"}}', "response_format.type must be",
     None),
    ('{"prompt": "x", "response_format": {"type": "json_schema"}}', "needs 'schema'", None),
    ('{"prompt": "x", "response_format": {"type": "regex", "pattern": ""}}',
     "pattern must be a non-empty string", None),
    ('{"prompt": "x", "response_format": {"type": "json_object", "schema": {}}}',
     "takes no key schema", None),
])
def test_refusals_name_the_reason_and_keep_the_tag(text, reason, tag):
    with pytest.raises(EnvelopeError, match=None) as err:
        parse_envelope(text)
    assert reason in str(err.value)
    assert err.value.tag == tag
