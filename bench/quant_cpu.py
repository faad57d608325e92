# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Quantized weights on the CPU against float: decode, TTFT, start-up, bytes (issue 21, item 11).

For each checkpoint (the embedded demo checkpoint and a mid-size random one made by
``make_tiny_checkpoint``: hidden 1024, MLP 3072, 8 layers, the tiny tokenizer's vocabulary),
side by side in one run, float32 against every ``quantization`` format:

* ``startup_s``: what the node does before it says ``ready`` -- ``LLMEngine(...)`` (load,
  quantize at load) plus ``LLMEngine.warmup`` (vision grids, one throw-away turn); best of
  ``--startup-repeats``;
* ``decode_tok_s``: a ~40-token text prompt, ``--decode-tokens`` greedy tokens
  (``ignore_eos``), the engine's own ``decode_tok_s``; best of ``--repeats``;
* ``ttft_s``: time to first token of the same prompt (prefill), best of ``--repeats``;
* ``weight_bytes`` (``LLMEngine.weight_bytes``) and ``cpu_scratch_bytes``: the dequantise
  scratch the CPU path holds after decoding (``quantization.scratch.held_bytes``; absent on
  code that has none);
* ratios to float (``x_float``: decode and TTFT as float's speed over the format's, start-up
  as the format's time over float's -- all "how many times slower", the issue's limit is 1.5).

The rounds interleave the formats (float, int8, ..., float, int8, ...) so that a burst of load
from other processes does not land on one format only; each figure is the best of its rounds.

``--layers`` adds a per-layer comparison on the mid-size shapes (one decode row, fp32): float
``F.linear``, the layer's own CPU path, dequantise-then-``F.linear`` with a fresh full-size
weight (the path before issue 21), and torch's packed CPU kernels where a format maps onto
one (``_weight_int8pack_mm`` for per-channel int8, ``_weight_int4pack_mm_for_cpu`` for int4;
none exists for e4m3 codes), each with its ``max|diff|`` against dequantise + ``F.linear``.

Run from the repository root (PYTHONPATH points at the code to measure, e.g. an export of
another commit for a before/after)::

    PYTHONPATH=$PWD python bench/quant_cpu.py --layers
    PYTHONPATH=/tmp/main python bench/quant_cpu.py --tag before --out /tmp/before
    PYTHONPATH=$PWD python bench/quant_cpu.py --before /tmp/before/quant_cpu_before.json

Prints JSON and writes ``quant_cpu[_TAG].json`` / ``.png`` to ``--out`` (default
bench/results); ``--before`` puts another run's figures beside these in the JSON and the PNG.
"""

import argparse
import json
from pathlib import Path
import sys
import tempfile
import time

import torch

from orin_llm_node import package_files
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.testing import make_tiny_checkpoint

FORMATS = ("none", "int8", "int4", "int4_asym", "fp8")
MID_TEXT = {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "mrope_section": [12, 10, 10], "mrope_interleaved": True},
}
PROMPT = ("Describe what a mobile robot should check before it drives through a door, "
          "and say which sensor tells it most about the floor ahead of it.")
LIMIT = 1.5  # issue 21: quantized no slower than 1.5x float (decode and start-up)


def engine_config(model_dir: Path, fmt: str) -> EngineConfig:
    return EngineConfig(model_path=model_dir, device="cpu", dtype="float32", quantization=fmt,
                        max_model_len=1024, kv_cache_memory_mb=32, block_order_seed=0)


def start(model_dir: Path, fmt: str) -> tuple[LLMEngine, float]:
    """The node's start-up: load (+ quantize) and warm up; returns the engine and seconds."""
    t0 = time.perf_counter()
    engine = LLMEngine(engine_config(model_dir, fmt))
    engine.warmup()
    return engine, time.perf_counter() - t0


def scratch_bytes() -> int | None:
    """Bytes of the CPU dequantise scratch held now (None where the code has none)."""
    try:
        from orin_llm_node.quantization import scratch
    except ImportError:
        return None
    return scratch.held_bytes()


def one_turn(engine: LLMEngine, tokens: int) -> dict:
    conv = engine.new_conversation(system_prompt=None)
    res = engine.chat(conv, PROMPT, sampling=SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.reset(conv)
    return {"decode_tok_s": res.decode_tok_s, "ttft_s": res.ttft_s,
            "prompt_tokens": len(res.prompt_token_ids), "new_tokens": len(res.token_ids)}


def bench_model(name: str, model_dir: Path, args) -> dict:
    startup = {f: [] for f in args.formats}
    engines = {}
    for _ in range(args.startup_repeats):
        for fmt in args.formats:
            engines.pop(fmt, None)
            engines[fmt], seconds = start(model_dir, fmt)
            startup[fmt].append(seconds)
    turns = {f: [] for f in args.formats}
    for _ in range(args.repeats):
        for fmt in args.formats:
            turns[fmt].append(one_turn(engines[fmt], args.decode_tokens))
    out = {}
    for fmt in args.formats:
        eng = engines[fmt]
        out[fmt] = {
            "weight_format": eng.weight_format, "weight_bytes": eng.weight_bytes,
            "startup_s": min(startup[fmt]), "startup_runs_s": startup[fmt],
            "decode_tok_s": max(t["decode_tok_s"] for t in turns[fmt]),
            "ttft_s": min(t["ttft_s"] for t in turns[fmt]),
            "prompt_tokens": turns[fmt][0]["prompt_tokens"],
            "new_tokens": turns[fmt][0]["new_tokens"],
        }
        print(name, fmt, json.dumps(out[fmt]), flush=True)
    out_scratch = scratch_bytes()
    if "none" in out:
        flt = out["none"]
        for r in out.values():
            r["decode_x_float"] = flt["decode_tok_s"] / r["decode_tok_s"]
            r["ttft_x_float"] = r["ttft_s"] / flt["ttft_s"]
            r["startup_x_float"] = r["startup_s"] / flt["startup_s"]
            r["weight_bytes_x_float"] = r["weight_bytes"] / flt["weight_bytes"]
            r["within_limit"] = (r["decode_x_float"] <= LIMIT and r["startup_x_float"] <= LIMIT)
    return {"formats": out, "cpu_scratch_bytes": out_scratch}


def time_call(fn, reps: int = 20, rounds: int = 7) -> float:
    """Best mean seconds per call over ``rounds`` rounds of ``reps`` calls (after a warm-up)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def packed_kernel(layer):
    """Torch's packed CPU kernel for ``layer`` as ``x -> y``, or None where none fits."""
    if layer.format == "int8" and layer.num_groups == 1:
        scales = layer.scale[:, 0].contiguous()
        return lambda x: torch.ops.aten._weight_int8pack_mm(x, layer.qweight, scales)
    if layer.format == "int4" and layer.in_features % layer.group_size == 0:
        from orin_llm_node.quantization.int4 import unpack_int4

        u = unpack_int4(layer.qweight, layer.in_features).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
        # Their dequantisation: (u - 8) * scale + zero, per group, zero a float offset.
        zero = (torch.zeros_like(layer.scale) if layer.zero is None
                else (8.0 - layer.zero.float()) * layer.scale)
        sz = torch.stack([layer.scale.t(), zero.t()], -1).contiguous()
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed, layer.group_size, sz)
    return None


def layer_row(k: int, n: int, gen: torch.Generator) -> dict:
    """One projection shape: float, each format's own path, the old path, packed kernels."""
    import torch.nn.functional as F

    from orin_llm_node.quantization import AT_LOAD_FORMATS

    w = torch.randn(n, k, generator=gen) * 0.02
    x = torch.randn(1, k, generator=gen)
    row = {"float_linear_us": time_call(lambda: F.linear(x, w)) * 1e6}
    for fmt, (cls, asym) in AT_LOAD_FORMATS.items():
        layer = cls(k, n, group_size=cls.at_load_group or k, asymmetric=asym)
        layer.quantize_from(w)
        ref = F.linear(x, layer.dequantize())
        entry = {
            "layer_forward_us": time_call(lambda layer=layer: layer(x)) * 1e6,
            "layer_forward_max_diff": (layer(x) - ref).abs().max().item(),
            "fresh_dequantize_linear_us":
                time_call(lambda layer=layer: F.linear(x, layer.dequantize())) * 1e6,
        }
        kernel = packed_kernel(layer)
        if kernel is not None:
            try:
                entry["packed_kernel_us"] = time_call(lambda kernel=kernel: kernel(x)) * 1e6
                entry["packed_kernel_max_diff"] = (kernel(x) - ref).abs().max().item()
            except RuntimeError as e:  # a torch build without the kernel
                entry["packed_kernel_error"] = str(e).splitlines()[0]
        row[fmt] = entry
    return row


def bench_layers() -> dict:
    """Per-layer decode (one row, fp32) on the mid-size model's projection shapes."""
    h, inter = MID_TEXT["hidden_size"], MID_TEXT["intermediate_size"]
    qkv = (MID_TEXT["num_attention_heads"] + 2 * MID_TEXT["num_key_value_heads"]) * \
        MID_TEXT["head_dim"]
    shapes = {"qkv_proj": (h, qkv), "gate_up_proj": (h, 2 * inter), "down_proj": (inter, h)}
    gen = torch.Generator().manual_seed(0)
    result = {}
    for name, (k, n) in shapes.items():
        result[f"{name} [{n}x{k}]"] = row = layer_row(k, n, gen)
        print("layer", name, json.dumps(row), flush=True)
    return result


def plot(result: dict, path: Path, before: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("decode_tok_s", "decode tok/s (higher is better)"),
               ("ttft_s", "TTFT s (lower is better)"),
               ("startup_s", "start-up s (lower is better)"),
               ("weight_bytes", "weight MB")]
    models = result["models"]
    fig, axes = plt.subplots(len(models), len(metrics), figsize=(4.2 * len(metrics),
                                                                  3.4 * len(models)),
                             squeeze=False)
    for row, (model, m) in zip(axes, models.items(), strict=True):
        fmts = list(m["formats"])
        xs = range(len(fmts))
        for ax, (key, label) in zip(row, metrics, strict=True):
            scale = 1e-6 if key == "weight_bytes" else 1.0
            now = [m["formats"][f][key] * scale for f in fmts]
            if before and model in before["models"]:
                was = [before["models"][model]["formats"].get(f, {}).get(key, 0) * scale
                       for f in fmts]
                ax.bar([i - 0.2 for i in xs], was, 0.4, label="before", color="tab:gray")
                ax.bar([i + 0.2 for i in xs], now, 0.4, label="after", color="tab:blue")
                ax.legend(fontsize=7)
            else:
                ax.bar(list(xs), now, 0.6, color="tab:blue")
            ax.set_xticks(list(xs), fmts, fontsize=8)
            ax.set_title(f"{model}: {label}", fontsize=9)
    fig.suptitle(f"quantized vs float on the CPU ({result['device']}, "
                 f"{result['threads']} threads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", default="demo,mid", help="comma list of demo, mid")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--decode-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3, help="decode/TTFT rounds (best kept)")
    p.add_argument("--startup-repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--layers", action="store_true", help="add the per-layer comparison")
    p.add_argument("--tag", default="", help="suffix of the output file names")
    p.add_argument("--before", type=Path, default=None, help="another run's JSON to compare")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    args.formats = args.formats.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    import platform

    result = {"device": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "decode_tokens": args.decode_tokens, "limit_x_float": LIMIT, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            if model == "demo":
                model_dir = package_files.DEMO_MODEL_DIR
            elif model == "mid":
                model_dir = make_tiny_checkpoint(Path(tmp) / "mid", seed=0, text_config=MID_TEXT)
            else:
                sys.exit(f"unknown model {model!r} (demo, mid)")
            result["models"][model] = bench_model(model, model_dir, args)
    if args.layers:
        result["layers"] = bench_layers()
    before = json.loads(args.before.read_text()) if args.before else None
    if before:
        result["before"] = {m: {f: {k: r.get(k) for k in ("decode_tok_s", "ttft_s", "startup_s",
                                                          "decode_x_float", "startup_x_float")}
                                for f, r in v["formats"].items()}
                            for m, v in before["models"].items()}
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "quant_cpu" + (f"_{args.tag}" if args.tag else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / f"{stem}.png", before)
    return result


if __name__ == "__main__":
    main()
