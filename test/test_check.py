# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check`` run as the integrator runs it (a real process), on this CPU machine."""

import json
from pathlib import Path
import subprocess
import sys

from conftest import REPO
import pytest


def run_check(tmp_path, *overrides):
    out = tmp_path / 'check.json'
    cmd = [sys.executable, '-m', 'orin_llm_node.cli.check', '--params-file',
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
    # setup.cfg declares the console scripts for pip and for colcon build (CMakeLists.txt).
    assert 'orin_llm_check = orin_llm_node.cli.check:main' in (REPO / 'setup.cfg').read_text()


def test_cuda_asked_for_on_a_cpu_is_a_failure_with_the_fix(tiny_ckpt, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cuda')
    assert proc.returncode == 1
    row = report['checks'][0]
    assert row['name'] == 'device' and row['status'] == 'fail' and 'device:=cpu' in row['fix']


def _emulated_rows(launchers):
    """check_kernels.fused_rows on the CPU kernel emulator; each dtype's counter in ``launchers``.

    The device is ``cpu:0``, which no CPU tensor reports (they say ``cpu``): the CPU's
    ``cuda`` (tensors report ``cuda:0``), so only a normalised device makes the ops launch.
    """
    import kernel_emulator
    import torch

    from orin_llm_node.cli.check_kernels import fused_rows

    if not kernel_emulator.compiler_available():
        pytest.skip('no C compiler for the kernel emulator')

    def launcher(dtype):
        launchers[dtype] = kernel_emulator.CountingLaunch(
            kernel_emulator.emulated_launch(dtype, 128))
        return launchers[dtype]

    return fused_rows(torch.device('cpu', 0), launcher=launcher)


def test_fused_kernel_rows_launch_every_kernel_on_the_cpu_kernel_emulator():
    """The GPU-only rows, run here: the kernels emulated on the CPU (test/kernel_emulator.py)."""
    from orin_llm_node.cli import check

    launchers = {}
    rows = _emulated_rows(launchers)
    names = {r.name for r in rows}
    assert {'rms_norm bfloat16', 'add_rms_norm float16', 'silu_and_mul float32',
            'quant_linear int4_asym bfloat16', 'quant_linear fp8 float32'} <= names
    assert all(r.status == check.PASS for r in rows), [(r.name, r.detail) for r in rows
                                                       if r.status != check.PASS]
    assert all('kernel launch' in r.detail for r in rows)
    kernels = {'rms_norm', 'add_rms_norm', 'silu_and_mul', 'quant_gemv_int8', 'quant_gemv_int4',
               'quant_gemv_fp8'}
    assert sorted(launchers) == ['bfloat16', 'float16', 'float32']
    for dtype, launch in launchers.items():
        assert set(launch.counts) == kernels, (dtype, launch.counts)


def test_a_fused_row_that_launched_no_kernel_fails(monkeypatch):
    """FusedOps keeping the device as named (cpu:0) matches no input: torch vs torch, FAIL."""
    import torch

    from orin_llm_node.cli import check
    from orin_llm_node.kernels import cuda_ops

    monkeypatch.setattr(cuda_ops, 'tensor_device', torch.device)
    launchers = {}
    rows = _emulated_rows(launchers)
    assert rows and all(r.status == check.FAIL for r in rows)
    assert all(r.detail.startswith('launched no kernel on cpu:0') for r in rows)
    assert all(not launch.counts for launch in launchers.values())


def test_fused_ops_take_the_device_index_their_tensors_report(monkeypatch):
    """``cuda`` is the current device as tensors name it (cuda:1 here); ``cpu:0`` is ``cpu``."""
    import torch

    from orin_llm_node.kernels import dispatch
    from orin_llm_node.kernels.cuda_ops import FusedOps

    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 1)
    for named, reported in (('cuda', 'cuda:1'), ('cuda:0', 'cuda:0'), ('cpu:0', 'cpu')):
        ops = FusedOps(torch.float32, 128, torch.device(named), launch=lambda *args: None)
        assert ops.device == torch.device(reported) == dispatch.tensor_device(named), named


def test_kernel_cache_is_cupys_directory_and_the_row_says_where(tmp_path, monkeypatch):
    from orin_llm_node.cli import check
    from orin_llm_node.cli.check_kernels import kernel_cache_row
    from orin_llm_node.kernels import cuda_ops

    monkeypatch.delenv('CUPY_CACHE_DIR', raising=False)
    monkeypatch.delenv('CUPY_CACHE_IN_MEMORY', raising=False)
    assert cuda_ops.kernel_cache()['dir'] == str(Path.home() / '.cupy/kernel_cache')
    cache_dir = tmp_path / 'cupy' / 'kernel_cache'  # not there yet: CuPy creates it
    monkeypatch.setenv('CUPY_CACHE_DIR', str(cache_dir))
    cache = cuda_ops.kernel_cache()
    assert cache == {'dir': str(cache_dir), 'in_memory': False, 'writable': True, 'modules': 0}
    cache_dir.mkdir(parents=True)
    for name in ('a.cubin', 'b.cubin', 'c.tmp'):
        (cache_dir / name).write_bytes(b'')
    cache = cuda_ops.kernel_cache()
    assert cache['modules'] == 2
    row = kernel_cache_row(cache, 2, 12.5)
    assert row.status == check.PASS and row.detail.startswith(f'{cache_dir} (CUPY_CACHE_DIR): '
                                                              '2 modules compiled and kept')
    assert 'every module loaded from the cache' in kernel_cache_row(cache, 0, 0.4).detail
    blocked = tmp_path / 'a-file'
    blocked.write_text('')
    monkeypatch.setenv('CUPY_CACHE_DIR', str(blocked / 'kernel_cache'))
    row = kernel_cache_row(cuda_ops.kernel_cache(), 0, 30.0)
    assert row.status == check.WARN and 'is not writable' in row.detail
    assert row.fix.startswith('export CUPY_CACHE_DIR=')
    monkeypatch.setenv('CUPY_CACHE_IN_MEMORY', '1')
    row = kernel_cache_row(cuda_ops.kernel_cache(), 0, 30.0)
    assert row.status == check.WARN and row.fix == 'unset CUPY_CACHE_IN_MEMORY'


def test_no_cuda_root_names_the_jetson_one():
    from orin_llm_node.cli import check
    from orin_llm_node.cli.check_kernels import cuda_root_row

    row = cuda_root_row(None)
    assert row.status == check.WARN and row.fix.startswith('export CUDA_PATH=/usr/local/cuda ')
    assert cuda_root_row('/usr/local/cuda').status == check.PASS


def test_greedy_gaps_are_zero_for_the_argmax_and_the_shortfall_otherwise():
    import torch

    from orin_llm_node.cli.check import greedy_gaps

    logits = torch.tensor([[0.0, 2.0, 1.9995], [3.0, -1.0, 0.0]])
    assert greedy_gaps(logits, [1, 0]).tolist() == [0.0, 0.0]
    gaps = greedy_gaps(logits, [2, 2])
    assert gaps[0].item() == pytest.approx(5e-4, abs=1e-6) and gaps[1].item() == 3.0


def test_fp32_row_passes_the_same_model_and_fails_another(make_ckpt, tiny_ckpt):
    """The fp32 rule on the CPU: a CPU engine's tokens scored by a CPU reference engine.

    The answer of the same checkpoint passes (each token is the reference's choice); the answer
    of a checkpoint with other weights does not.
    """
    from orin_llm_node.cli import check

    reference = check.tiny_engine(tiny_ckpt, 'cpu', 'float32', False)
    same = check.tiny_answer(check.tiny_engine(tiny_ckpt, 'cpu', 'float32', False))
    row = check.fp32_row('cpu', same, reference)
    assert row.status == check.PASS, row.detail
    assert row.detail.startswith(f'{check.DECODE_TOKENS} greedy tokens on cpu')
    other = check.tiny_answer(check.tiny_engine(make_ckpt('other-weights', seed=7), 'cpu',
                                                'float32', False))
    row = check.fp32_row('cpu', other, check.tiny_engine(tiny_ckpt, 'cpu', 'float32', False))
    assert row.status == check.FAIL and 'below its own choice (tolerance 0.001)' in row.detail


def test_the_eager_side_of_graph_vs_eager_prefills_at_the_graph_row_counts(tiny_ckpt):
    """The check's eager engine runs the follow-up padded to the bucket a graph engine replays.

    Both engines answer a question after the cached system prompt; a graph engine pads that
    suffix to its smallest bucket, and so must the eager side it is compared with.
    """
    from orin_llm_node.cli import check
    from orin_llm_node.engine.prefill_graph import DEFAULT_BUCKETS

    engine = check.tiny_engine(tiny_ckpt, 'cpu', 'float32', False, like_graphs=True)
    rows = []
    prepare = engine.runner.attn.prepare

    def spy(slot_mapping, *args):
        rows.append((len(slot_mapping), args[-1]))  # (rows run, new tokens among them)
        return prepare(slot_mapping, *args)

    engine.runner.attn.prepare = spy
    answer = check.tiny_answer(engine)
    new = len(answer.prompt_token_ids) - answer.cached_tokens
    bucket = min(b for b in DEFAULT_BUCKETS if b >= new)
    assert answer.cached_tokens > 0 and new < bucket
    assert rows[0] == (bucket, new)  # the prefill: padded like a graph's


def test_graph_row_fails_on_the_first_differing_token():
    from types import SimpleNamespace

    from orin_llm_node.cli import check

    a, b = SimpleNamespace(token_ids=[1, 2, 3, 4]), SimpleNamespace(token_ids=[1, 2, 5, 4])
    row = check.graph_row(True, a, b)
    assert row.status == check.FAIL and row.detail.startswith('tokens differ from token 2 ')
    assert check.graph_row(True, a, a).status == check.PASS
    assert check.graph_row(False, a, a).detail == 'CUDA graphs were not used'


@pytest.mark.gpu
@pytest.mark.parametrize('device', ['cuda', 'auto'])
def test_check_on_a_gpu_launches_every_fused_kernel_and_passes(tiny_ckpt, tmp_path, device):
    """The check itself on a GPU: no FAIL, and every fused row launched its kernels."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU')
    pytest.importorskip('cupy', reason='needs CuPy (cupy-cuda12x / cupy-cuda13x)')
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', f'device:={device}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {c['name']: c for c in report['checks']}
    fused = [r for name, r in rows.items() if name.split()[0] in (
        'rms_norm', 'add_rms_norm', 'silu_and_mul', 'quant_linear')]
    assert len(fused) == 21 and all('kernel launch' in r['detail'] for r in fused)
    for name in ('graph == eager', 'kernels == torch (fp32)', 'kernel cache', 'cuda root'):
        assert rows[name]['status'] in ('pass', 'warn'), rows[name]
    assert rows['graph == eager']['status'] == 'pass'
    assert rows['kernels == torch (fp32)']['status'] == 'pass'


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


def test_check_with_backend_openai_asks_the_server_and_times_an_answer(tiny_server,
                                                                       tiny_ckpt, tmp_path):
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cpu',
                             'backend:=openai', f'base_url:={tiny_server.url}',
                             f'model:={Path(tiny_ckpt).name}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {c['name']: c for c in report['checks']}
    assert status['backend server']['status'] == 'pass', status['backend server']
    assert status['backend answer']['status'] == 'pass', status['backend answer']
    assert 'network included' in status['backend answer']['detail']
    backend = report['backend']
    assert backend['model'] in backend['served'] and backend['answer_s'] > 0
    assert status['tiny decode']['status'] == 'pass'      # the local rows stay


@pytest.mark.parametrize('what', ['no server', 'wrong model'])
def test_check_with_backend_openai_fails_with_the_reason_and_the_fix(tiny_server, tiny_ckpt,
                                                                      tmp_path, what):
    from serve_support import free_port
    url = f'http://127.0.0.1:{free_port()}/v1' if what == 'no server' else tiny_server.url
    proc, report = run_check(tmp_path, f'model_path:={tiny_ckpt}', 'device:=cpu',
                             'backend:=openai', f'base_url:={url}', 'model:=not-this-one',
                             'backend_connect_timeout_s:=2.0')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(c for c in report['checks'] if c['name'] == 'backend server')
    assert row['status'] == 'fail' and 'base_url' in row['fix']
    assert ('did not answer' if what == 'no server' else "does not serve model 'not-this-one'") \
        in row['detail'], row
    assert 'backend answer' not in {c['name'] for c in report['checks']}
    assert 'backend server' in proc.stdout.splitlines()[-1]
