# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Anatomy of one batch-1 decode step on a GPU: where a token's time goes.

For a full-size random-weight Qwen3-VL (bf16, CUDA graphs; default 2B) it measures, in one run:

* kernels per decode step and per layer (torch profiler over one eager run of the captured
  function -- the graph replays exactly these kernels), with the most frequent kernel names;
* graph replay ms per step, and host ms per step (``prepare_decode`` + the 8-byte token copy,
  i.e. a whole greedy ``decode_sample`` minus the replay);
* the GEMV floor: every text-decoder projection + lm_head alone in one CUDA graph, with the
  merged ``qkv_proj``/``gate_up_proj`` weights and with them cut into the checkpoint's
  separate q/k/v and gate/up matrices;
* attention per layer (16 query / 8 KV heads, head_dim 128: q/k-norm + M-RoPE + KV write +
  paged decode, in a CUDA graph) against torch SDPA on contiguous K/V (the same heads, no KV
  write) at contexts 128 ... 32k.

Prints JSON and writes JSON + PNG to ``--out`` (default ``bench/results``)::

    PYTHONPATH=$PWD python3 bench/decode_anatomy.py --model 2b

Needs a CUDA GPU with CuPy. ``--cpu-count`` runs the part that works without one: the tiny
model's decode step through the CPU kernel emulator (``test/kernel_emulator.py``), counting
custom-kernel launches plus the torch compute ops between them (each a kernel on a GPU).
"""

import argparse
from collections import Counter
import json
from pathlib import Path
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'bench'))

CONTEXTS = (128, 1024, 4096, 16384, 32768)
# Torch ops that only make views (no kernel on a GPU); everything else is counted as one.
_VIEW_OPS = {'view', '_unsafe_view', 'reshape', 'as_strided', 'slice', 'select', 'split',
             'split_with_sizes', 'chunk', 'narrow', 'expand', 't', 'transpose', 'unsqueeze',
             'squeeze', 'alias', 'detach', 'permute', 'unbind', 'lift_fresh', 'empty',
             'empty_strided', 'empty_like', '_reshape_alias'}


def _median_ms(fn, reps: int) -> float:
    """Median wall time of ``fn()`` in ms over ``reps`` synchronised calls."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graph_ms(body, reps: int = 20, inner: int = 50) -> float:
    """Ms per call of ``body`` captured in a CUDA graph (``inner`` calls per replay)."""
    body()  # warm-up outside the capture (cuBLAS handles, CuPy state)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode='thread_local'):
        for _ in range(inner):
            body()
    graph.replay()
    return _median_ms(graph.replay, reps) / inner


# ------------------------------------------------------------------------------ GPU parts

def step_anatomy(engine, steps: int = 50) -> dict:
    """Kernels per step, replay ms and host ms of the engine's captured greedy decode step."""
    from torch.profiler import ProfilerActivity, profile

    from orin_llm_node.engine.config import SamplingParams
    from orin_llm_node.engine.sampler import Sampler

    runner = engine.runner
    conv = engine.new_conversation()
    engine.chat(conv, 'Hello there.', sampling=SamplingParams(max_tokens=4, ignore_eos=True))
    table, context = conv.block_table, len(conv.token_ids)
    token = conv.token_ids[-1]
    runner.prepare_decode(token, context - 1, table, context)
    runner._decode_graph_body()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner._decode_graph_body()
        torch.cuda.synchronize()
    names = Counter(e.name for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    layers = engine.model.config.text.num_hidden_layers
    total = sum(names.values())
    sampler = Sampler(SamplingParams(), runner.device, engine._banned)
    runner.decode_sample(token, context - 1, table, context, sampler)  # capture
    replay_ms = _median_ms(runner.decode_graph.graph.replay, steps)
    step_ms = _median_ms(lambda: runner.decode_sample(token, context - 1, table, context,
                                                      sampler), steps)
    engine.reset(conv)
    return {'kernels_per_step': total, 'kernels_per_layer': total / layers,
            'layers': layers, 'top_kernels': dict(names.most_common(16)),
            'graph_replay_ms': replay_ms, 'greedy_step_ms': step_ms,
            'host_ms_per_step': step_ms - replay_ms,
            'captures': runner.decode_graph.captures}


def gemv_floor(model) -> dict:
    """Ms of every decoder projection + lm_head on one row, merged and separate weights."""
    import torch.nn.functional as F

    lm = model.language_model
    hidden = lm.config.hidden_size
    x = torch.randn(1, hidden, dtype=lm.embed_tokens.weight.dtype, device='cuda')
    xi = torch.randn(1, lm.config.intermediate_size, dtype=x.dtype, device='cuda')
    merged, separate = [], []
    for layer in lm.layers:
        attn, mlp = layer.self_attn, layer.mlp
        merged += [(x, attn.qkv_proj.weight), (x, attn.o_proj.weight),
                   (x, mlp.gate_up_proj.weight), (xi, mlp.down_proj.weight)]
        separate += [(x, attn.qkv_proj.shard(attn.qkv_proj.weight, s)) for s in 'qkv']
        separate += [(x, mlp.gate_up_proj.shard(mlp.gate_up_proj.weight, s)) for s in (0, 1)]
        separate += [(x, attn.o_proj.weight), (xi, mlp.down_proj.weight)]
    head = [(x, model.lm_head.weight)]
    out = {}
    for key, mats in (('merged_ms', merged + head), ('separate_ms', separate + head)):
        out[key] = _graph_ms(lambda mats=mats: [F.linear(a, w) for a, w in mats], inner=5)
    nbytes = sum(w.numel() * w.element_size() for _, w in merged + head)
    out['weight_bytes'] = nbytes
    out['merged_gbs'] = nbytes / out['merged_ms'] / 1e6
    return out


def attention_per_layer(contexts, hq: int = 16, hkv: int = 8, d: int = 128,
                        block_size: int = 16) -> dict:
    """µs per layer: our fused attention (KV write included) vs SDPA on contiguous K/V."""
    import torch.nn.functional as F

    from orin_llm_node.attention.cuda_backend import CudaPagedAttention
    from orin_llm_node.layers import MRotaryEmbedding, RMSNorm

    dev, dtype = torch.device('cuda'), torch.bfloat16
    max_len = max(contexts)
    blocks = max_len // block_size + 1
    kv = torch.randn(1, 2, blocks, block_size, hkv, d, device=dev).to(dtype)
    attn = CudaPagedAttention(kv, hq, max_len)
    attn.warmup()
    table = torch.randperm(blocks, device=dev)
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    qkv = torch.randn(1, (hq + 2 * hkv) * d, device=dev).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(1, hq, d), k.view(1, hkv, d), v.view(1, hkv, d)
    norm = RMSNorm(d, 1e-6).to(dev, dtype)
    cos, sin = MRotaryEmbedding(d, 5e6, (24, 20, 20)).to(dev)(
        torch.tensor([5], device=dev), dtype)
    out = {'contexts': list(contexts), 'ours_us': [], 'sdpa_contiguous_us': [],
           'num_splits': attn.num_splits}
    for ctx in contexts:
        last = ctx - 1
        slot.fill_(int(table[last // block_size]) * block_size + last % block_size)
        attn.prepare(slot, table, last, 1)
        with torch.no_grad():
            ours = _graph_ms(lambda: attn.attend_qkv(0, q, k, v, norm, norm, cos, sin))
        kc = torch.randn(1, hkv, ctx, d, device=dev).to(dtype)
        vc = torch.randn_like(kc)
        qc = torch.randn(1, hq, 1, d, device=dev).to(dtype)
        sdpa = _graph_ms(lambda kc=kc, vc=vc, qc=qc: F.scaled_dot_product_attention(
            qc, kc, vc, enable_gqa=True))
        out['ours_us'].append(ours * 1e3)
        out['sdpa_contiguous_us'].append(sdpa * 1e3)
        del kc, vc
    out['ours_vs_sdpa'] = [o / s for o, s in zip(out['ours_us'], out['sdpa_contiguous_us'],
                                                  strict=True)]
    out['within_1_25x_met'] = all(r <= 1.25 for r in out['ours_vs_sdpa'])
    return out


def gpu_main(args) -> dict:
    import gpu_decode

    from orin_llm_node.engine import EngineConfig, LLMEngine
    import orin_llm_node.engine.llm_engine as llm_engine_module

    llm_engine_module.load_model = gpu_decode.random_load_model  # random weights
    result = {'device': torch.cuda.get_device_name(), 'model': args.model,
              'torch': torch.__version__, 'cuda': torch.version.cuda}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = gpu_decode.make_model_dir(args.model, Path(tmp) / args.model)
        engine = LLMEngine(EngineConfig(model_path=model_dir, device='cuda', dtype='bfloat16',
                                        max_model_len=8192, kv_cache_memory_mb=2048,
                                        block_order_seed=0))
        if engine.runner.decode_graph is None:
            sys.exit('decode_anatomy: CUDA graphs are not in use (is CuPy installed?)')
        result['step'] = step_anatomy(engine)
        result['gemv_floor'] = gemv_floor(engine.model)
        result['gemv_floor']['share_of_replay'] = (
            result['gemv_floor']['merged_ms'] / result['step']['graph_replay_ms'])
        del engine
        gpu_decode._MODELS.clear()
        torch.cuda.empty_cache()
    result['attention'] = attention_per_layer(args.contexts)
    result['targets'] = {
        'kernels_per_layer_le_12_met': result['step']['kernels_per_layer'] <= 12 + 16 / max(
            1, result['step']['layers']),
        'attention_within_1_25x_sdpa_met': result['attention']['within_1_25x_met'],
    }
    return result


# ------------------------------------------------------------------------------ CPU part

def cpu_kernel_count() -> dict:
    """Kernels of one decode step of the tiny model, counted through the CPU emulator."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(REPO / 'test'))
    import kernel_emulator

    from orin_llm_node.attention.cuda_backend import CudaPagedAttention
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.kernels import dispatch
    from orin_llm_node.kernels.cuda_ops import FusedOps
    from orin_llm_node.models.loader import load_model
    from orin_llm_node.testing import make_tiny_checkpoint

    if not kernel_emulator.compiler_available():
        sys.exit('decode_anatomy --cpu-count: needs g++ for the kernel emulator')

    where = {'in_layer': False}  # set by hooks around each decoder layer
    inside, outside = Counter(), Counter()

    def count(name):
        (inside if where['in_layer'] else outside)[name] += 1

    class TorchOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__.rstrip('_')
            if name not in _VIEW_OPS:
                count('torch.' + name)
            return func(*args, **(kwargs or {}))

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(make_tiny_checkpoint(Path(tmp) / 'tiny'))
    tc = model.config.text
    cpu = torch.device('cpu')
    emulated = kernel_emulator.emulated_launch('float32', tc.head_dim)

    def launch(name, grid, block, args):
        count(name)
        emulated(name, grid, block, args)

    for layer in model.language_model.layers:
        layer.register_forward_pre_hook(lambda *_: where.update(in_layer=True))
        layer.register_forward_hook(lambda *_: where.update(in_layer=False))

    runner = ModelRunner(model, 16, 16, 256, cpu, torch.float32)
    runner.attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, 256,
                                     launch=launch)
    runner.attn.warmup()
    ops = FusedOps(torch.float32, tc.head_dim, cpu, launch=launch)
    table = list(range(4))
    with dispatch.installed(cpu, torch.float32, ops):
        runner.prefill(list(range(1, 20)), np.tile(np.arange(19), (3, 1)), table, 0)
        runner.prepare_decode(5, 19, table, 20)
        inside.clear()
        outside.clear()
        with TorchOps():
            runner._decode_graph_body()
    layers = tc.num_hidden_layers
    return {'model': 'tiny (emulated kernels, CPU)', 'layers': layers,
            'kernels_per_step': sum(inside.values()) + sum(outside.values()),
            'kernels_per_layer': sum(inside.values()) / layers,
            'kernels_outside_layers': sum(outside.values()),
            'per_layer': {k: v / layers for k, v in inside.items()},
            'outside_layers': dict(outside),
            'note': 'custom kernels emulated; each torch compute op counted as one kernel '
                    '(views excluded); cuBLAS may use more than one kernel per GEMV'}


# ------------------------------------------------------------------------------ output

def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    att, step, floor = result['attention'], result['step'], result['gemv_floor']
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    x = np.arange(len(att['contexts']))
    axes[0].bar(x - 0.2, att['ours_us'], 0.4, label='ours (q/k-norm+RoPE+KV write+paged)')
    axes[0].bar(x + 0.2, att['sdpa_contiguous_us'], 0.4, label='SDPA, contiguous K/V')
    axes[0].set_xticks(x, [str(c) for c in att['contexts']])
    axes[0].set_xlabel('context')
    axes[0].set_ylabel('µs per layer')
    axes[0].set_title('decode attention, 16 q / 8 kv heads, d 128, bf16')
    axes[0].legend(fontsize=8)
    parts = {'GEMV floor (merged)': floor['merged_ms'],
             'rest of replay': step['graph_replay_ms'] - floor['merged_ms'],
             'host': step['host_ms_per_step']}
    axes[1].barh(list(parts), list(parts.values()))
    axes[1].set_xlabel('ms per decode step')
    axes[1].set_title(f"Qwen3-VL-{result['model'].upper()} on {result['device']}: "
                      f"{step['kernels_per_step']} kernels "
                      f"({step['kernels_per_layer']:.1f}/layer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='2b', choices=['2b', '4b', '8b'])
    p.add_argument('--contexts', default=','.join(map(str, CONTEXTS)))
    p.add_argument('--out', type=Path, default=REPO / 'bench' / 'results')
    p.add_argument('--cpu-count', action='store_true',
                   help="no GPU: count the tiny model's decode kernels through the emulator")
    args = p.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(',')]
    if args.cpu_count:
        print(json.dumps(cpu_kernel_count(), indent=2))
        return 0
    if not torch.cuda.is_available():
        sys.exit('decode_anatomy: needs a CUDA GPU with CuPy (or --cpu-count for the '
                 'emulated kernel count)')
    from orin_llm_node.kernels.cuda_ops import cupy_available

    if not cupy_available():
        sys.exit('decode_anatomy: needs CuPy (cupy-cuda12x / cupy-cuda13x)')
    import gpu_decode

    gpu_decode.write_result('decode_anatomy', gpu_main(args), plot, args.out, tag=args.model)
    return 0


if __name__ == '__main__':
    sys.exit(main())
