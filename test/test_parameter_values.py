# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The parameter table's checks of values from outside, without rclpy.

``response_format`` is compiled when it is set (llguidance's own reason when its grammar does
not compile), is bounded in size and depth; the params files ``orin_llm_check`` reads are
refused with one line whatever they hold. (Over real rclpy: test_node_params.py.)
"""

import pytest

from orin_llm_node.parameter_files import values_from_files
from orin_llm_node.parameters import MAX_PROMPT_CHARS, ParameterError, check_parameter

DEEP = '[' * 3000 + ']' * 3000


def schema_format(levels):
    schema = '{"type": "array", "items": ' * levels + '{"type": "string"}' + '}' * levels
    return '{"type": "json_schema", "schema": ' + schema + '}'


@pytest.mark.parametrize(('value', 'reason'), [
    (DEEP, 'nested more than 128 levels deep'),
    (schema_format(3000), 'nested more than 128 levels deep'),
    ('{"type": "regex", "pattern": "' + 'x' * MAX_PROMPT_CHARS + '"}',
     f'is too long ({MAX_PROMPT_CHARS + 32} characters, limit {MAX_PROMPT_CHARS})'),
    ('[1, 2]', 'must be a JSON object'),
    ('{"type": "yaml"}', 'response_format.type must be one of'),
    ('{not json', 'not JSON'),
], ids=['deep', 'deep schema', 'too long', 'not an object', 'unknown type', 'not JSON'])
def test_a_response_format_that_cannot_be_used_is_refused_with_a_short_reason(value, reason):
    refused = check_parameter('response_format', value)
    assert refused is not None and reason in refused, refused
    assert refused.startswith("parameter 'response_format' = ") and len(refused) < 500


def test_a_grammar_the_library_rejects_is_refused_with_its_reason():
    pytest.importorskip('llguidance')
    refused = check_parameter('response_format', '{"type": "regex", "pattern": "("}')
    assert refused is not None and 'response_format rejected' in refused
    assert 'unclosed group' in refused and '\n' not in refused
    for good in ('', '{}', '{"type": "json_object"}', '{"type": "regex", "pattern": "(yes|no)"}',
                 schema_format(60)):
        assert check_parameter('response_format', good) is None, good


def test_check_overrides_refuse_deep_and_uncompilable_response_formats():
    with pytest.raises(ParameterError, match='nested more than 128'):
        values_from_files(overrides=[f'response_format:={DEEP}'])
    pytest.importorskip('llguidance')
    with pytest.raises(ParameterError, match='unclosed group'):
        values_from_files(overrides=['response_format:={"type": "regex", "pattern": "("}'])


@pytest.mark.parametrize(('content', 'reason'), [
    ('- just\n- a list\n', 'expected a mapping of node names to ros__parameters, got list'),
    ('orin_llm: [1, 2]\n', 'got list'),
    ('orin_llm:\n  ros__parameters: 7\n', 'got int'),
    ('a: ' + '[' * 5000 + ']' * 5000 + '\n', 'nested too deeply'),
    (b'\xff\xfe not text', 'codec can'),
    ('orin_llm: {ros__parameters: {top_p: [}}\n', 'params file'),
], ids=['list', 'section', 'ros__parameters', 'deep', 'not UTF-8', 'bad YAML'])
def test_a_params_file_that_cannot_be_read_is_one_line(tmp_path, content, reason):
    path = tmp_path / 'params.yaml'
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ParameterError) as err:
        values_from_files([path])
    assert reason in str(err.value) and '\n' not in str(err.value), err.value


def test_a_long_value_is_cut_in_the_reason():
    refused = check_parameter('system_prompt', 'x' * (MAX_PROMPT_CHARS + 1))
    assert refused is not None and 'is too long' in refused and len(refused) < 200
    assert f'({MAX_PROMPT_CHARS + 1} characters)' in refused
    assert check_parameter('temperature', 10**80).startswith(
        "parameter 'temperature' must be a double (e.g. 1.0), got 1000000000")
    assert check_parameter('max_new_tokens', '7') == (
        "parameter 'max_new_tokens' must be an integer, got '7'")


def test_the_temperature_range_is_the_samplers():
    # The table holds the float32 bound as a literal (it is read without importing torch).
    from orin_llm_node.engine.config import MAX_TEMPERATURE
    from orin_llm_node.parameters import FLOAT32_MAX, PARAMS_BY_NAME

    assert FLOAT32_MAX == MAX_TEMPERATURE
    assert PARAMS_BY_NAME['temperature'].bounds.high == MAX_TEMPERATURE
