# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check`` run as the integrator runs it (a real process), on this CPU machine."""

import json
import subprocess
import sys

from conftest import REPO
import pytest


def run_check(tmp_path, *overrides):
    out = tmp_path / 'check.json'
    cmd = [sys.executable, '-m', 'orin_llm_node.check', '--params-file',
           str(REPO / 'config/orin_llm.yaml'), '--json', str(out)]
    for o in overrides:
        cmd += ['-p', o]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc, json.loads(out.read_text()) if out.is_file() else None


def test_check_passes_on_a_cpu_and_lists_what_it_skipped(tiny_ckpt, tmp_path):
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cpu')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {c['name']: c['status'] for c in report['checks']}
    assert status['memory plan'] == 'pass' and status['tiny decode'] == 'pass'
    for skipped in ('kernels compile', 'fused kernels', 'graph == eager'):
        assert status[skipped] == 'skip'
    assert 'skipped: ' in proc.stdout and 'kernels compile' in proc.stdout.splitlines()[-1]
    assert report['memory_plan']['fits'] and report['memory_plan']['weights'] > 0
    assert report['environment']['numpy'] and report['tiny_checkpoint']['decode_tok_s'] > 0
    assert 'power' in report


def test_check_fails_and_names_the_fix_when_the_model_cannot_fit(tiny_ckpt, tmp_path):
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cpu',
                             'max_model_len:=4000000000')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(c for c in report['checks'] if c['name'] == 'memory plan')
    assert row['status'] == 'fail' and 'max_model_len=' in row['fix']
    assert 'fix: set max_model_len=' in proc.stdout


def test_a_bad_parameter_is_one_line(tmp_path):
    proc, report = run_check(tmp_path, 'top_p:=1.5')
    assert proc.returncode == 2 and report is None
    assert proc.stderr.strip().count('\n') == 0 and "'top_p'" in proc.stderr


def test_console_script_is_declared():
    assert "orin_llm_check = {PACKAGE}.check:main" in (REPO / 'setup.py').read_text()


def test_cuda_asked_for_on_a_cpu_is_a_failure_with_the_fix(tiny_ckpt, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cuda')
    assert proc.returncode == 1
    row = report['checks'][0]
    assert row['name'] == 'device' and row['status'] == 'fail' and 'device:=cpu' in row['fix']


def test_fused_kernel_checks_pass_on_the_cpu_kernel_emulator():
    """The GPU-only rows, run here: the kernels emulated on the CPU (test/kernel_emulator.py)."""
    import kernel_emulator
    import torch

    from orin_llm_node import check

    if not kernel_emulator.compiler_available():
        pytest.skip('no C compiler for the kernel emulator')
    rows = check._fused(torch.device('cpu'),
                        launcher=lambda dtype: kernel_emulator.emulated_launch(dtype, 128))
    names = {r.name for r in rows}
    assert {'rms_norm bfloat16', 'add_rms_norm float16', 'silu_and_mul float32',
            'quant_linear int4_asym bfloat16', 'quant_linear fp8 float32'} <= names
    assert all(r.status == check.PASS for r in rows), [(r.name, r.detail) for r in rows
                                                       if r.status != check.PASS]


@pytest.mark.parametrize('value', ['[' * 3000 + ']' * 3000,
                                   '{"type": "regex", "pattern": "("}'],
                         ids=['deep', 'bad regex'])
def test_a_response_format_that_cannot_be_used_is_one_line(tmp_path, value):
    if 'regex' in value:
        pytest.importorskip('llguidance')
    proc, report = run_check(tmp_path, f'response_format:={value}')
    assert proc.returncode == 2 and report is None, proc.stderr[-2000:]
    assert proc.stderr.strip().count('\n') == 0 and 'Traceback' not in proc.stderr
    assert "parameter 'response_format'" in proc.stderr and len(proc.stderr) < 600
    assert ('nested more than 128' if '[[' in value else 'unclosed group') in proc.stderr
