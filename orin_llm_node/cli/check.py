# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check``: does this device run the configured model? Run it after ``colcon build``.

    ros2 run orin_llm_node orin_llm_check [--params-file config/orin_llm.yaml]
        [-p model_path:=/models/Qwen3-VL-2B-Instruct -p quantization:=int4 ...] [--json out.json]

Reads the node's parameters exactly as the node does (the same YAML and ``name:=value``
overrides, checked by ``ros/parameters.py``) and checks, for that device and model: the
environment (torch and its CUDA, driver, CuPy, NVRTC, NumPy, ROS distro, ``net.core.rmem_max``
against the camera frames' socket buffer), the Jetson power state, every CUDA kernel variant
compiled for this device (and where CuPy keeps them for the next run), each fused kernel
against its torch body -- through a launch counter: a row whose op launched no kernel fails --,
a tiny checkpoint through the engine with CUDA-graph decode equal to eager decode token for
token across block boundaries (both prefilling at the same row counts) and fp32 kernels against
the CPU torch path, the memory plan of the configured checkpoint (weights + KV + scratch
against what is available), and decode tok/s and TTFT on the tiny checkpoint; with ``backend:
openai``, also whether the server serves ``model`` and how long a short answer takes over the
network (``check_backend.py``: the rows the node would fail to configure on). Prints a table;
exits 1 when any check fails (its ``fix`` column says what to do); on a CPU it runs what applies
and lists what it skipped. Needs no rclpy.
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
#: fp32 on CUDA against the CPU torch path (TF32 off): each greedy token of the CUDA engine
#: must score within this of the CPU's best choice at that step, scored teacher-forced. Rounding
#: differs between devices and row counts (about 1e-5 on the tiny checkpoint's logits of up to
#: ~7, between our CPU path and transformers); only a near-tie this close may flip a token.
FP32_NEAR_TIE = 1e-3


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

    from orin_llm_node.kernels import cuda_ops

    env = {'python': platform.python_version(), 'machine': platform.machine(),
           'torch': torch.__version__, 'torch_cuda': torch.version.cuda,
           'cuda_available': torch.cuda.is_available(), 'numpy': numpy.__version__,
           'ros_distro': os.environ.get('ROS_DISTRO', '')}
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, compute_capability=f'{props.major}.{props.minor}',
                   integrated=bool(getattr(props, 'is_integrated', False)))
    env.update(cuda_ops.versions())
    env['kernel_cache'] = cuda_ops.kernel_cache()['dir']
    try:
        env['rmem_max'] = int(Path('/proc/sys/net/core/rmem_max').read_text())
    except (OSError, ValueError):
        env['rmem_max'] = None
    report['environment'] = env
    rows = [Check('environment', PASS, ', '.join(
        f'{k} {env[k]}' for k in ('torch', 'torch_cuda', 'gpu', 'cupy', 'cuda_driver', 'nvrtc',
                                  'cuda_root', 'numpy', 'ros_distro') if env.get(k)))]
    if device.type == 'cuda' and 'cupy' in env:
        from orin_llm_node.cli.check_kernels import cuda_root_row

        rows.append(cuda_root_row(env['cuda_root']))
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
    from orin_llm_node.parameters import engine_config

    cfg = engine_config(values)
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


def greedy_gaps(logits, tokens):
    """How far each of ``tokens`` scores below the best token of its row of ``logits`` ``[T, V]``.

    0 where the token is that row's greedy choice; with ``logits`` scored teacher-forced on
    ``tokens`` (another implementation's greedy answer), a gap above a stated tolerance is a
    token that implementation should not have picked.
    """
    import torch

    picked = logits.gather(-1, torch.as_tensor(tokens, device=logits.device).view(-1, 1))
    return logits.max(-1).values - picked[:, 0]


def _scores(engine, prompt_ids, tokens):
    """fp32 logits ``[len(tokens), V]`` of ``engine`` for each of ``tokens``, teacher-forced.

    Row ``i`` scores the step after ``prompt_ids`` (text only) and ``tokens[:i]``, run straight
    through the engine's runner on the pool's first blocks: the engine is not used afterwards.
    """
    import numpy as np
    import torch

    runner = engine.runner
    table = list(range(-(-(len(prompt_ids) + len(tokens)) // runner.block_size)))
    rows = [runner.prefill(prompt_ids, np.tile(np.arange(len(prompt_ids)), (3, 1)), table, 0)]
    for i, token in enumerate(tokens[:-1]):
        context = len(prompt_ids) + i + 1
        rows.append(runner.decode(token, context - 1, table, context))
    return torch.stack(rows).float().cpu()


def fp32_row(device, result, reference) -> Check:
    """fp32 kernels on ``device`` (their greedy ``result``) against the CPU torch path.

    ``reference`` is an fp32 CPU engine on the same checkpoint. The two differ in rounding, so
    each token of ``result`` must be the reference's choice at its step (scored teacher-forced)
    up to :data:`FP32_NEAR_TIE`, rather than the two answers being equal token for token.
    """
    name = 'kernels == torch (fp32)'
    gaps = greedy_gaps(_scores(reference, result.prompt_token_ids, result.token_ids),
                       result.token_ids)
    worst = int(gaps.argmax())
    if gaps[worst] > FP32_NEAR_TIE:
        return Check(name, FAIL, f'token {worst} of {len(gaps)} on {device}: the CPU torch path '
                     f'scores it {float(gaps[worst]):.3g} below its own choice (tolerance '
                     f'{FP32_NEAR_TIE:g})', 'report it with this output')
    ties = int((gaps > 0).sum())
    return Check(name, PASS, f"{len(gaps)} greedy tokens on {device}, each the CPU torch "
                 f"path's choice given the same history ({ties} near-ties within "
                 f'{FP32_NEAR_TIE:g}; TF32 off)')


def graph_row(uses_graph: bool, graph, eager) -> Check:
    """Graph decode (``graph``) against eager decode prefilling at the same row counts."""
    name = 'graph == eager'
    if not uses_graph:
        return Check(name, FAIL, 'CUDA graphs were not used',
                     'see the WARN line of the engine log (CuPy / attention backend)')
    if graph.token_ids != eager.token_ids:
        pairs = zip(graph.token_ids, eager.token_ids, strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b),
                     min(len(graph.token_ids), len(eager.token_ids)))
        return Check(name, FAIL, f'tokens differ from token {first} (block boundary every 16; '
                     'both sides prefilled at the same row counts)', 'report it with this output')
    n = len(graph.token_ids)
    return Check(name, PASS, f'{n} tokens equal across {n // 16} block boundaries (eager '
                 'prefills padded to the graph buckets: same kernels at the same shapes, so '
                 'no tolerance)')


def tiny_engine(path, device, dtype, graph, like_graphs=False):
    """A warmed-up engine on the tiny checkpoint at ``path``.

    ``like_graphs``: eager, but padding short prefills to the buckets a graph engine replays
    (``prefill_graph.pad_like_graphs``): cuBLAS promises identical rows only for identical
    shapes, so only such an engine is compared with a graph engine token for token.
    """
    from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
    from orin_llm_node.engine.prefill_graph import pad_like_graphs

    # A pool of its own size: the automatic one takes half of the room (Jetson: shared RAM),
    # and the fp32 row holds a CUDA and a CPU engine at once.
    engine = LLMEngine(EngineConfig(model_path=path, device=device, dtype=dtype,
                                    enable_cuda_graph=graph, block_size=16,
                                    max_model_len=1024, num_kv_blocks=64))
    if like_graphs:
        pad_like_graphs(engine.runner)
    conv = engine.new_conversation('You are a robot.')
    engine.chat(conv, 'Warm up.', sampling=SamplingParams(max_tokens=4))
    engine.reset(conv)
    return engine


def tiny_answer(engine):
    """The check's question (a follow-up to the cached system prompt), answered greedily."""
    from orin_llm_node.engine import SamplingParams

    conv = engine.new_conversation('You are a robot.')
    return engine.chat(conv, 'Describe the room.',
                       sampling=SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True))


def _tiny(report, device):
    """A tiny checkpoint through the engine: fp32 kernels == torch, graph == eager, speed."""
    import torch

    from orin_llm_node.testing import make_tiny_checkpoint

    rows = []
    dev = str(device)
    with tempfile.TemporaryDirectory(prefix='orin_llm_check_') as tmp:
        path = make_tiny_checkpoint(Path(tmp) / 'tiny')
        if device.type == 'cuda':
            # fp32 parity needs full-precision matmuls (the bf16/fp16 engines ignore this).
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            engine = tiny_engine(path, dev, 'float32', False)
            if engine.attention_backend != 'cuda':
                rows.append(Check('kernels == torch (fp32)', FAIL, f'the fp32 engine on {dev} '
                                  f'runs {engine.attention_backend} attention: nothing to compare',
                                  'see the WARN line of the engine log (CuPy / attention '
                                  'backend)'))
            else:
                rows.append(fp32_row(device, tiny_answer(engine),
                                     tiny_engine(path, 'cpu', 'float32', False)))
            del engine
            eager = tiny_answer(tiny_engine(path, dev, 'auto', False, like_graphs=True))
            engine = tiny_engine(path, dev, 'auto', True)
            result = tiny_answer(engine)
            rows.append(graph_row(engine.uses_cuda_graph, result, eager))
        else:
            result = tiny_answer(tiny_engine(path, dev, 'auto', False))
            rows.append(Check('graph == eager', SKIP, f'device {device} (CUDA graphs need CUDA)'))
    report['tiny_checkpoint'] = {'device': dev, 'ttft_ms': result.ttft_s * 1e3,
                                 'decode_tok_s': result.decode_tok_s,
                                 'tokens': len(result.token_ids)}
    rows.append(Check('tiny decode', PASS, f'TTFT {result.ttft_s * 1e3:.1f} ms, decode '
                      f'{result.decode_tok_s:.0f} tok/s on {device} ({len(result.token_ids)} '
                      'tokens)'))
    return rows


def run(values):
    """Every check for the node parameters ``values``; returns ``(rows, report)``."""
    from orin_llm_node.engine import EngineConfig
    from orin_llm_node.kernels.dispatch import tensor_device
    from orin_llm_node.parameters import engine_config

    report = {'parameters': {k: values[k] for k in ('model_path', 'device', 'dtype',
                                                     'quantization', 'max_model_len',
                                                     'kv_cache_memory_mb', 'backend')}}
    cfg: EngineConfig = engine_config(values)
    try:
        device = tensor_device(cfg.resolve_device())  # cuda:<index>, as its tensors say
    except ValueError as exc:
        rows = [Check('device', FAIL, str(exc), 'device:=cpu, or a torch built with CUDA '
                      "(on a Jetson: JetPack's torch wheel)")]
        report['checks'] = [asdict(r) for r in rows]
        return rows, report
    from orin_llm_node.cli.check_backend import backend_rows
    from orin_llm_node.cli.check_kernels import fused_rows, kernel_rows

    rows = []
    steps = {'environment': lambda: _environment(report, device),
             'power state': lambda: _power(report),
             'memory plan': lambda: _memory(report, values, device),
             'kernels compile': lambda: kernel_rows(report, device),
             'fused kernels': lambda: fused_rows(device),
             'tiny checkpoint': lambda: _tiny(report, device),
             'backend': lambda: backend_rows(report, values)}
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
    from orin_llm_node.parameter_files import values_from_files
    from orin_llm_node.parameters import ParameterError

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
