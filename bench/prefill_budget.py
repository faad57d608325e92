# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""FLOP/byte budget of prefill attention for Qwen3-VL 2B/8B, and what Orin's peaks imply.

Analytic (any machine, the CPU included): for each prompt length, a cold prefill run as the
engine runs it (chunks of ``--chunk`` tokens, each attending to the chunks before it through
the KV cache), per model, summed over the layers:

* attention FLOPs: the useful ones (each query times the keys it may see: 4 * head_dim per
  (query head, visible key)) and the ones ``paged_prefill``'s tensor-core body executes (each
  warp of 16 query rows walks whole 64-key tiles up to its last key; the same count the CPU
  emulator test checks, ``test_tensor_core_prefill_emulated``);
* attention bytes: the least any kernel must move (Q and O once, the context's K/V once per
  chunk) and what ``paged_prefill`` reads when no CTA finds another's K/V in L2 (each CTA of 64
  query rows reads K/V up to its last key);
* the linear layers' FLOPs and weight bytes (qkv, o, gate/up, down), for scale;
* seconds on a Jetson AGX Orin at its peaks (``ORIN``): tensor cores (the new fp16/bf16
  kernel), CUDA cores in fp32, the old CUDA-core kernel's shared-memory bound (one FMA per two
  4-byte shared loads: the estimate in the issue that asked for this), and DRAM.

Measured (only where a CUDA GPU and CuPy are present, never on the CPU): the ``paged_prefill``
kernel per layer at the models' head layouts in bf16 (tensor cores) and fp32 (CUDA cores,
shorter lengths), against torch SDPA (flash, causal) on contiguous K/V, CUDA events, median of
``--repeats``. These times are for the GPU at hand, not for an Orin.

Prints JSON and writes JSON + PNG to ``--out`` (default ``bench/results``)::

    PYTHONPATH=$PWD python3 bench/prefill_budget.py            # measures too on a GPU
    PYTHONPATH=$PWD python3 bench/prefill_budget.py --no-measure
"""

import argparse
import json
from pathlib import Path
import statistics
import sys

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'bench'))

from gpu_decode import write_result  # noqa: E402

from orin_llm_node.kernels import kernel_sources as ks  # noqa: E402
from orin_llm_node.models.config import config_from_dict  # noqa: E402

CONFIGS = REPO / 'test' / 'data' / 'qwen3_vl_configs'
ELEM = 2  # bytes of a bf16/fp16 element

#: Jetson AGX Orin 64 GB at MAXN (16 SMs of 128 CUDA cores and 4 third-generation tensor cores,
#: GPU 1.3 GHz, LPDDR5 204.8 GB/s, 4 MB L2). Tensor cores: 256 dense fp16/bf16 FMA per clock
#: each (the A100's rate), which matches the published 170 sparse INT8 TOPS / 2 (sparsity) / 2
#: (fp16 vs int8); if fp32 accumulation ran at half rate, as on GeForce Ampere, halve it.
ORIN = {
    'name': 'Jetson AGX Orin 64GB (MAXN, nominal peaks)',
    'tensor_tflops': 16 * 4 * 256 * 2 * 1.3e9 / 1e12,
    'cuda_core_fp32_tflops': 2048 * 2 * 1.3e9 / 1e12,
    'shared_memory_tbs': 16 * 128 * 1.3e9 / 1e12,  # 128 bytes per clock per SM
    'dram_gbs': 204.8,
    'l2_mb': 4,
}


def model_shape(size: str) -> dict:
    """The text decoder's shape from the published config (our parser)."""
    raw = json.loads((CONFIGS / f'qwen3-vl-{size}-instruct.config.json').read_text())
    t = config_from_dict(raw).text
    return {'layers': t.num_hidden_layers, 'hidden': t.hidden_size,
            'intermediate': t.intermediate_size, 'q_heads': t.num_attention_heads,
            'kv_heads': t.num_key_value_heads, 'head_dim': t.head_dim}


def chunk_attention(m: dict, prefix: int, n: int) -> dict:
    """One layer's attention counts for ``n`` new tokens after ``prefix`` cached ones."""
    g, d, hkv = m['q_heads'] // m['kv_heads'], m['head_dim'], m['kv_heads']
    rows = n * g
    tokens = np.arange(n)
    useful = 4 * d * g * int((prefix + tokens + 1).sum())
    # Tensor-core body: warps of 16 rows, whole 64-key tiles up to each warp's last key.
    warp_first = np.arange(0, rows, 16)
    warp_last_token = np.minimum(warp_first + 15, rows - 1) // g
    tiles = (prefix + warp_last_token) // ks.PREFILL_TC_KV_TILE + 1
    executed = int(tiles.sum()) * ks.PREFILL_TC_KV_TILE * 16 * d * 4
    # K/V read per CTA of PREFILL_TC_ROWS rows (up to its last key), Q read and O written once.
    cta_rows_end = np.minimum(np.arange(0, rows, ks.PREFILL_TC_ROWS) + ks.PREFILL_TC_ROWS, rows)
    cta_last_token = (cta_rows_end - 1) // g
    kernel_kv = int((prefix + cta_last_token + 1).sum()) * d * ELEM * 2
    qo = 2 * rows * d * ELEM
    least_kv = (prefix + n) * d * ELEM * 2
    return {'useful_flops': hkv * useful, 'executed_flops': hkv * executed,
            'least_bytes': hkv * (qo + least_kv), 'kernel_bytes': hkv * (qo + kernel_kv)}


def prefill_budget(m: dict, length: int, chunk: int) -> dict:
    """Whole-model counts and Orin seconds for a cold prefill of ``length`` tokens."""
    att = dict.fromkeys(('useful_flops', 'executed_flops', 'least_bytes', 'kernel_bytes'), 0)
    chunks = 0
    for lo in range(0, length, chunk):
        for key, value in chunk_attention(m, lo, min(chunk, length - lo)).items():
            att[key] += value * m['layers']
        chunks += 1
    h, d, i = m['hidden'], m['head_dim'], m['intermediate']
    layer_weights = h * (m['q_heads'] + 2 * m['kv_heads']) * d + m['q_heads'] * d * h + 3 * h * i
    linear_flops = 2 * layer_weights * m['layers'] * length
    weight_bytes = layer_weights * m['layers'] * ELEM * chunks  # read once per chunk
    tc, cc = ORIN['tensor_tflops'] * 1e12, ORIN['cuda_core_fp32_tflops'] * 1e12
    bw = ORIN['dram_gbs'] * 1e9
    return {
        'tokens': length, 'chunks': chunks, **att,
        'intensity_flop_per_byte': att['executed_flops'] / att['kernel_bytes'],
        'linear_flops': linear_flops, 'linear_weight_bytes': weight_bytes,
        'orin_s': {
            'attention_tensor_cores': att['executed_flops'] / tc,
            'attention_cuda_cores_fp32': att['useful_flops'] / cc,
            # Old CUDA-core kernel: one FMA (2 FLOPs) per two 4-byte shared-memory loads.
            'attention_before_shared_memory_bound':
                att['useful_flops'] / 2 * 8 / (ORIN['shared_memory_tbs'] * 1e12),
            'attention_dram_least': att['least_bytes'] / bw,
            'attention_dram_no_l2_reuse': att['kernel_bytes'] / bw,
            'linear_tensor_cores': linear_flops / tc,
            'linear_weights_dram': weight_bytes / bw,
        },
    }


def measure(m: dict, lengths, repeats: int) -> dict:
    """Per-layer ms of paged_prefill (bf16, fp32) and SDPA on this GPU (cold prefills)."""
    from orin_llm_node.attention.cuda_backend import CudaPagedAttention

    dev = torch.device('cuda')
    hq, hkv, d = m['q_heads'], m['kv_heads'], m['head_dim']
    out = {}

    def timed(fn):
        fn()  # warm-up (and the first launch's module load)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times), min(times), max(times)

    for length in lengths:
        row = {}
        blocks = -(-length // 16)
        gen = torch.Generator(device=dev).manual_seed(length)
        table = torch.randperm(blocks, generator=gen, device=dev)
        t = torch.arange(length, device=dev)
        slots = table[t // 16] * 16 + t % 16
        for dtype in (torch.bfloat16, torch.float32):
            if dtype == torch.float32 and length > 4096:
                continue  # the CUDA-core body: minutes at 16k per repeat set on small GPUs
            kv = torch.randn(1, 2, blocks, 16, hkv, d, generator=gen, device=dev).to(dtype)
            attn = CudaPagedAttention(kv, hq, length)
            attn.warmup()
            q, k, v = (torch.randn(length, h, d, generator=gen, device=dev).to(dtype)
                       for h in (hq, hkv, hkv))
            attn.prepare(slots, table, 0, length)
            ms, lo, hi = timed(lambda a=attn, q=q, k=k, v=v: a.attend(0, q, k, v))
            name = 'paged_prefill_' + str(dtype).replace('torch.', '')
            row[name] = {'ms_median': ms, 'ms_min': lo, 'ms_max': hi}
            del kv, attn, q, k, v
        qh, kh, vh = (torch.randn(1, h, length, d, generator=gen, device=dev,
                                  dtype=torch.bfloat16) for h in (hq, hkv, hkv))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        ms, lo, hi = timed(lambda f=sdpa, q=qh, k=kh, v=vh: f(q, k, v, is_causal=True,
                                                               enable_gqa=hq != hkv))
        row['sdpa_bfloat16_contiguous'] = {'ms_median': ms, 'ms_min': lo, 'ms_max': hi}
        useful = chunk_attention(m, 0, length)['useful_flops']
        for r in row.values():
            r['useful_tflops'] = useful / (r['ms_median'] * 1e-3) / 1e12
        out[length] = row
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = result['models']
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    lines = (('attention_tensor_cores', 'attention, tensor-core peak', '-'),
             ('attention_before_shared_memory_bound', 'attention, old kernel (smem bound)', '-'),
             ('attention_cuda_cores_fp32', 'attention, CUDA-core fp32 peak', '--'),
             ('attention_dram_no_l2_reuse', 'attention, DRAM without L2 reuse', ':'),
             ('attention_dram_least', 'attention, DRAM least', ':'),
             ('linear_tensor_cores', 'linear layers, tensor-core peak', '-.'))
    for ax, (size, m) in zip(axes[0], models.items(), strict=True):
        lengths = [b['tokens'] for b in m['budget']]
        for key, label, style in lines:
            ax.loglog(lengths, [b['orin_s'][key] for b in m['budget']], style, label=label)
        measured = m.get('measured') or {}
        for name in sorted({name for row in measured.values() for name in row}):
            xs = [x for x in sorted(measured) if name in measured[x]]
            ys = [measured[x][name]['ms_median'] * 1e-3 * m['shape']['layers'] for x in xs]
            ax.loglog(xs, ys, 'o', label=f"measured {name} ({result['device']})")
        ax.set_xlabel('prompt tokens (cold prefill)')
        ax.set_ylabel('seconds, all layers')
        ax.set_title(f"Qwen3-VL-{size.upper()} prefill on {ORIN['name'].split(' (')[0]}")
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', default='2b,8b', help='comma list of 2b, 4b, 8b')
    p.add_argument('--lengths', default='512,1024,2048,4096,8192,16384,32768')
    p.add_argument('--chunk', type=int, default=2048,
                   help='prefill chunk (EngineConfig.prefill_chunk_tokens)')
    p.add_argument('--measure-lengths', default='512,1024,2048,4096,8192,16384')
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--no-measure', action='store_true', help='analytic part only')
    p.add_argument('--out', type=Path, default=REPO / 'bench' / 'results')
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(',')]
    measuring = not args.no_measure and torch.cuda.is_available()
    if measuring:
        try:
            import cupy  # noqa: F401
        except ImportError:
            measuring = False
    device = torch.cuda.get_device_name() if measuring else 'analytic'
    result = {'device': device, 'orin': ORIN, 'chunk_tokens': args.chunk,
              'tc_rows_per_cta': ks.PREFILL_TC_ROWS, 'tc_kv_tile': ks.PREFILL_TC_KV_TILE,
              'torch': torch.__version__, 'models': {}}
    for size in args.models.split(','):
        m = model_shape(size)
        entry = {'shape': m, 'budget': [prefill_budget(m, n, args.chunk) for n in lengths]}
        if measuring:
            entry['measured'] = measure(
                m, [int(x) for x in args.measure_lengths.split(',')], args.repeats)
        result['models'][size] = entry
    write_result('prefill_budget', result, plot, args.out)


if __name__ == '__main__':
    main()
