# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The managed node (``--managed``) over real loopback DDS, driven like ``ros2 lifecycle set``.

Every transition, a prompt in every state (exactly one ``response/info`` each), cleanup ->
configure again, and the memory the engine holds: the process's resident memory before configure,
after configure and after cleanup (printed; cleanup must give back at least the weight bytes). The
checkpoint is a tiny one with a wide MLP (~75 MB of fp32 weights) so that the weights stand out of
the noise.
"""

import gc
from pathlib import Path
import signal
import time

import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import EVENT_TIMEOUT, EXIT_WITHIN_S, Probe, memory_mb, start_node, stop  # noqa: E402
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rcl_interfaces.srv import GetParameters  # noqa: E402

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_lifecycle'
SYSTEM = 'You are a test robot.'


@pytest.fixture(scope='module')
def wide_ckpt(make_ckpt):
    return make_ckpt('wide_mlp', text_config={'intermediate_size': 32768})


def test_every_transition(wide_ckpt, tmp_path, capsys):
    weights_mb = sum(f.stat().st_size for f in Path(wide_ckpt).glob('*.safetensors')) / 2**20
    conv_ref = LLMEngine(EngineConfig(model_path=wide_ckpt, device='cpu'))
    expected = conv_ref.chat(conv_ref.new_conversation(SYSTEM), 'Hello there.',
                             sampling=SamplingParams(max_tokens=4)).text
    del conv_ref
    gc.collect()
    proc = start_node(wide_ckpt, NS, tmp_path, 'max_new_tokens:=4', managed=True)
    probe = Probe(NS)
    try:
        probe.spin_until(lambda: probe.ready is not None or proc.poll() is not None, 60.0,
                         'the latched ready')
        assert proc.poll() is None, proc.log_path.read_text()[-2000:]
        change = probe.node.create_client(ChangeState, f'{NS}/orin_llm/change_state')
        get = probe.node.create_client(GetState, f'{NS}/orin_llm/get_state')

        def transition(tid):
            req = ChangeState.Request()
            req.transition.id = tid
            assert probe.call(change, req, timeout=120.0).success, tid

        def state():
            return probe.call(get, GetState.Request()).current_state.id

        def refused(text, why):
            """Exactly one response/info for ``text``: refused, naming the state."""
            info = probe.ask_info(text)
            assert info['text'] is None and info['finish_reason'] == 'refused', info
            assert f'node is {why}' in info['error'], info
            probe.spin_for(0.5)
            assert [i['prompt'] for i in probe.infos].count(text) == 1

        assert state() == State.PRIMARY_STATE_UNCONFIGURED
        probe.spin_until(lambda: probe.generation()[2].get('state') == 'unconfigured',
                         EVENT_TIMEOUT, 'diagnostics: unconfigured')
        assert probe.ready is False
        # Unconfigured: the prompt subscription is there and refuses with the state.
        probe.spin_until(lambda: probe.pub_prompt.get_subscription_count() > 0, 20.0,
                         'the prompt subscription while unconfigured')
        refused('Anyone home?', 'unconfigured')
        time.sleep(1.0)
        memory = {'before configure': memory_mb(proc, 'VmRSS')}

        for n in range(2):              # cleanup -> configure again must work
            transition(Transition.TRANSITION_CONFIGURE)
            assert state() == State.PRIMARY_STATE_INACTIVE and probe.ready is False
            memory.setdefault('after configure', memory_mb(proc, 'VmRSS'))
            probe.spin_until(lambda: probe.pub_prompt.get_subscription_count() > 0, 20.0,
                             'the prompt subscription')
            refused(f'Are you there? ({n})', 'inactive')

            transition(Transition.TRANSITION_ACTIVATE)
            probe.spin_until(lambda: probe.ready is True, EVENT_TIMEOUT, 'ready true')
            probe.reset()
            assert probe.ask('Hello there.') == expected

            transition(Transition.TRANSITION_DEACTIVATE)
            probe.spin_until(lambda: probe.ready is False, EVENT_TIMEOUT, 'ready false')
            assert any(e.startswith('deactivated') for e in probe.errors)
            refused(f'Still there? ({n})', 'inactive')

            transition(Transition.TRANSITION_CLEANUP)
            assert state() == State.PRIMARY_STATE_UNCONFIGURED
            refused(f'After cleanup? ({n})', 'unconfigured')
            time.sleep(1.0)
            memory.setdefault('after cleanup', memory_mb(proc, 'VmRSS'))
        with capsys.disabled():
            print(f'\nmanaged node RSS (MB, weights {weights_mb:.0f} MB): '
                  + ', '.join(f'{k} {v:.0f}' for k, v in memory.items()))
        assert memory['after configure'] - memory['after cleanup'] >= weights_mb, memory

        transition(Transition.TRANSITION_UNCONFIGURED_SHUTDOWN)
        assert proc.wait(timeout=30) == 0
    finally:
        probe.close()
        stop(proc)


# A warm-up of tens of seconds on a CI core: 1080p-sized vision grids through a 6-block tower.
SLOW_PIXELS = 1920 * 1088


@pytest.fixture(scope='module')
def slow_warmup_ckpt(make_ckpt):
    from orin_llm_node.testing.tiny_checkpoint import write_preprocessor_config
    path = make_ckpt('slow_warmup', vision_config={'depth': 6})
    write_preprocessor_config(path, max_pixels=SLOW_PIXELS)
    return path


@pytest.fixture(scope='module')
def slower_warmup_ckpt(make_ckpt):
    """Twice the vision blocks: configure outlasts every check below by a wide margin."""
    from orin_llm_node.testing.tiny_checkpoint import write_preprocessor_config
    path = make_ckpt('slower_warmup', vision_config={'depth': 12})
    write_preprocessor_config(path, max_pixels=SLOW_PIXELS)
    return path


@pytest.mark.parametrize('phase', ['loading', 'loaded in'])
def test_a_signal_during_configure_ends_the_process_at_once(slow_warmup_ckpt, tmp_path, phase):
    ns = '/llm_lifecycle_signal'
    proc = start_node(slow_warmup_ckpt, ns, tmp_path, f'image_max_pixels:={SLOW_PIXELS}',
                      managed=True)
    probe = Probe(ns)
    try:
        probe.spin_until(lambda: probe.ready is not None or proc.poll() is not None, 60.0,
                         'the latched ready')
        change = probe.node.create_client(ChangeState, f'{ns}/orin_llm/change_state')
        assert change.wait_for_service(timeout_sec=30.0)
        req = ChangeState.Request()
        req.transition.id = Transition.TRANSITION_CONFIGURE
        change.call_async(req)                   # configure runs; the test does not wait
        probe.spin_until(lambda: f']: {phase} ' in proc.log_path.read_text(), 120.0,
                         f'the log line "{phase}"')
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, proc.log_path.read_text()[-2000:]
        elapsed = time.monotonic() - t0
        log = proc.log_path.read_text()
        assert 'warm-up done' not in log, 'the signal waited for the whole warm-up'
        assert elapsed < EXIT_WITHIN_S, f'{elapsed:.1f} s after SIGINT'
        assert 'Traceback' not in log, log[-3000:]
    finally:
        probe.close()
        stop(proc)


def _timed(call):
    t0 = time.monotonic()
    result = call()
    return result, time.monotonic() - t0


# What "at once" means while configure runs: a service reply or a refusal within this long (it
# took as long as the whole configure, tens of seconds here, when configure held the executor).
ANSWER_WITHIN_S = 1.0


def test_the_node_answers_while_configure_runs(slower_warmup_ckpt, tmp_path):
    """While configure runs, the node answers: get_state, parameters, diagnostics, prompts.

    get_state, a parameter get and set answer within a second, the diagnostics timer ticks,
    and a prompt sent meanwhile is refused at once with the state (loading).
    """
    ns = '/llm_lifecycle_busy'
    proc = start_node(slower_warmup_ckpt, ns, tmp_path, f'image_max_pixels:={SLOW_PIXELS}',
                      'max_new_tokens:=4', managed=True)
    probe = Probe(ns)
    try:
        probe.spin_until(lambda: probe.ready is not None or proc.poll() is not None, 60.0,
                         'the latched ready')
        change = probe.node.create_client(ChangeState, f'{ns}/orin_llm/change_state')
        get = probe.node.create_client(GetState, f'{ns}/orin_llm/get_state')
        get_params = probe.node.create_client(GetParameters, f'{ns}/orin_llm/get_parameters')
        for client in (change, get, get_params, probe.param_client):
            assert client.wait_for_service(timeout_sec=30.0), client.srv_name
        probe.spin_until(lambda: probe.pub_prompt.get_subscription_count() > 0, 20.0,
                         'the prompt subscription')
        req = ChangeState.Request()
        req.transition.id = Transition.TRANSITION_CONFIGURE
        configured = change.call_async(req)
        probe.spin_until(lambda: ']: loading ' in proc.log_path.read_text(), 120.0,
                         'configure to start loading')

        def configuring():
            state, took = _timed(lambda: probe.call(get, GetState.Request(), timeout=60.0))
            assert took < ANSWER_WITHIN_S, f'get_state took {took:.1f} s'
            return state.current_state.id == State.TRANSITION_STATE_CONFIGURING

        assert configuring()
        reply, took = _timed(lambda: probe.call(
            get_params, GetParameters.Request(names=['max_new_tokens']), timeout=60.0))
        assert reply.values[0].integer_value == 4 and took < ANSWER_WITHIN_S, took
        results, took = _timed(lambda: probe.set_params(max_new_tokens=3))
        assert results[0].successful and took < ANSWER_WITHIN_S, took
        n_diag = len(probe.diag_log)
        probe.spin_for(2.0)
        ticks = [entry for name, entry in probe.diag_log[n_diag:]
                 if name == 'orin_llm: generation' and entry[2].get('state') == 'loading']
        assert len(ticks) >= 2, f'{len(ticks)} diagnostics in 2 s (period 0.5 s)'
        info, took = _timed(lambda: probe.ask_info('Are you loading?', timeout=60.0))
        assert info['finish_reason'] == 'refused' and 'node is loading' in info['error'], info
        assert took < ANSWER_WITHIN_S, f'the refusal took {took:.1f} s'
        assert configuring(), 'configure ended before every check ran: nothing was shown'
        probe.spin_until(configured.done, 300.0, 'configure to finish')
        assert configured.result().success
        req.transition.id = Transition.TRANSITION_INACTIVE_SHUTDOWN
        assert probe.call(change, req).success
        assert proc.wait(timeout=30) == 0
        assert 'Traceback' not in proc.log_path.read_text()
    finally:
        probe.close()
        stop(proc)


def test_configure_refuses_a_model_that_cannot_fit(tiny_ckpt, tmp_path):
    """A configure fails with the memory plan's line and the node stays unconfigured."""
    ns = '/llm_lifecycle_no_fit'
    proc = start_node(tiny_ckpt, ns, tmp_path, 'max_model_len:=4000000000', managed=True)
    probe = Probe(ns)
    try:
        probe.spin_until(lambda: probe.ready is not None or proc.poll() is not None, 60.0,
                         'the latched ready')
        change = probe.node.create_client(ChangeState, f'{ns}/orin_llm/change_state')
        get = probe.node.create_client(GetState, f'{ns}/orin_llm/get_state')
        req = ChangeState.Request()
        req.transition.id = Transition.TRANSITION_CONFIGURE
        assert probe.call(change, req, timeout=60.0).success is False
        assert probe.call(get, GetState.Request()).current_state.id == \
            State.PRIMARY_STATE_UNCONFIGURED
        probe.spin_until(lambda: 'does not fit' in probe.generation()[1], 10.0,
                         'the refusal in diagnostics')
        assert any('does not fit in memory' in e for e in probe.errors)
        assert proc.poll() is None
        req.transition.id = Transition.TRANSITION_UNCONFIGURED_SHUTDOWN
        assert probe.call(change, req).success
        assert proc.wait(timeout=30) == 0
    finally:
        probe.close()
        stop(proc)
