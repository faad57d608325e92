# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check``: does this device run the configured model? Run it after ``colcon build``.

    ros2 run orin_llm_node orin_llm_check [--params-file config/orin_llm.yaml]
        [-p model_path:=/models/Qwen3-VL-2B-Instruct -p quantization:=int4 ...] [--json out.json]

Reads the node's parameters exactly as the node does (the same YAML and ``name:=value``
overrides, checked by ``ros/parameters.py``) and checks, for that device and model: the
environment (torch and its CUDA, driver, CuPy, NVRTC, NumPy, ROS distro, ``net.core.rmem_max``
against the camera frames' socket buffer), the Jetson power state, every CUDA kernel variant
compiled for this device, each fused kernel against its torch body, a tiny checkpoint through
the engine with CUDA-graph decode equal to eager decode token for token across block
boundaries, the memory plan of the configured checkpoint (weights + KV + scratch against what
is available), and decode tok/s and TTFT on the tiny checkpoint. Prints a table; exits 1 when
any check fails (its ``fix`` column says what to do); on a CPU it runs what applies and lists
what it skipped. Needs no rclpy.
"""

import argparse
from dataclasses import asdict, dataclass
import json
import os
from pathlib import Path
import platform
import sys
import tempfile
import time

PASS, WARN, FAIL, SKIP = 'pass', 'warn', 'fail', 'skip'
#: The receive buffer the node's Fast DDS profile asks for (ros/dds_profiles/network.xml).
CAMERA_SOCKET_BUFFER = 4194304
#: Tokens the tiny-checkpoint decode runs: three 16-token block boundaries.
DECODE_TOKENS = 56


@dataclass
class Check:
    """One row of the table."""

    name: str
    status: str
    detail: str = ''
    fix: str = ''


def _environment(report, device):
    import numpy
    import torch

    from orin_llm_node import cuda_ops

    env = {'python': platform.python_version(), 'machine': platform.machine(),
           'torch': torch.__version__, 'torch_cuda': torch.version.cuda,
           'cuda_available': torch.cuda.is_available(), 'numpy': numpy.__version__,
           'ros_distro': os.environ.get('ROS_DISTRO', '')}
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, compute_capability=f'{props.major}.{props.minor}',
                   integrated=bool(getattr(props, 'is_integrated', False)))
    env.update(cuda_ops.versions())
    try:
        env['rmem_max'] = int(Path('/proc/sys/net/core/rmem_max').read_text())
    except (OSError, ValueError):
        env['rmem_max'] = None
    report['environment'] = env
    rows = [Check('environment', PASS, ', '.join(
        f'{k} {env[k]}' for k in ('torch', 'torch_cuda', 'gpu', 'cupy', 'cuda_driver', 'nvrtc',
                                  'numpy', 'ros_distro') if env.get(k)))]
    if env['ros_distro'] == 'humble' and int(numpy.__version__.split('.')[0]) >= 2:
        rows.append(Check('numpy', FAIL, f'NumPy {numpy.__version__} on Humble',
                          "pip install 'numpy<2' -c requirements/jetson-constraints.txt "
                          "(Humble's message packages and JetPack torch are built for NumPy 1)"))
    if Path('/etc/nv_tegra_release').is_file() and not torch.version.cuda:
        rows.append(Check('torch', FAIL, f'torch {torch.__version__} has no CUDA on a Jetson',
                          "reinstall JetPack's torch wheel; install pip packages only with "
                          'requirements/jetson-constraints.txt'))
    if env['rmem_max'] is None:
        rows.append(Check('rmem_max', SKIP, 'no /proc/sys/net/core/rmem_max'))
    elif env['rmem_max'] < CAMERA_SOCKET_BUFFER:
        rows.append(Check('rmem_max', WARN,
                          f"net.core.rmem_max {env['rmem_max']} < {CAMERA_SOCKET_BUFFER}: large "
                          'camera frames over UDP are dropped',
                          f'sudo sysctl -w net.core.rmem_max={CAMERA_SOCKET_BUFFER}'))
    else:
        rows.append(Check('rmem_max', PASS, f"net.core.rmem_max {env['rmem_max']}"))
    return rows


def _power(report):
    from orin_llm_node.jetson_power import read_power_state

    state = read_power_state()
    report['power'] = state.as_dict()
    if not state.is_jetson:
        return [Check('power state', SKIP, 'not a Jetson (no nvpmodel, no GPU devfreq)')]
    fix = '' if state.clocks_locked else 'sudo nvpmodel -m 0 && sudo jetson_clocks'
    return [Check('power state', PASS if state.clocks_locked else WARN, state.summary(), fix)]


def _memory(report, values, device):
    from orin_llm_node.engine.memory_plan import plan_memory
    from orin_llm_node.ros.model_loading import resolve_model_path
    from orin_llm_node.ros.parameters import engine_config

    cfg = engine_config(values, resolve_model_path(values['model_path']))
    plan = plan_memory(cfg, device)
    report['memory_plan'] = plan.as_dict()
    gb = 1e9
    detail = (f'{cfg.model_path.name} {plan.weight_format}: weights {plan.weights / gb:.2f} GB + '
              f'KV {plan.kv / gb:.2f} GB ({plan.num_blocks} blocks) + scratch '
              f'{plan.scratch_total / gb:.2f} GB of {plan.available / gb:.2f} GB available '
              f'({plan.available_source})')
    if not plan.fits:
        return [Check('memory plan', FAIL, detail, 'set ' + ' or '.join(plan.would_fit)
                      if plan.would_fit else plan.refusal())]
    return [Check('memory plan', PASS, detail)]


def _cuda_usable(device):
    from orin_llm_node import cuda_ops

    if device.type != 'cuda':
        return f'device {device} (no CUDA)'
    if not cuda_ops.cupy_available():
        return 'CuPy is not importable'
    return None


def _kernels(device):
    from orin_llm_node import cuda_ops, kernel_sources

    why = _cuda_usable(device)
    if why:
        return [Check('kernels compile', SKIP, why)]
    index = device.index if device.index is not None else 0
    rows = []
    for dtype in kernel_sources.DTYPE_IDS:
        for head_dim in kernel_sources.HEAD_DIMS:
            try:
                n = len(cuda_ops.load_kernels(dtype, head_dim, index))
                rows.append(Check(f'kernels {dtype} d{head_dim}', PASS, f'{n} functions'))
            except Exception as exc:  # noqa: BLE001 - every failure is a row
                rows.append(Check(f'kernels {dtype} d{head_dim}', FAIL, str(exc).split('\n')[0],
                                  'install the CuPy wheel matching the CUDA toolkit '
                                  '(requirements/jetson-constraints.txt on a Jetson)'))
    return rows


def _fused(device, launcher=None):
    """Each fused kernel against its torch body at small shapes.

    ``launcher(dtype name) -> launch`` replaces the CuPy build (tests: the CPU kernel emulator).
    """
    import torch

    from orin_llm_node.cuda_ops import FusedOps
    from orin_llm_node.layers.activation import silu_and_mul
    from orin_llm_node.layers.layernorm import add_rms_norm, rms_norm
    from orin_llm_node.quantization import AT_LOAD_FORMATS

    why = _cuda_usable(device) if launcher is None else None
    if why:
        return [Check('fused kernels', SKIP, why)]
    rows = []
    gen = torch.Generator(device='cpu').manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        # Half precision: a few units in the last place of bf16; fp32: summation order only.
        tol = ({'atol': 2e-2, 'rtol': 2e-2} if dtype != torch.float32
               else {'atol': 1e-4, 'rtol': 1e-4})
        name = str(dtype).replace('torch.', '')
        ops = FusedOps(dtype, 128, device, launch=launcher(name) if launcher else None)
        x, res = (torch.randn(5, 1024, generator=gen).to(device, dtype) for _ in range(2))
        w = torch.randn(1024, generator=gen).to(device, dtype)
        gate_up = torch.randn(5, 2048, generator=gen).to(device, dtype)
        cases = {'rms_norm': (ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6)),
                 'add_rms_norm': (ops.add_rms_norm(x, res.clone(), w, 1e-6),
                                  add_rms_norm(x, res.clone(), w, 1e-6)),
                 'silu_and_mul': (ops.silu_and_mul(gate_up), silu_and_mul(gate_up))}
        # Quantized GEMV (one row: the decode path) against the layer's torch body.
        for fmt, (cls, asym) in AT_LOAD_FORMATS.items():
            layer = cls(1024, 256, group_size=128, asymmetric=asym, device=device)
            layer.quantize_from(torch.randn(256, 1024, generator=gen).to(device) / 32)
            cases[f'quant_linear {fmt}'] = (ops.quant_linear(layer, x[:1]),
                                            layer.torch_forward(x[:1]))
        for case, (got, want) in cases.items():
            label = f'{case} {name}'
            try:
                torch.testing.assert_close(got, want, **tol)
                rows.append(Check(label, PASS, 'equals the torch body'))
            except AssertionError as exc:
                rows.append(Check(label, FAIL, ' '.join(str(exc).split())[:200],
                                  'report it with this output (attention_backend torch avoids '
                                  'the kernels)'))
    return rows


def _tiny(report, device):
    """A tiny checkpoint through the engine: graph == eager, and decode tok/s and TTFT."""
    from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
    from orin_llm_node.testing import make_tiny_checkpoint

    sampling = SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True)
    cuda = device.type == 'cuda'
    with tempfile.TemporaryDirectory(prefix='orin_llm_check_') as tmp:
        path = make_tiny_checkpoint(Path(tmp) / 'tiny')
        runs = {}
        # (name, device, dtype, graphs): on CUDA the kernels in fp32 must give the CPU torch
        # path's tokens exactly, and graph decode the eager tokens.
        plans = [('eager', str(device), 'auto', False)]
        if cuda:
            plans += [('graph', str(device), 'auto', True), ('cuda fp32', str(device),
                                                               'float32', False),
                      ('cpu fp32', 'cpu', 'float32', False)]
        for name, dev, dtype, graph in plans:
            engine = LLMEngine(EngineConfig(model_path=path, device=dev, dtype=dtype,
                                            enable_cuda_graph=graph, block_size=16))
            conv = engine.new_conversation('You are a robot.')
            engine.chat(conv, 'Warm up.', sampling=SamplingParams(max_tokens=4))
            engine.reset(conv)
            conv = engine.new_conversation('You are a robot.')
            runs[name] = (engine.chat(conv, 'Describe the room.', sampling=sampling),
                          engine.uses_cuda_graph)
            del engine
    rows = []
    if cuda:
        same = runs['cuda fp32'][0].token_ids == runs['cpu fp32'][0].token_ids
        rows.append(Check('kernels == torch (fp32)', PASS if same else FAIL,
                          f'{DECODE_TOKENS} tokens of the tiny checkpoint on {device} vs cpu',
                          '' if same else 'report it with this output'))
        (eager, _), (graph, used) = runs['eager'], runs['graph']
        if not used:
            rows.append(Check('graph == eager', FAIL, 'CUDA graphs were not used',
                              'see the WARN line of the engine log (CuPy / attention backend)'))
        elif graph.token_ids != eager.token_ids:
            pairs = zip(graph.token_ids, eager.token_ids, strict=False)
            first = next(i for i, (a, b) in enumerate(pairs) if a != b)
            rows.append(Check('graph == eager', FAIL, f'tokens differ from token {first} '
                              f'(block boundary every 16)', 'report it with this output'))
        else:
            rows.append(Check('graph == eager', PASS,
                              f'{len(graph.token_ids)} tokens equal across '
                              f'{len(graph.token_ids) // 16} block boundaries'))
        result = graph
    else:
        rows.append(Check('graph == eager', SKIP, f'device {device} (CUDA graphs need CUDA)'))
        result = runs['eager'][0]
    report['tiny_checkpoint'] = {'device': str(device), 'ttft_ms': result.ttft_s * 1e3,
                                 'decode_tok_s': result.decode_tok_s,
                                 'tokens': len(result.token_ids)}
    rows.append(Check('tiny decode', PASS, f'TTFT {result.ttft_s * 1e3:.1f} ms, decode '
                      f'{result.decode_tok_s:.0f} tok/s on {device} ({len(result.token_ids)} '
                      'tokens)'))
    return rows


def run(values):
    """Every check for the node parameters ``values``; returns ``(rows, report)``."""
    from orin_llm_node.engine import EngineConfig
    from orin_llm_node.ros.model_loading import resolve_model_path
    from orin_llm_node.ros.parameters import engine_config

    report = {'parameters': {k: values[k] for k in ('model_path', 'device', 'dtype',
                                                     'quantization', 'max_model_len',
                                                     'kv_cache_memory_mb')}}
    cfg: EngineConfig = engine_config(values, resolve_model_path(values['model_path']))
    try:
        device = cfg.resolve_device()
    except ValueError as exc:
        rows = [Check('device', FAIL, str(exc), 'device:=cpu, or a torch built with CUDA '
                      "(on a Jetson: JetPack's torch wheel)")]
        report['checks'] = [asdict(r) for r in rows]
        return rows, report
    rows = []
    steps = {'environment': lambda: _environment(report, device),
             'power state': lambda: _power(report),
             'memory plan': lambda: _memory(report, values, device),
             'kernels compile': lambda: _kernels(device), 'fused kernels': lambda: _fused(device),
             'tiny checkpoint': lambda: _tiny(report, device)}
    for name, step in steps.items():
        try:
            rows += step()
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            rows.append(Check(name, FAIL,
                              f'{type(exc).__name__}: {" ".join(str(exc).split())}',
                              'see the message'))
    report['checks'] = [asdict(r) for r in rows]
    return rows, report


def table(rows) -> str:
    """The rows as a fixed-width table."""
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        lines.append(f'{r.name:<{width}}  {r.status.upper():<4}  {r.detail}')
        if r.fix:
            lines.append(f'{"":<{width}}        fix: {r.fix}')
    return '\n'.join(lines)


def main(argv=None):
    """Console entry point: ``orin_llm_check``; exit 1 if any check fails."""
    from orin_llm_node.ros.parameters import ParameterError, values_from_files

    ap = argparse.ArgumentParser(prog='orin_llm_check', description=__doc__.split('\n')[0])
    ap.add_argument('--params-file', action='append', default=[],
                    help="the node's parameter YAML (repeatable, as for the node)")
    ap.add_argument('-p', dest='overrides', action='append', default=[],
                    metavar='NAME:=VALUE', help='a parameter override, as after --ros-args -p')
    ap.add_argument('--json', type=Path, help='also write the report as JSON here')
    args = ap.parse_args(argv)
    try:
        values = values_from_files(args.params_file, args.overrides)
    except ParameterError as exc:
        print(f'orin_llm_check: {exc}', file=sys.stderr)
        return 2
    t0 = time.monotonic()
    rows, report = run(values)
    report['seconds'] = round(time.monotonic() - t0, 1)
    print(table(rows))
    failed = [r.name for r in rows if r.status == FAIL]
    skipped = [r.name for r in rows if r.status == SKIP]
    print(f'\n{len(rows) - len(failed) - len(skipped)} passed or warned, {len(failed)} failed'
          + (f' ({", ".join(failed)})' if failed else '')
          + (f', skipped: {", ".join(skipped)}' if skipped else ''))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
