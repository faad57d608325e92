# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Quantized weights on the CPU against float, side by side: decode, TTFT, start-up, bytes.

For each checkpoint (the embedded demo checkpoint and a mid-size random one made by
``make_tiny_checkpoint``: hidden 1024, MLP 3072, 8 layers, the tiny tokenizer's vocabulary)
one engine per weight format -- float32 and every ``quantization`` format -- is started, then
the formats take turns: each round runs one turn per format in rotation (none, int8, int4,
int4_asym, fp8), a ~40-token text prompt and ``--decode-tokens`` greedy tokens
(``ignore_eos``), at each thread count of ``--threads`` (default ``1,default``: one torch
thread, then torch's default). A burst of load from other processes thus lands on every
format alike, and each round gives a ratio of turns measured seconds apart. Per format and
thread count the JSON holds, over ``--rounds`` rounds, the median and spread (min, max) of

* ``decode_tok_s`` (the engine's own) and ``ttft_s`` (time to first token: the prefill);
* ``decode_x_float``: float's decode tok/s over the format's *in the same round* -- how many
  times slower than float; the target is at most :data:`LIMIT`;

plus, per format, ``startup_s`` (what the node does before it says ``ready``:
``LLMEngine(...)`` -- load, quantize at load -- and ``LLMEngine.warmup``; rounds of
``--startup-repeats``, interleaved too), ``weight_bytes`` (``LLMEngine.weight_bytes``) and
``cpu_scratch_bytes`` (the reused CPU work buffers after decoding;
``quantization.scratch.held_bytes``; absent on code that has none), and the conditions: CPU,
core count, threads, load average before and after, ``--hogs``.

``--hogs N`` runs N CPU-bound processes (busy loops, this bench's children) during the
rounds: the "2 other CPU-bound processes" condition. ``--layers`` adds a per-layer decode
comparison on the mid-size shapes (one row, fp32, interleaved, median): float ``F.linear``,
each format's CPU path, and torch's packed CPU kernels where a format maps onto one
(``_weight_int8pack_mm`` for per-channel int8, ``_weight_int4pack_mm_for_cpu`` for int4),
each with its ``max|diff|`` against ``F.linear`` over ``dequantize()``.

Run from the repository root::

    .venv/bin/python bench/quant_cpu.py --models mid
    .venv/bin/python bench/quant_cpu.py --models mid --hogs 2 --tag hogs2
    .venv/bin/python bench/quant_cpu.py --before /tmp/before/quant_cpu_before.json

For a before/after, run a copy of this script in the other commit's checkout and venv with
``--tag before --out /tmp/before`` (``make venv`` installs the package editable, and its
import hook wins over ``PYTHONPATH``).

Prints JSON and writes ``quant_cpu[_TAG].json`` / ``.png`` to ``--out`` (default
bench/results); ``--before`` puts another run's medians beside these in the JSON and PNG.
"""

import argparse
import json
import os
from pathlib import Path
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from orin_llm_node import package_files
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.testing import make_tiny_checkpoint

FORMATS = ('none', 'int8', 'int4', 'int4_asym', 'fp8')
MID_TEXT = {
    'hidden_size': 1024, 'intermediate_size': 3072, 'num_hidden_layers': 8,
    'num_attention_heads': 16, 'num_key_value_heads': 8, 'head_dim': 64,
    'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0,
                        'mrope_section': [12, 10, 10], 'mrope_interleaved': True},
}
PROMPT = ('Describe what a mobile robot should check before it drives through a door, '
          'and say which sensor tells it most about the floor ahead of it.')
LIMIT = 1.5  # each quantized format within 1.5x of float's decode time


def summary(values: list[float]) -> dict:
    """Median and spread of one figure's rounds."""
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values),
            'runs': values}


def engine_config(model_dir: Path, fmt: str) -> EngineConfig:
    return EngineConfig(model_path=model_dir, device='cpu', dtype='float32', quantization=fmt,
                        max_model_len=1024, kv_cache_memory_mb=32, block_order_seed=0)


def start(model_dir: Path, fmt: str) -> tuple[LLMEngine, float]:
    """The node's start-up: load (+ quantize) and warm up; returns the engine and seconds."""
    t0 = time.perf_counter()
    engine = LLMEngine(engine_config(model_dir, fmt))
    engine.warmup()
    return engine, time.perf_counter() - t0


def scratch_bytes() -> int | None:
    """Bytes of the CPU work buffers held now (None where the code has none)."""
    try:
        from orin_llm_node.quantization import scratch
    except ImportError:
        return None
    return scratch.held_bytes()


def one_turn(engine: LLMEngine, tokens: int) -> dict:
    conv = engine.new_conversation(system_prompt=None)
    res = engine.chat(conv, PROMPT, sampling=SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.reset(conv)
    return {'decode_tok_s': res.decode_tok_s, 'ttft_s': res.ttft_s,
            'prompt_tokens': len(res.prompt_token_ids), 'new_tokens': len(res.token_ids)}


def thread_counts(spec: str) -> list[int]:
    """``--threads``: a comma list of counts; ``default`` is torch's own."""
    default = torch.get_num_threads()
    return [default if t == 'default' else int(t) for t in spec.split(',')]


def decode_rounds(engines: dict, threads: int, args) -> dict:
    """``--rounds`` rounds of one turn per format in rotation, at ``threads`` torch threads."""
    torch.set_num_threads(threads)
    turns = {f: [] for f in engines}
    for _ in range(args.rounds):
        for fmt, engine in engines.items():
            turns[fmt].append(one_turn(engine, args.decode_tokens))
    out = {}
    for fmt, runs in turns.items():
        out[fmt] = {'decode_tok_s': summary([t['decode_tok_s'] for t in runs]),
                    'ttft_s': summary([t['ttft_s'] for t in runs]),
                    'prompt_tokens': runs[0]['prompt_tokens'],
                    'new_tokens': runs[0]['new_tokens']}
        if 'none' in turns:
            ratios = [f['decode_tok_s'] / t['decode_tok_s']
                      for f, t in zip(turns['none'], runs, strict=True)]
            out[fmt]['decode_x_float'] = summary(ratios)
            out[fmt]['within_limit'] = out[fmt]['decode_x_float']['median'] <= LIMIT
        print(f"  {threads} threads {fmt}: decode {out[fmt]['decode_tok_s']['median']:.1f} tok/s"
              + (f" ({out[fmt]['decode_x_float']['median']:.2f}x float, "
                 f"{out[fmt]['decode_x_float']['min']:.2f}-"
                 f"{out[fmt]['decode_x_float']['max']:.2f})"
                 if 'decode_x_float' in out[fmt] else ''), flush=True)
    return out


def bench_model(name: str, model_dir: Path, args) -> dict:
    startup = {f: [] for f in args.formats}
    engines = {}
    for _ in range(args.startup_repeats):
        for fmt in args.formats:
            engines.pop(fmt, None)
            engines[fmt], seconds = start(model_dir, fmt)
            startup[fmt].append(seconds)
    formats = {}
    for fmt, eng in engines.items():
        formats[fmt] = {'weight_format': eng.weight_format, 'weight_bytes': eng.weight_bytes,
                        'startup_s': summary(startup[fmt])}
        if 'none' in startup:
            formats[fmt]['startup_x_float'] = (statistics.median(startup[fmt])
                                               / statistics.median(startup['none']))
    print(name, 'start-up s', {f: round(statistics.median(v), 2) for f, v in startup.items()},
          flush=True)
    decode = {str(t): decode_rounds(engines, t, args) for t in args.threads}
    return {'formats': formats, 'decode': decode, 'cpu_scratch_bytes': scratch_bytes()}


def interleaved_us(fns: dict, reps: int = 10, rounds: int = 9) -> dict:
    """Median and spread of microseconds per call, the callables taking turns per round."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times[name].append((time.perf_counter() - t0) / reps * 1e6)
    return {name: summary(v) for name, v in times.items()}


def packed_kernel(layer):
    """Torch's packed CPU kernel for ``layer`` (canonical layout) as ``x -> y``, or None."""
    if layer.format == 'int8' and layer.num_groups == 1:
        scales = layer.scale[:, 0].contiguous()
        codes = layer.qweight
        return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scales)
    if layer.format == 'int4' and layer.in_features % layer.group_size == 0:
        from orin_llm_node.quantization.int4 import unpack_int4

        u = unpack_int4(layer.qweight, layer.in_features).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
        # Their dequantisation: (u - 8) * scale + zero, per group, zero a float offset.
        zero = (torch.zeros_like(layer.scale) if layer.zero is None
                else (8.0 - layer.zero.float()) * layer.scale)
        sz = torch.stack([layer.scale.t(), zero.t()], -1).contiguous()
        group = layer.group_size
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)
    return None


def layer_row(k: int, n: int, gen: torch.Generator) -> dict:
    """One projection shape: float, each format's CPU path, torch's packed kernels."""
    import torch.nn.functional as F

    from orin_llm_node.quantization import AT_LOAD_FORMATS

    w = torch.randn(n, k, generator=gen) * 0.02
    x = torch.randn(1, k, generator=gen)
    fns, diffs = {'float': lambda: F.linear(x, w)}, {}
    for fmt, (cls, asym) in AT_LOAD_FORMATS.items():
        layer = cls(k, n, group_size=cls.at_load_group or k, asymmetric=asym)
        layer.quantize_from(w)
        ref = F.linear(x, layer.dequantize())
        kernel = packed_kernel(layer)
        if hasattr(layer, 'use_cpu_layout'):  # absent on code before the CPU layout
            layer.use_cpu_layout()
        fns[fmt] = layer.__call__
        diffs[fmt] = (layer(x) - ref).abs().max().item()
        if kernel is not None:
            try:
                diffs[f'{fmt}_packed_kernel'] = (kernel(x) - ref).abs().max().item()
                fns[f'{fmt}_packed_kernel'] = kernel
            except RuntimeError as e:  # a torch build without the kernel
                diffs[f'{fmt}_packed_kernel'] = str(e).splitlines()[0]
    times = interleaved_us({name: (lambda fn=fn: fn(x)) if name != 'float' else fn
                            for name, fn in fns.items()})
    flt = times['float']['median']
    return {name: {'us': t, 'x_float': t['median'] / flt, 'max_diff': diffs.get(name)}
            for name, t in times.items()}


def bench_layers() -> dict:
    """Per-layer decode (one row, fp32) on the mid-size model's projection shapes."""
    h, inter = MID_TEXT['hidden_size'], MID_TEXT['intermediate_size']
    qkv = (MID_TEXT['num_attention_heads'] + 2 * MID_TEXT['num_key_value_heads']) * \
        MID_TEXT['head_dim']
    shapes = {'qkv_proj': (h, qkv), 'gate_up_proj': (h, 2 * inter), 'down_proj': (inter, h)}
    gen = torch.Generator().manual_seed(0)
    result = {}
    for name, (k, n) in shapes.items():
        result[f'{name} [{n}x{k}]'] = row = layer_row(k, n, gen)
        print('layer', name, {f: round(r['x_float'], 2) for f, r in row.items()}, flush=True)
    return result


def plot(result: dict, path: Path, before: dict | None) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = result['models']
    threads = list(next(iter(models.values()))['decode'])
    cols = 2 * len(threads) + 2
    fig, axes = plt.subplots(len(models), cols, figsize=(3.8 * cols, 3.4 * len(models)),
                             squeeze=False)
    for row, (model, m) in zip(axes, models.items(), strict=True):
        fmts = list(m['formats'])
        xs = list(range(len(fmts)))
        panels = [(f'{t} threads: decode tok/s', m['decode'][t], 'decode_tok_s', t)
                  for t in threads]
        panels += [(f'{t} threads: decode x float (limit {LIMIT})', m['decode'][t],
                    'decode_x_float', t) for t in threads]
        for ax, (title, data, key, t) in zip(row, panels, strict=False):
            med = [data[f].get(key, {}).get('median', 0) for f in fmts]
            err = [[med[i] - data[f].get(key, {}).get('min', med[i]) for i, f in enumerate(fmts)],
                   [data[f].get(key, {}).get('max', med[i]) - med[i] for i, f in enumerate(fmts)]]
            ax.bar(xs, med, 0.6, yerr=err, capsize=3, color='tab:blue', label='median, min-max')
            if key == 'decode_x_float':
                ax.axhline(LIMIT, color='tab:red', lw=1)
                was = (before or {}).get(model, {}).get(t, {})
                if was:
                    ax.plot(xs, [was.get(f, float('nan')) for f in fmts], 'o', color='tab:gray',
                            label='before (median)')
            ax.legend(fontsize=7)
            ax.set_xticks(xs, [f.replace('none', 'fp32') for f in fmts], fontsize=8)
            ax.set_title(f'{model}: {title}', fontsize=9)
        for ax, key, label, scale in ((row[-2], 'startup_s', 'start-up s (median)', 1.0),
                                      (row[-1], 'weight_bytes', 'weight MB', 1e-6)):
            vals = [m['formats'][f][key]['median'] if key == 'startup_s'
                    else m['formats'][f][key] * scale for f in fmts]
            ax.bar(xs, vals, 0.6, color='tab:blue')
            ax.set_xticks(xs, [f.replace('none', 'fp32') for f in fmts], fontsize=8)
            ax.set_title(f'{model}: {label}', fontsize=9)
    fig.suptitle(f"quantized vs float on the CPU ({result['device']}, {result['cpu_count']} "
                 f"cores, hogs {result['hogs']}, load {result['loadavg_before'][0]:.1f})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def start_hogs(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound child processes (busy loops) until :func:`stop_hogs`."""
    return [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    p.add_argument('--models', default='demo,mid', help='comma list of demo, mid')
    p.add_argument('--formats', default=','.join(FORMATS))
    p.add_argument('--decode-tokens', type=int, default=16)
    p.add_argument('--rounds', type=int, default=7, help='turns per format and thread count')
    p.add_argument('--startup-repeats', type=int, default=2)
    p.add_argument('--threads', default='1,default',
                   help="comma list of torch thread counts; 'default' is torch's")
    p.add_argument('--hogs', type=int, default=0, help='CPU-bound processes running meanwhile')
    p.add_argument('--layers', action='store_true', help='add the per-layer comparison')
    p.add_argument('--tag', default='', help='suffix of the output file names')
    p.add_argument('--before', type=Path, default=None, help="another run's JSON to compare")
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'results')
    args = p.parse_args(argv)
    args.formats = args.formats.split(',')
    args.threads = thread_counts(args.threads)
    result = {'device': platform.processor() or platform.machine(),
              'cpu_count': os.cpu_count(), 'threads': args.threads, 'hogs': args.hogs,
              'torch': torch.__version__, 'decode_tokens': args.decode_tokens,
              'rounds': args.rounds, 'limit_x_float': LIMIT,
              'loadavg_before': os.getloadavg(), 'models': {}}
    hogs = start_hogs(args.hogs)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for model in args.models.split(','):
                if model == 'demo':
                    model_dir = package_files.DEMO_MODEL_DIR
                elif model == 'mid':
                    model_dir = make_tiny_checkpoint(Path(tmp) / 'mid', seed=0,
                                                     text_config=MID_TEXT)
                else:
                    sys.exit(f'unknown model {model!r} (demo, mid)')
                result['models'][model] = bench_model(model, model_dir, args)
        if args.layers:
            torch.set_num_threads(args.threads[0])
            result['layers'] = bench_layers()
    finally:
        stop_hogs(hogs)
    result['loadavg_after'] = os.getloadavg()
    before = None
    if args.before:
        was = json.loads(args.before.read_text())
        before = {m: {t: {f: r['decode_x_float']['median'] for f, r in d.items()
                          if 'decode_x_float' in r}
                      for t, d in v['decode'].items()}
                  for m, v in was['models'].items()}
        result['before_decode_x_float'] = before
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = 'quant_cpu' + (f'_{args.tag}' if args.tag else '')
    (args.out / f'{stem}.json').write_text(json.dumps(result, indent=2))
    plot(result, args.out / f'{stem}.png', before)
    return result


if __name__ == '__main__':
    main()
