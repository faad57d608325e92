# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A model whose logits hold a NaN, behind a node process, over real loopback DDS.

Sampling at temperature > 0: each answer ends with ``finish_reason: "error"`` and the reason on
``response/info`` and ``error``, and the node serves the next prompt (on CUDA the old draw was
a device-side assert that left the process without a usable GPU).
"""

import pytest

rclpy = pytest.importorskip('rclpy')

from _ros_harness import EVENT_TIMEOUT, connect, start_node, stop  # noqa: E402

pytestmark = pytest.mark.ros

NS = '/llm_non_finite'


def test_a_nan_step_is_an_error_answer_and_the_node_serves_on(poisoned_ckpt, tmp_path):
    proc = start_node(poisoned_ckpt, NS, tmp_path, 'temperature:=0.8', 'seed:=3',
                      'max_new_tokens:=6')
    probe = None
    try:
        probe = connect(proc, NS)
        probe.spin_until(lambda: probe.node.count_publishers(f'{NS}/response/info') > 0,
                         EVENT_TIMEOUT, 'the response/info publisher')
        for text in ('What is in front of you?', 'Is the path clear?'):
            info = probe.ask_info(text)
            assert info['finish_reason'] == 'error' and info['text'] is None, info
            assert 'NaN' in info['error'] and 'no token to pick' in info['error'], info
            assert info['generated_tokens'] == 0 and info['prompt_tokens'] > 0, info
            probe.spin_until(lambda t=text: any(t in e and 'NaN' in e for e in probe.errors),
                             EVENT_TIMEOUT, f'the error line for {text!r}')
        probe.spin_until(lambda: probe.generation()[2].get('last_finish_reason') == 'error',
                         EVENT_TIMEOUT, 'last_finish_reason error in the diagnostics')
        assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    finally:
        if probe is not None:
            probe.close()
        stop(proc)
