# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Decode speed and weight memory per weight format: bf16 vs INT8 vs INT4 vs FP8.

For each model size and format, in one run on one GPU: full-size random-weight Qwen3-VL (the
published configs; quantized formats round random bf16-scale weights at load, as
quantize-at-load does), batch-1 greedy decode through the engine with CUDA graphs at the
given contexts (best of two runs), and

* weight memory: ``torch.cuda.memory_allocated`` after loading (the weights alone: nothing
  else is allocated yet) and ``max_memory_allocated`` during loading (includes the transient
  float rows being quantized), plus ``LLMEngine.weight_bytes``;
* the batch-1 bandwidth bound of that format: bandwidth / bytes of the text decoder read per
  token (codes + scales + the float embedding-as-lm_head / lm_head, norms), and the fraction
  of it reached;
* speed-ups over bf16 and the issue's targets (8B INT4 >= 2.5x bf16 and >= 60 % of its bound,
  2B INT4 >= 1.8x, 8B INT8 >= 1.6x, 8B INT4 weights <= 5.5 GB).

Writes JSON + PNG to ``--out`` (default ``bench/results``). Needs a CUDA GPU with CuPy::

    python bench/quant_decode.py --models 2b,8b --formats none,int8,int4,fp8

``--smoke`` runs the same code on the CPU with the tiny model (torch path, no kernels): a
check of the script, not a measurement. Prefill speed of the dequantise + cuBLAS path is not
measured here.
"""

import gc
import json
from pathlib import Path
import sys

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'bench'))

import gpu_decode as gd  # noqa: E402

from orin_llm_node.engine import EngineConfig, LLMEngine  # noqa: E402
from orin_llm_node.quantization import model_weight_bytes  # noqa: E402

TARGETS = {  # (size, format): minimum speed-up over bf16 at the shortest context
    ('8b', 'int4'): 2.5, ('2b', 'int4'): 1.8, ('8b', 'int8'): 1.6,
}
INT4_8B_MAX_WEIGHT_GB = 5.5
INT4_8B_MIN_BOUND_FRACTION = 0.6


def decode_read_bytes(model) -> int:
    """Bytes of the text decoder read per decode token in this model's weight format."""
    lm = model.language_model
    total = model_weight_bytes(lm)
    if model.lm_head.weight is not lm.embed_tokens.weight:
        w = lm.embed_tokens.weight
        total += model_weight_bytes(model.lm_head) - w.numel() * w.element_size()
    return total


def bench_format(size: str, fmt: str, model_dir: Path, args) -> dict:
    if gd.DEV == 'cuda':
        # The previous format's engine is closed, but a cycle may still hold a tensor: collected
        # now, not while this load runs (that made the weights' bytes come out negative).
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    engine = LLMEngine(EngineConfig(
        model_path=model_dir, device=gd.DEV, dtype='bfloat16' if gd.DEV == 'cuda' else 'float32',
        quantization=fmt, max_model_len=max(8192, max(args.contexts) + 2 * args.decode_tokens),
        kv_cache_memory_mb=args.kv_cache_mb, block_order_seed=0))
    out = {'weight_format': engine.weight_format, 'engine_weight_bytes': engine.weight_bytes,
           'decode_read_bytes': decode_read_bytes(engine.model),
           'cuda_graph_in_use': engine.runner.decode_graph is not None, 'decode': {}}
    if gd.DEV == 'cuda':
        # The KV pool is allocated after the weights: subtract it from "allocated now".
        kv = engine.runner.bytes_per_block * engine.stats().total_blocks
        out['weights_allocated_bytes'] = torch.cuda.memory_allocated() - base - kv
        out['load_peak_allocated_bytes'] = torch.cuda.max_memory_allocated() - base
    gd.engine_decode(engine, min(args.contexts), 8, salt=1)  # warm-up: kernels, capture
    for ctx in args.contexts:
        runs = [gd.engine_decode(engine, ctx, args.decode_tokens, salt=ctx + i)
                for i in range(2)]
        out['decode'][str(ctx)] = {'prompt_tokens': runs[0]['prompt_tokens'],
                                   'tok_s': max(r['tok_s'] for r in runs)}
    out['bound_tok_s'] = args.bandwidth_gbs * 1e9 / out['decode_read_bytes']
    for e in out['decode'].values():
        e['fraction_of_bound'] = e['tok_s'] / out['bound_tok_s']
    engine.close()      # weights, KV pool and graphs given back before the next format loads
    del engine
    gd._MODELS.clear()
    return out


def bench_model(size: str, args, workdir: Path) -> dict:
    model_dir = gd.make_model_dir(size, workdir / size)
    result = {}
    for fmt in args.formats:
        result[fmt] = bench_format(size, fmt, model_dir, args)
        print(size, fmt, json.dumps(result[fmt]), flush=True)
    short = str(min(args.contexts))
    if 'none' in result:
        bf16 = result['none']['decode'][short]['tok_s']
        for r in result.values():
            r['speedup_vs_bf16'] = r['decode'][short]['tok_s'] / bf16
    targets = {}
    for (s, fmt), want in TARGETS.items():
        if s == size and fmt in result and 'speedup_vs_bf16' in result[fmt]:
            targets[f'{fmt}_speedup_ge_{want}'] = result[fmt]['speedup_vs_bf16'] >= want
    if size == '8b' and 'int4' in result:
        r = result['int4']
        targets['int4_fraction_of_bound_ge_60pct'] = (
            r['decode'][short]['fraction_of_bound'] >= INT4_8B_MIN_BOUND_FRACTION)
        if 'weights_allocated_bytes' in r:
            targets['int4_weights_le_5.5GB'] = (
                r['weights_allocated_bytes'] <= INT4_8B_MAX_WEIGHT_GB * 1e9)
    return {'formats': result, 'targets': targets}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = result['models']
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, (size, m) in zip(axes[0], models.items(), strict=True):
        fmts = list(m['formats'])
        ctx = str(min(result['contexts']))
        speeds = [m['formats'][f]['decode'][ctx]['tok_s'] for f in fmts]
        bounds = [m['formats'][f]['bound_tok_s'] for f in fmts]
        x = range(len(fmts))
        ax.bar([i - 0.2 for i in x], speeds, 0.4, label=f'decode tok/s (ctx {ctx})')
        ax.bar([i + 0.2 for i in x], bounds, 0.4, label='bandwidth bound', alpha=0.5)
        ax.set_xticks(list(x), [m['formats'][f]['weight_format'] for f in fmts], fontsize=8)
        ax.set_title(f"Qwen3-VL-{size.upper()} on {result['device']}, batch 1")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = gd.argument_parser(__doc__, contexts='128,1024', kv_cache_mb=2048)
    p.add_argument('--formats', default='none,int8,int4,fp8',
                   help='comma list of EngineConfig.quantization values (none = bf16)')
    args = p.parse_args(argv)
    if args.smoke:
        gd.DEV = 'cpu'
        args.models, args.contexts, args.decode_tokens, args.kv_cache_mb = 'tiny', '40', 6, 16
    elif not torch.cuda.is_available():
        sys.exit('quant_decode: needs a CUDA GPU with CuPy (or --smoke); nothing was measured')
    args.contexts = [int(c) for c in args.contexts.split(',')]
    args.formats = args.formats.split(',')
    name, _, measured = gd.device_bandwidth(args)
    result = {'device': name, 'torch': torch.__version__, 'cuda': torch.version.cuda,
              'bandwidth_gbs_used': args.bandwidth_gbs, 'measured_copy_bandwidth_gbs': measured,
              'contexts': args.contexts, 'decode_tokens': args.decode_tokens, 'models': {}}
    gd.run_and_write('quant_decode', bench_model, plot, result, args)


if __name__ == '__main__':
    main()
