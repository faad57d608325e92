# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""GPU decode benchmark: full-size random-weight Qwen3-VL, bf16, batch 1.

For each model size (2B, and 8B where memory allows) it measures, in one run on one GPU:

* decode tok/s at contexts 128 / 1k / 4k / 16k with CUDA graphs and eagerly (``enable_cuda_graph``
  on/off), as the engine reports them (sampling and host work included);
* transformers ``generate`` (sdpa, bf16, same config, random weights) at the same contexts;
* time to first token of a 448x448 image + ~32-token prompt (cold), and of a ~32-token second
  turn in the same conversation (prefix cache);
* the fraction of the batch-1 bandwidth bound ``bandwidth / bytes read per token`` (text
  decoder weights in bf16 without the embedding table -- the bandwidth yardstick -- and, as a
  second figure, weights + the KV cache read at that context), against the GPU's nominal
  bandwidth when known and a measured device-to-device copy bandwidth.

Weights are random (the speed does not depend on them): the model is built from the published
configs in ``test/data/qwen3_vl_configs`` with our config parser and filled on the GPU; the
tokenizer, chat template and image processor come from the tiny-checkpoint helpers (token ids
are remapped in the config). Writes JSON and a PNG to ``--out`` (default ``bench/results``)
and prints the JSON. Run on the GPU machine::

    python bench/gpu_decode.py --models 2b,8b

``--smoke`` runs the same code on the CPU with a tiny model (fp32, short contexts): a check of
the script itself, not a measurement.
"""

import argparse
import contextlib
import copy
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

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
import orin_llm_node.engine.llm_engine as llm_engine_module  # noqa: E402
from orin_llm_node.models.config import load_config  # noqa: E402
from orin_llm_node.models.loader import build_model, linear_module_names  # noqa: E402
from orin_llm_node.quantization import QuantLinear  # noqa: E402
from orin_llm_node.quantization.checkpoint import plan_quantization  # noqa: E402
from orin_llm_node.testing import tiny_checkpoint  # noqa: E402

CONFIGS = REPO / 'test' / 'data' / 'qwen3_vl_configs'
DEV = 'cuda'  # "cpu" with --smoke
# Nominal DRAM bandwidth in GB/s by device-name fragment (first match wins).
NOMINAL_BW_GBS = [
    ('H200', 4800.0), ('H100 NVL', 3900.0), ('H100 PCIe', 2000.0), ('H100', 3350.0),
    ('A100-SXM4-80GB', 2039.0), ('A100 80GB PCIe', 1935.0), ('A100', 1555.0),
    ('L40S', 864.0), ('L4', 300.0), ('RTX 4090', 1008.0),
    ('Orin NX', 102.4), ('Orin Nano', 68.0), ('Orin', 204.8),
]


# ------------------------------------------------------------------------------ model set-up

def make_model_dir(size: str, out: Path) -> Path:
    """Config of the published ``size`` with the tiny tokenizer's special ids, no weights."""
    if size == 'tiny':
        return tiny_checkpoint.make_tiny_checkpoint(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_checkpoint.train_tokenizer(tiny_checkpoint.CORPUS)
    ids = tiny_checkpoint.write_tokenizer_files(out, tokenizer)
    cfg = json.loads((CONFIGS / f'qwen3-vl-{size}-instruct.config.json').read_text())
    cfg.update(image_token_id=ids['<|image_pad|>'], video_token_id=ids['<|video_pad|>'],
               vision_start_token_id=ids['<|vision_start|>'],
               vision_end_token_id=ids['<|vision_end|>'])
    cfg['text_config'].update(bos_token_id=ids['<|endoftext|>'], eos_token_id=ids['<|im_end|>'])
    (out / 'config.json').write_text(json.dumps(cfg, indent=2))
    gen_cfg = {'bos_token_id': ids['<|endoftext|>'], 'pad_token_id': ids['<|endoftext|>'],
               'eos_token_id': [ids['<|im_end|>'], ids['<|endoftext|>']], 'do_sample': False}
    (out / 'generation_config.json').write_text(json.dumps(gen_cfg, indent=2))
    # The published processor bounds (256^2 .. 4096^2 pixels): a 448x448 image stays 448x448.
    tiny_checkpoint.write_preprocessor_config(out, min_pixels=256 * 256,
                                              max_pixels=4096 * 4096)
    return out


def init_random_(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights ~ N(0, 0.02), norm scales 1, biases 0 (keeps activations finite in bf16)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02, generator=gen)
            elif 'norm' in name and name.endswith('weight'):
                p.fill_(1.0)
            else:
                p.zero_()


_MODELS = {}


def random_load_model(model_dir, dtype=torch.float32, device='cpu', quantization='none',
                      should_stop=None):
    """Stands in for ``loader.load_model``: same model, random weights, built on the GPU.

    With ``quantization`` the decoder projections are quantized layers filled by rounding
    random weights, 1024 rows at a time (as quantize-at-load would).
    """
    key = (str(model_dir), dtype, str(device), quantization)
    if key not in _MODELS:
        cfg = load_config(model_dir)
        names = linear_module_names(cfg)
        plan = plan_quantization(Path(model_dir), cfg.quantization_config, [],
                                 {n: n for n in names}, quantization)
        model = build_model(cfg, dtype, device, plan and plan.layers, plan and plan.description)
        init_random_(model)
        gen = torch.Generator(device=device).manual_seed(1)
        for m in model.modules():
            if isinstance(m, QuantLinear):
                for r in range(0, m.out_features, 1024):
                    rows = min(1024, m.out_features - r)
                    w = torch.empty(rows, m.in_features, device=device)
                    m.quantize_from(w.normal_(0.0, 0.02, generator=gen), r)
        _MODELS[key] = model.eval()
    return _MODELS[key]


def decode_bytes_per_token(model) -> tuple[int, int]:
    """(bytes of text-decoder weights read per decode token, text-decoder parameter count)."""
    lm = model.language_model
    params = sum(p.numel() for p in lm.parameters())
    if model.lm_head.weight is not lm.embed_tokens.weight:
        params += model.lm_head.weight.numel()
        read = params - lm.embed_tokens.weight.numel()  # only one embedding row is read
    else:
        read = params  # tied: the table is read in full as the output projection
    return read * 2, params  # bf16


def kv_bytes_per_token(text_cfg) -> int:
    """bf16 K+V bytes of one cached token over all layers."""
    return text_cfg.num_hidden_layers * 2 * text_cfg.num_key_value_heads * text_cfg.head_dim * 2


# ------------------------------------------------------------------------------ measurements

def sync():
    if DEV == 'cuda':
        torch.cuda.synchronize()


def copy_bandwidth_gbs(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth (read + write) in GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync()
    return 2 * nbytes * reps / (time.perf_counter() - t0) / 1e9


def nominal_bandwidth_gbs(name: str):
    for fragment, gbs in NOMINAL_BW_GBS:
        if fragment.lower() in name.lower():
            return gbs
    return None


def prompt_of(engine, tokens: int, salt: int) -> str:
    """Plain text of about ``tokens`` tokens (distinct per salt, so no prefix-cache hits)."""
    words = ' '.join(tiny_checkpoint.CORPUS).split()
    rng = np.random.default_rng(salt)
    text = f'request {salt}:'
    while (have := len(engine.tokenizer.encode(text))) < tokens:
        # Grow by about the deficit (a word is >= 1 token): a 16k prompt in a few encodes.
        text += ' ' + ' '.join(rng.choice(words, max(16, tokens - have)))
    ids = engine.tokenizer.encode(text)[:tokens]
    return engine.tokenizer.decode(ids)


def random_rgb(seed: int, size: int = 448) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def engine_decode(engine, context: int, new_tokens: int, salt: int) -> dict:
    conv = engine.new_conversation()
    text = prompt_of(engine, context - 12, salt)  # the chat template adds ~12 tokens
    res = engine.chat(conv, text, sampling=SamplingParams(max_tokens=new_tokens,
                                                          ignore_eos=True))
    engine.reset(conv)
    return {'prompt_tokens': len(res.prompt_token_ids), 'tok_s': res.decode_tok_s,
            'ttft_s': res.ttft_s}


def engine_ttft(engine, reps: int = 3) -> dict:
    cold, second, cached = [], [], []
    for i in range(reps):
        conv = engine.new_conversation()
        first = engine.chat(conv, prompt_of(engine, 32, 1000 + i), images=[random_rgb(i)],
                            sampling=SamplingParams(max_tokens=8, ignore_eos=True))
        follow = engine.chat(conv, prompt_of(engine, 32, 2000 + i),
                             sampling=SamplingParams(max_tokens=8, ignore_eos=True))
        engine.reset(conv)
        cold.append(first.ttft_s)
        second.append(follow.ttft_s)
        cached.append(follow.cached_tokens)
    return {'image_prompt_tokens': len(first.prompt_token_ids),
            'cold_ttft_s': statistics.median(cold),
            'second_turn_ttft_s': statistics.median(second),
            'second_turn_cached_tokens': statistics.median(cached)}


def hf_model(model_dir: Path):
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device(DEV):
        model = Qwen3VLForConditionalGeneration._from_config(
            cfg, dtype=torch.bfloat16 if DEV == 'cuda' else torch.float32,
            attn_implementation='sdpa')
    init_random_(model, seed=1)
    return model.eval()


@torch.inference_mode()
def hf_decode(model, context: int, new_tokens: int) -> dict:
    """Decode tok/s of transformers ``generate``: N more tokens / extra time over 1 token."""
    vocab = 400  # inside the tiny tokenizer's vocabulary
    ids = torch.randint(0, vocab, (1, context), device=DEV,
                        generator=torch.Generator(device=DEV).manual_seed(context))
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.eos_token_id, config.pad_token_id = False, None, 0

    def run(n):
        config.max_new_tokens = config.min_new_tokens = n
        sync()
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       generation_config=config)
        sync()
        return time.perf_counter() - t0

    run(2)  # warm-up
    t1 = run(1)
    tn = run(new_tokens + 1)
    return {'tok_s': new_tokens / (tn - t1), 'ttft_s': t1}


# ------------------------------------------------------------------------------------ driver

def bench_model(size: str, args, workdir: Path) -> dict:
    model_dir = make_model_dir(size, workdir / size)
    text_cfg = load_config(model_dir).text
    if DEV == 'cuda':
        need = 2 * 2 * {'2b': 2.2e9, '4b': 4.5e9, '8b': 8.8e9}[size] + 8e9  # ours + HF, bf16
        free, _ = torch.cuda.mem_get_info()
        if free < need:
            return {'skipped': f'needs ~{need / 1e9:.0f} GB free, has {free / 1e9:.0f} GB'}
    common = {'model_path': model_dir, 'device': DEV,
              'dtype': 'bfloat16' if DEV == 'cuda' else 'float32',
              'max_model_len': max(8192, max(args.contexts) + 2 * args.decode_tokens),
              'kv_cache_memory_mb': args.kv_cache_mb, 'block_order_seed': 0}
    out = {'decode': {}}
    for graph in (True, False):
        engine = LLMEngine(EngineConfig(enable_cuda_graph=graph, **common))
        if graph:
            bpt, params = decode_bytes_per_token(engine.model)
            out.update(text_decoder_params=params, weight_bytes_per_token=bpt,
                       cuda_graph_in_use=engine.runner.decode_graph is not None)
        engine_decode(engine, min(args.contexts), 8, salt=1)  # warm-up: capture, cuBLAS
        for ctx in args.contexts:  # best of two runs (distinct prompts, no cache hits)
            runs = [engine_decode(engine, ctx, args.decode_tokens, salt=ctx + i)
                    for i in range(2)]
            entry = out['decode'].setdefault(str(ctx), {'prompt_tokens': runs[0]['prompt_tokens']})
            entry['graph_tok_s' if graph else 'eager_tok_s'] = max(r['tok_s'] for r in runs)
        if graph:
            out.update(engine_ttft(engine))
        del engine
        if DEV == 'cuda':
            torch.cuda.empty_cache()
    hf = hf_model(model_dir)
    out['transformers_prefill_ttft_s'] = {}
    for ctx in args.contexts:
        r = hf_decode(hf, ctx, args.hf_tokens)
        out['decode'][str(ctx)]['transformers_tok_s'] = r['tok_s']
        out['transformers_prefill_ttft_s'][str(ctx)] = r['ttft_s']
    del hf
    _MODELS.clear()
    if DEV == 'cuda':
        torch.cuda.empty_cache()

    bw = args.bandwidth_gbs * 1e9
    kv_tok = kv_bytes_per_token(text_cfg)
    out['bound_tok_s'] = bw / out['weight_bytes_per_token']
    for ctx, e in out['decode'].items():
        bound_kv = bw / (out['weight_bytes_per_token'] + kv_tok * int(ctx))
        e['fraction_of_bound'] = e['graph_tok_s'] / out['bound_tok_s']
        e['fraction_of_bound_incl_kv'] = e['graph_tok_s'] / bound_kv
        e['graph_vs_eager'] = e['graph_tok_s'] / e['eager_tok_s']
        e['vs_transformers'] = e['graph_tok_s'] / e['transformers_tok_s']
    out['second_turn_ttft_ratio'] = out['second_turn_ttft_s'] / out['cold_ttft_s']
    # The targets: 2B >= 50 % of the bound, 8B >= 70 %; the longest context >= 80 % of
    # the shortest's speed; graph >= 3x eager; >= 20x transformers.
    target = {'2b': 0.50, '4b': 0.50, '8b': 0.70}.get(size, 0.5)
    short = out['decode'][str(min(args.contexts))]
    longest = out['decode'][str(max(args.contexts))]
    out['long_vs_short_context'] = longest['graph_tok_s'] / short['graph_tok_s']
    out['targets'] = {
        'fraction_of_bound': target,
        'fraction_of_bound_met': short['fraction_of_bound'] >= target,
        'long_context_ge_80pct_met': out['long_vs_short_context'] >= 0.8,
        'graph_vs_eager_3x_met': all(e['graph_vs_eager'] >= 3 for e in out['decode'].values()),
        'vs_transformers_20x_met': all(e['vs_transformers'] >= 20 for e in out['decode'].values()),
        'second_turn_ttft_le_20pct_met': out['second_turn_ttft_ratio'] <= 0.2,
    }
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = {k: v for k, v in result['models'].items() if 'decode' in v}
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(6 * max(1, len(models)), 4.5),
                             squeeze=False)
    for ax, (size, m) in zip(axes[0], models.items(), strict=False):
        ctxs = list(m['decode'])
        x = np.arange(len(ctxs))
        for i, (key, label) in enumerate((('graph_tok_s', 'ours, CUDA graph'),
                                          ('eager_tok_s', 'ours, eager'),
                                          ('transformers_tok_s', 'transformers generate'))):
            ax.bar(x + (i - 1) * 0.27, [m['decode'][c][key] for c in ctxs], 0.27, label=label)
        ax.axhline(m['bound_tok_s'], color='k', ls='--', label='bandwidth bound (weights)')
        ax.set_xticks(x, [f'ctx {c}' for c in ctxs])
        ax.set_ylabel('decode tok/s (batch 1, bf16)')
        ax.set_title(f"Qwen3-VL-{size.upper()} on {result['device']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argument_parser(__doc__, contexts='128,1024,4096,16384', kv_cache_mb=4096)
    p.add_argument('--hf-tokens', type=int, default=64)
    args = p.parse_args(argv)
    global DEV
    if args.smoke:
        DEV = 'cpu'
        args.models, args.contexts = 'tiny', '40,80'
        args.decode_tokens, args.hf_tokens, args.kv_cache_mb = 6, 4, 16
    args.contexts = [int(c) for c in args.contexts.split(',')]
    if DEV == 'cuda' and not torch.cuda.is_available():
        sys.exit('gpu_decode: needs a CUDA GPU (or --smoke)')
    name, nominal, measured = device_bandwidth(args)
    cap = torch.cuda.get_device_capability() if DEV == 'cuda' else ()
    result = {'device': name, 'capability': '.'.join(map(str, cap)),
              'torch': torch.__version__, 'cuda': torch.version.cuda,
              'nominal_bandwidth_gbs': nominal, 'measured_copy_bandwidth_gbs': measured,
              'bandwidth_gbs_used': args.bandwidth_gbs, 'decode_tokens': args.decode_tokens,
              'models': {}}
    with contextlib.suppress(ImportError):
        import cupy
        import transformers
        result.update(cupy=cupy.__version__, transformers=transformers.__version__)
    run_and_write('gpu_decode', bench_model, plot, result, args)


def run_and_write(bench: str, bench_model, plot, result: dict, args) -> None:
    """Run ``bench_model(size, args, workdir)`` per model on random weights; JSON + PNG out."""
    llm_engine_module.load_model = random_load_model  # random weights, no checkpoint on disk
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.models.split(','):
            result['models'][size] = bench_model(size, args, Path(tmp))
    write_result(bench, result, plot, args.out)


def write_result(bench: str, result: dict, plot, out: Path, tag: str = '') -> None:
    """Write ``result`` as JSON (and printed) and ``plot`` it as PNG, named after the device."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f'{bench}_{tag}_' if tag else f'{bench}_'
    stem += result['device'].replace(' ', '_').replace('/', '_')
    (out / f'{stem}.json').write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    try:
        plot(result, out / f'{stem}.png')
    except ImportError as exc:  # the JSON is written; a bare GPU box may lack matplotlib
        print(f'{bench}: no PNG ({exc})', file=sys.stderr)


def argument_parser(doc: str, contexts: str, kv_cache_mb: float) -> argparse.ArgumentParser:
    """Options the decode benchmarks share (models, contexts, bandwidth, output, smoke)."""
    p = argparse.ArgumentParser(description=doc.split('\n')[0])
    p.add_argument('--models', default='2b,8b', help='comma list of 2b, 4b, 8b')
    p.add_argument('--contexts', default=contexts)
    p.add_argument('--decode-tokens', type=int, default=128)
    p.add_argument('--kv-cache-mb', type=float, default=kv_cache_mb)
    p.add_argument('--bandwidth-gbs', type=float, default=None,
                   help='peak DRAM bandwidth (default: nominal for the GPU, else measured copy)')
    p.add_argument('--out', type=Path, default=REPO / 'bench' / 'results')
    p.add_argument('--smoke', action='store_true',
                   help='check the script on the CPU with a tiny model (no measurement)')
    return p


def device_bandwidth(args) -> tuple[str, float | None, float]:
    """Name ``DEV``, measure its copy bandwidth and fill ``args.bandwidth_gbs`` if unset.

    Returns (device name, nominal GB/s or None, measured copy GB/s).
    """
    name = torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu-smoke'
    measured = copy_bandwidth_gbs(1 << 24 if DEV == 'cpu' else 1 << 30)
    nominal = nominal_bandwidth_gbs(name)
    args.bandwidth_gbs = args.bandwidth_gbs or nominal or measured
    return name, nominal, measured


if __name__ == '__main__':
    main()
