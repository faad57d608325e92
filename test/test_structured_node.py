# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``prompt/json`` and the ``response_format`` parameter over real loopback DDS.

A node process on the demo checkpoint: every refusal of the envelope (reason on ``error`` and
``response/info``, the tag echoed), a constrained answer about a red circle (``json``,
``valid``), ``max_new_tokens`` / ``conversation`` overrides, the ``response_format``
parameter for plain prompts; grammars that cannot give a valid answer (one sentence on
``error`` and ``response/info``, no trace in the conversation). A second node process on a
tiny checkpoint runs without llguidance: it starts, answers plain prompts and refuses
constrained ones with the reason. A third, on random weights sampled at temperature 1, answers
numbers beyond a float's range: ``response/info`` stays strict JSON.
"""

import json
from pathlib import Path
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import RELIABLE, JsonProbe, connect, ros_env, start_node, stop  # noqa: E402
from _structured_cases import (  # noqa: E402
    DEAD_AFTER_KEY,
    FORCED_VISION,
    ROBOT_SCHEMA,
    SELF_REF,
    TOO_BIG,
)
from std_msgs.msg import String  # noqa: E402

from orin_llm_node.testing import shapes  # noqa: E402

pytestmark = pytest.mark.ros

DEMO = Path(__file__).resolve().parents[1] / 'orin_llm_node' / 'demo_model'
NS = '/llm_json'
NO_LIB_NS = '/llm_json_nolib'
NUMBERS_NS = '/llm_json_numbers'
TIMEOUT = 60.0


class EnvelopeProbe(JsonProbe):
    """A JsonProbe that also keeps ``response/info`` as published, and sends raw text."""

    def __init__(self, ns):
        super().__init__(ns, timeout=TIMEOUT)
        self.raw_infos = []  # response/info as published (the Probe's infos are parsed)
        self.node.create_subscription(String, f'{ns}/response/info',
                                      lambda m: self.raw_infos.append(m.data), RELIABLE)
        self.spin_until(lambda: self.pub_json.get_subscription_count() > 0, 20.0,
                        'the prompt/json subscription')
        self.hello()

    def send(self, envelope, raw=None):
        """Publish an envelope (or ``raw`` text); the response/info that carries its tag."""
        if raw is None:
            return super().send(envelope)
        self.sent += 1
        n_info = len(self.infos)
        self.pub_json.publish(String(data=raw))

        def mine():
            return [i for i in self.infos[n_info:] if i.get('tag') != 'hello']

        self.spin_until(mine, TIMEOUT, f'response/info for raw request {self.sent}')
        return mine()[0]

    def raw_info(self, tag):
        """The text of the ``response/info`` message that carries ``tag``."""
        def mine():
            return [r for r in self.raw_infos if f'"tag": "{tag}"' in r]

        self.spin_until(mine, TIMEOUT, f'the published response/info for {tag}')
        return mine()[0]


@pytest.fixture(scope='module')
def probe(tmp_path_factory):
    proc = start_node(DEMO, NS, tmp_path_factory.mktemp('json_node'), 'max_new_tokens:=48',
                      'conversation_mode:=chat')
    p = None
    try:
        connect(proc, NS).close()
        p = EnvelopeProbe(NS)
        p.log_path = proc.log_path
        yield p
    finally:
        if p is not None:
            p.close()
        stop(proc)


@pytest.mark.parametrize(('raw', 'reason'), [
    ('{"prompt": ', 'not JSON'),
    ('["What colour?"]', 'must be a JSON object'),
    ('{"prompt": "Hi", "tag": "bad1", "colour": "red"}', "unknown key(s) 'colour'"),
    ('{"tag": "bad2"}', "'prompt' is required"),
    ('{"prompt": "Hi", "tag": "bad3", "max_new_tokens": -4}',
     'max_new_tokens must be a positive integer'),
    ('{"prompt": "Hi", "tag": "bad4", "temperature": "warm"}', 'temperature must be a number'),
    ('{"prompt": "Hi", "tag": "bad5", "conversation": "keep"}', 'conversation must be one of'),
    ('{"prompt": "Hi", "tag": "bad6", "response_format": {"type": "xml"}}',
     'response_format.type must be one of'),
])
def test_every_refusal_names_its_reason_and_echoes_the_tag(probe, raw, reason):
    n_err = len(probe.errors)
    info = probe.send(None, raw=raw)
    assert info['finish_reason'] == 'refused' and info['text'] is None
    assert reason in info['error'], info
    tag = json.loads(raw).get('tag') if raw.startswith('{"prompt": "Hi"') or 'tag' in raw \
        else None
    assert info.get('tag') == tag
    probe.spin_until(lambda: any(reason in e for e in probe.errors[n_err:]), 10.0,
                     f'{reason!r} on error')


@pytest.mark.parametrize(('envelope', 'reason'), [
    ({'response_format': {'type': 'json_schema', 'schema': {'type': 'object', 'properties': {
        'x': {'type': 'string', 'pattern': '(unclosed'}}}}}, 'response_format rejected'),
    ({'response_format': {'type': 'regex', 'pattern': '('}}, 'unclosed group'),
    ({'temperature': 1e-300}, 'temperature must be 0 (greedy) or a finite number in'),
    ({'temperature': 1e39}, 'the normal float32 range'),
])
def test_values_the_engine_would_refuse_are_refused_with_the_tag(probe, envelope, reason):
    info = probe.send({'prompt': 'Hi', **envelope})
    assert info['finish_reason'] == 'refused' and reason in info['error'], info
    assert info['tag'] == f't{probe.sent}' and info['text'] is None


def _nested_schema(levels):
    return '{"type": "array", "items": ' * levels + '{"type": "string"}' + '}' * levels


def test_deep_json_is_refused_and_the_node_serves_on(probe):
    deep = '[' * 2000 + ']' * 2000              # 4 KB: RecursionError in json.loads
    for raw in (deep, '{"prompt": "Hi", "tag": ' + deep + '}',
                '{"prompt": "Hi", "tag": "deep", "response_format": {"type": "json_schema", '
                '"schema": ' + _nested_schema(3000) + '}}',
                '{"prompt": "Hi", "tag": "deep", "response_format": {"type": "json_schema", '
                '"schema": ' + _nested_schema(400) + '}}'):
        info = probe.send(None, raw=raw)
        assert info['finish_reason'] == 'refused', info
        assert info['error'] == 'prompt/json refused: nested more than 128 levels deep'
    answer = probe.send({'prompt': 'What shape is it?', 'conversation': 'new'})
    assert answer['finish_reason'] in ('stop', 'length') and answer['error'] is None
    assert answer['text'], answer


def test_constrained_answer_about_the_image(probe):
    scene = shapes.simple_scene('circle', 'red', height=160, width=200)
    probe.send_image(probe.image(scene.image))
    n_resp = len(probe.responses)
    info = probe.send({'prompt': 'What colour is the shape?', 'conversation': 'new',
                       'response_format': {'type': 'json_schema', 'schema': ROBOT_SCHEMA}})
    assert info['finish_reason'] == 'stop' and info['valid'] is True, info
    assert info['image'] is not None
    jsonschema.validate(info['json'], ROBOT_SCHEMA)
    assert info['json']['colour'] == 'red'
    probe.spin_until(lambda: len(probe.responses) > n_resp, 10.0, 'the response')
    assert json.loads(probe.responses[n_resp]) == info['json']
    # Too few tokens: the answer is cut (length) and never valid.
    cut = probe.send({'prompt': 'What colour is the shape?', 'max_new_tokens': 3,
                      'response_format': {'type': 'json_schema', 'schema': ROBOT_SCHEMA}})
    assert cut['finish_reason'] == 'length' and cut['valid'] is False and cut['json'] is None
    assert cut['generated_tokens'] == 3


def test_conversation_new_and_continue(probe):
    first = probe.send({'prompt': 'What shape is it?', 'conversation': 'new'})
    second = probe.send({'prompt': 'And what colour is it?', 'conversation': 'continue'})
    assert second['prompt_tokens'] > first['prompt_tokens'] + first['generated_tokens']
    again = probe.send({'prompt': 'What shape is it?', 'conversation': 'new'})
    assert again['prompt_tokens'] == first['prompt_tokens']
    assert 'valid' not in first and 'json' not in first  # unconstrained: no verdict


def test_response_format_parameter_constrains_plain_prompts(probe):
    results = probe.set_params(response_format='{"type": "regex", "pattern": "(yes|no)"}')
    assert results[0].successful, results[0].reason
    try:
        info = probe.ask_info('Is there a shape?')
        assert info['finish_reason'] == 'stop' and info['valid'] is True
        assert info['text'] in ('yes', 'no') and info['json'] is None
    finally:
        assert probe.set_params(response_format='')[0].successful
    bad = probe.set_params(response_format='{"type": "yaml"}')
    assert not bad[0].successful and 'response_format' in bad[0].reason
    assert 'valid' not in probe.ask_info('Is there a shape now?')


def history_tokens(probe, bad_format=None):
    """``prompt_tokens`` of a follow-up after one answered turn, and the turn in between.

    With ``bad_format``, a constrained turn is asked between the two; its response/info is
    returned too. A fresh frame first: every prompt of the sequence pairs with it (an older
    one could age out of ``image_max_age_s`` half-way on a slow machine).
    """
    scene = shapes.simple_scene('star', 'green', height=96, width=96)
    probe.send_image(probe.image(scene.image))
    first = probe.send({'prompt': 'What shape is it?', 'conversation': 'new'})
    bad = None
    if bad_format is not None:
        bad = probe.send({'prompt': 'Report it.', 'response_format': bad_format})
    follow = probe.send({'prompt': 'And what colour is it?'})
    assert first['image'] is not None and follow['image'] is not None, (first, follow)
    return follow['prompt_tokens'], bad


@pytest.mark.parametrize(('fmt', 'sentence'), [
    ({'type': 'json_schema', 'schema': SELF_REF}, 'the schema admits no JSON value at all'),
    ({'type': 'regex', 'pattern': r'[^\s\S]'}, 'the regex matches no text at all'),
    ({'type': 'regex', 'pattern': r'<\|im_end\|>ok'}, "spells the control token '<|im_end|>'"),
    ({'type': 'json_schema', 'schema': {'enum': ['<|im_end|>']}},
     "spells the control token '<|im_end|>'"),
    ({'type': 'regex', 'pattern': r'<\|image_pad\|>'},
     "spells the control token '<|image_pad|>'"),
    ({'type': 'regex', 'pattern': FORCED_VISION}, 'spelt only by a control token'),
    ({'type': 'json_schema', 'schema': DEAD_AFTER_KEY},
     "admits no JSON value after the answer's first 5 tokens"),
], ids=['self-ref', 'empty-class', 'regex-im_end', 'enum-im_end', 'regex-image_pad',
        'forced-vision-token', 'ref-dead-end'])
def test_a_grammar_without_a_valid_answer_is_an_error_and_leaves_no_trace(probe, fmt,
                                                                          sentence):
    """Never ``stop`` without ``valid``: refused before the turn, or failed mid-answer."""
    n_err = len(probe.errors)
    clean, _ = history_tokens(probe)
    after_bad, info = history_tokens(probe, fmt)
    assert after_bad == clean, info  # the failed turn left nothing in the conversation
    assert info['finish_reason'] == 'error' and info['text'] is None, info
    assert sentence in info['error'] and len(info['error']) < 300, info['error']
    assert info.get('valid') is not True
    probe.spin_until(lambda: any(sentence in e for e in probe.errors[n_err:]), 10.0,
                     f'{sentence!r} on error')


def test_the_library_dumps_go_to_the_log_and_one_sentence_to_error(probe):
    n_err = len(probe.errors)
    info = probe.send({'prompt': 'Say a.', 'response_format': {'type': 'regex',
                                                               'pattern': TOO_BIG}})
    assert info['finish_reason'] == 'error', info
    error = info['error']
    assert error.startswith('the regex is too big') and len(error) < 200, error
    assert '<state>' not in error and '\n' not in error and 'lexer' not in error
    probe.spin_until(lambda: any(error in e for e in probe.errors[n_err:]), 10.0,
                     'the sentence on error')
    probe.spin_until(lambda: 'too many expressions' in probe.log_path.read_text(), 10.0,
                     "the library's detail in the node's log")


@pytest.fixture(scope='module')
def numbers_node(tiny_ckpt, tmp_path_factory):
    """A node on random weights that samples at temperature 1 (seeded per prompt)."""
    proc = start_node(tiny_ckpt, NUMBERS_NS, tmp_path_factory.mktemp('numbers'),
                      'max_new_tokens:=40', 'temperature:=1.0', 'conversation_mode:=single')
    try:
        connect(proc, NUMBERS_NS).close()
        p = EnvelopeProbe(NUMBERS_NS)
        yield p
        p.close()
    finally:
        stop(proc)


def _reject_constant(name):
    raise ValueError(f'{name} is not strict JSON')


def test_numbers_beyond_a_float_are_null_and_response_info_stays_strict(numbers_node):
    fmt = {'type': 'json_schema', 'schema': {'type': 'array', 'items': {'type': 'number'},
                                             'minItems': 1, 'maxItems': 2}}
    beyond = 0
    for seed in range(150):
        assert numbers_node.set_params(seed=seed)[0].successful
        info = numbers_node.send({'prompt': 'Numbers?', 'response_format': fmt})
        raw = numbers_node.raw_info(f't{numbers_node.sent}')
        assert json.loads(raw, parse_constant=_reject_constant) == info  # strict JSON
        assert info['valid'] is (info['finish_reason'] == 'stop'), info
        if not info['valid']:
            continue
        text_values = json.loads(info['text'])  # Python's reading: inf past a float's range
        assert info['json'] == [None if np.isinf(x) else x for x in text_values], info
        beyond += any(np.isinf(x) for x in text_values)
        if beyond:
            break
    assert beyond, 'no answer overflowed a float in 150 sampled answers'


def chat(*args):
    cmd = [sys.executable, '-m', 'orin_llm_node.cli.chat', '-n', NS, '--timeout', '120']
    return subprocess.run(cmd + list(args), env=ros_env(), capture_output=True,
                          text=True, timeout=180)


def test_chat_client_schema_and_json(probe, tmp_path):
    import cv2

    image = tmp_path / 'blue_square.png'
    rgb = shapes.simple_scene('square', 'blue', 160, 200).image
    assert cv2.imwrite(str(image), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    schema = tmp_path / 'robot.schema.json'
    schema.write_text(json.dumps(ROBOT_SCHEMA))
    out = chat('--image', str(image), '--schema', str(schema), 'What colour is the shape?')
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout)
    jsonschema.validate(answer, ROBOT_SCHEMA)
    assert answer['colour'] == 'blue' and 'valid=true' in out.stderr
    out = chat('--json', 'What shape is it?')
    assert out.returncode == 0, out.stderr[-2000:]
    assert isinstance(json.loads(out.stdout), dict)
    schema.write_text('{not json')
    out = chat('--schema', str(schema), 'Hi')
    assert out.returncode == 2 and 'not JSON' in out.stderr
    schema.write_text(json.dumps({'type': 'string', 'pattern': '(unclosed'}))
    out = chat('--schema', str(schema), 'Hi')      # the node's verdict: refused, exit 1
    assert out.returncode == 1 and 'prompt refused' in out.stderr, out.stderr[-2000:]
    assert 'response_format rejected' in out.stderr


@pytest.fixture(scope='module')
def no_lib_node(tiny_ckpt, tmp_path_factory):
    """A node process in which ``import llguidance`` fails."""
    blocker = tmp_path_factory.mktemp('no_llguidance')
    (blocker / 'llguidance.py').write_text("raise ImportError('llguidance blocked by the test')\n")
    env = ros_env()
    env['PYTHONPATH'] = f"{blocker}:{env.get('PYTHONPATH', '')}"
    proc = start_node(tiny_ckpt, NO_LIB_NS, tmp_path_factory.mktemp('nolib'),
                      'max_new_tokens:=4', env=env)
    try:
        connect(proc, NO_LIB_NS).close()
        p = EnvelopeProbe(NO_LIB_NS)
        yield p
        p.close()
    finally:
        stop(proc)


def test_without_llguidance_the_node_runs_and_refuses_constrained_requests(no_lib_node):
    info = no_lib_node.send({'prompt': 'Hi', 'response_format': {'type': 'json_object'}})
    assert info['finish_reason'] == 'refused' and 'needs llguidance' in info['error']
    assert 'pip install llguidance' in info['error']
    plain = no_lib_node.send({'prompt': 'Hi'})
    assert plain['finish_reason'] in ('stop', 'length') and plain['error'] is None
    assert np.isfinite(plain['ttft_ms'])
