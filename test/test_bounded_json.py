# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""JSON from outside within bounds: every failure is a ``ValueError``, depth is bounded.

``json.loads`` raises ``RecursionError`` for 4 KB of brackets, and llguidance crashes the
process on a dict nested some tens of thousands of levels deep; ``bounded_json`` refuses both
before they reach anything that recurses, and the engine refuses such a ``response_format``.
"""

import sys

import pytest

from orin_llm_node import bounded_json
from orin_llm_node.bounded_json import MAX_DEPTH, depth, loads
from orin_llm_node.engine import SamplingParams
from orin_llm_node.engine.structured import check_response_format


def nested(levels):
    value = 1
    for i in range(levels):
        value = [value] if i % 2 else {'a': value}
    return value


def test_depth_counts_containers_without_recursion():
    assert depth(1) == depth('x') == 0
    assert depth({}) == depth([]) == 1
    assert depth({'a': [1, {'b': ()}]}) == 4
    assert depth(nested(100_000)) == MAX_DEPTH + 1      # stops once past the limit
    loop = []
    loop.append(loop)
    assert depth(loop) == MAX_DEPTH + 1                  # a cycle is only too deep


@pytest.mark.parametrize('levels', [MAX_DEPTH + 1, 2000, sys.getrecursionlimit() + 10, 50_000])
def test_too_deep_text_is_a_value_error(levels):
    with pytest.raises(ValueError, match=f'nested more than {MAX_DEPTH} levels deep'):
        loads('[' * levels + ']' * levels)
    with pytest.raises(ValueError, match='nested more than'):
        loads('{"a": ' * levels + '0' + '}' * levels)


def test_what_is_taken_and_what_is_not_json():
    assert loads('[' * MAX_DEPTH + ']' * MAX_DEPTH) is not None
    assert loads('{"x": [1, 2.5, "t", null, true]}') == {'x': [1, 2.5, 't', None, True]}
    for text, reason in (('{', 'not JSON: Expecting'), ('', 'not JSON'),
                         ('9' * 5000, 'not JSON: Exceeds the limit')):
        with pytest.raises(ValueError, match=reason):
            loads(text)
    with pytest.raises(ValueError, match='nested more than 3 levels'):
        bounded_json.loads('[[[[1]]]]', limit=3)


TOO_DEEP = r'nests too deeply for the constrained decoder \(nested more than 128'


def test_the_engine_refuses_a_response_format_dict_nested_too_deep():
    deep = {'type': 'json_schema', 'schema': {'type': 'array', 'items': nested(50_000)}}
    with pytest.raises(ValueError, match=TOO_DEEP):
        check_response_format(deep)
    with pytest.raises(ValueError, match=TOO_DEEP):
        SamplingParams(response_format=deep)
    ok = {'type': 'json_schema', 'schema': {'type': 'array', 'items': {'type': 'string'}}}
    assert check_response_format(ok) is ok
