# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``backend: openai`` in the parameter table and the ``backend`` status, without rclpy.

The server's settings are refused with one line naming the parameter (checked by the backend's
own ``OpenAIConfig``, once, with ``backend: openai``; their ranges whatever the backend); the
``OpenAIConfig`` the node builds sizes images as the local engine would; the ``/diagnostics``
status of a node on a server is WARN while it is down and just after an answer failed.
"""

from dataclasses import replace

import pytest

from orin_llm_node import parameters
from orin_llm_node.backends import BackendStats
from orin_llm_node.ros.diagnostics import OK, WARN, DiagnosticsMonitor, NodeFacts, level_of

DEFAULTS = {p.name: p.default for p in parameters.PARAMETERS}
SERVER = {'backend': 'openai', 'base_url': 'http://127.0.0.1:8000/v1', 'model': 'qwen'}


def _check(**values):
    parameters.check_parameters({**DEFAULTS, **values})


def test_the_local_backend_needs_no_server():
    _check()                                            # base_url and model empty: fine


@pytest.mark.parametrize(('values', 'name'), [
    ({'base_url': ''}, 'base_url'),
    ({'base_url': 'gpu-box:8000'}, 'base_url'),
    ({'base_url': 'http://user:secret@gpu-box/v1'}, 'base_url'),
    ({'model': ''}, 'model'),
    ({'api_key_env': 'sk-not-a-name!'}, 'api_key_env'),
    ({'backend': 'vllm'}, 'backend'),
])
def test_a_server_setting_the_backend_cannot_use_is_refused_naming_it(values, name):
    with pytest.raises(parameters.ParameterError) as err:
        _check(**{**SERVER, **values})
    text = str(err.value)
    assert text.startswith(f"parameter '{name}'") and '\n' not in text, text
    assert 'secret' not in text


@pytest.mark.parametrize(('name', 'value'), [
    ('backend_connect_timeout_s', 0.0), ('backend_read_timeout_s', -1.0),
    ('backend_request_timeout_s', float('inf')), ('backend_retries', 11),
    ('backend_retry_backoff_s', -0.5)])
def test_timeouts_and_retries_are_checked_whatever_the_backend(name, value):
    for backend in ({}, SERVER):
        assert f"parameter '{name}'" in parameters.check_parameter(name, value)
        with pytest.raises(parameters.ParameterError, match=name):
            _check(**backend, **{name: value})


def test_the_backend_config_comes_from_the_table(tiny_ckpt):
    config = parameters.openai_config({
        **DEFAULTS, **SERVER, 'model_path': str(tiny_ckpt), 'api_key_env': 'GPU_KEY',
        'backend_read_timeout_s': 7.0, 'backend_retries': 0, 'return_token_ids': True})
    assert (config.base_url, config.model, config.api_key_env) == (
        SERVER['base_url'], 'qwen', 'GPU_KEY')
    assert (config.read_timeout_s, config.retries, config.return_token_ids) == (7.0, 0, True)
    # Images sized by the checkpoint's processor within the node's own bounds.
    assert config.processor_path == str(tiny_ckpt)
    assert (config.image_max_pixels, config.image_min_pixels) == (307200, None)


def _statuses(monitor, now, stats):
    out = monitor.statuses(now, None, NodeFacts(state='active'), backend_stats=stats)
    assert [s.name for s in out] == ['orin_llm: generation', 'orin_llm: backend']
    return out[1]


def test_the_backend_status_is_warn_while_down_and_after_a_failure():
    monitor = DiagnosticsMonitor(period_s=1.0, warn_fraction=0.9)
    up = BackendStats('openai', 'http://gpu:8000/v1', 'qwen', server_model='qwen',
                      reachable=True, requests=1, last_ttft_s=0.25, last_decode_tok_s=30.0)
    status = _statuses(monitor, 0.0, up)
    values = {kv.key: kv.value for kv in status.values}
    assert level_of(status) == OK and '250 ms' in status.message
    assert values['reachable'] == 'true' and values['last_ttft_ms'] == '250'
    assert values['last_decode_tok_s'] == '30' and values['errors'] == '0'
    failed = replace(up, requests=2, errors=1, consecutive_errors=1,
                     last_error='the answer stream broke mid-answer')
    status = _statuses(monitor, 0.5, failed)
    assert level_of(status) == WARN and 'broke mid-answer' in status.message
    assert level_of(_statuses(monitor, 2.0, failed)) == OK     # one period later
    down = replace(failed, reachable=False, requests=3, errors=2,
                   last_error='server unreachable: connection refused')
    for now in (2.5, 10.0):                                     # as long as it is down
        status = _statuses(monitor, now, down)
        assert level_of(status) == WARN and 'unreachable' in status.message
    unknown = BackendStats('openai', 'http://gpu:8000/v1', 'qwen')
    values = {kv.key: kv.value for kv in _statuses(monitor, 11.0, unknown).values}
    assert values['last_ttft_ms'] == values['reachable'] == 'n/a'


def test_tools_with_the_openai_backend_are_refused_naming_the_parameter():
    tools = '[{"name": "stop"}]'
    _check(tools=tools)                                 # the local engine offers them
    with pytest.raises(parameters.ParameterError) as err:
        _check(**SERVER, tools=tools)
    assert str(err.value).startswith("parameter 'tools': backend openai sends no tools")
