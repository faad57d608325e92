# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Time to first token: the cold image turn, follow-ups of never-seen lengths, the vision tower.

For each model (random weights; GPU: the published 2B / 8B shapes in bf16 with CUDA graphs,
CPU: the mid-size shape of bench/engine_vs_reference.py in fp32), in one run:

* ``warmup_s``: ``LLMEngine.warmup`` for 448x448 and 640x480 frames (vision per grid, prefill
  graph capture), done once at load like the node does;
* cold turn: a 448x448 image + a ~32-token question on an empty cache (median of ``--repeat``,
  the vision tower's share reported);
* follow-ups: ten questions of lengths never asked before (each a new suffix length and a new
  context length) in the conversation of the last cold turn: median and max time to first
  token, their ratio to the cold turn, the slowest over the median (a per-shape stall shows up
  there), and for each its host/device split: host = wall time of the prefill call (launching
  work), device = CUDA-event time of the same call (GPU only);
* vision tower alone for 448x448 and 640x480 frames (median of 5 after the warm-up).

GPU (plain python3 + torch + cupy, from the repository root)::

    PYTHONPATH=$PWD python3 bench/ttft.py --models 2b,8b

CPU (a check of the script with a small shape; the figures are CPU figures)::

    PYTHONPATH=$PWD python3 bench/ttft.py --device cpu --models small

Prints JSON and writes ``ttft_<device>.json`` / ``.png`` to ``--out`` (default bench/results).
"""

import argparse
import json
from pathlib import Path
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import engine_vs_reference as evr  # noqa: E402  (the CPU shape: its mid-size model)
import gpu_decode as gd  # noqa: E402  (model set-up shared with the decode benchmark)

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
import orin_llm_node.engine.llm_engine as llm_engine_module  # noqa: E402
from orin_llm_node.engine.vision_cache import VisionCache  # noqa: E402
from orin_llm_node.testing import tiny_checkpoint  # noqa: E402

FRAMES = {'448x448': (448, 448), '640x480': (480, 640)}
# Follow-up question lengths (tokens of text): all different, so every suffix is a new shape.
FOLLOW_UPS = (9, 14, 19, 23, 28, 33, 38, 44, 51, 60)
def model_dir(size: str, out: Path) -> Path:
    if size != 'small':
        return gd.make_model_dir(size, out)
    path = tiny_checkpoint.make_tiny_checkpoint(out, text_config=evr.TEXT,
                                                vision_config=evr.VISION)
    tiny_checkpoint.write_preprocessor_config(path, min_pixels=256 * 256,
                                              max_pixels=4096 * 4096)
    return path


class PrefillTimer:
    """Wraps ``runner.prefill``: host wall time and (CUDA) device time of every call."""

    def __init__(self, runner, cuda: bool):
        self.calls = []
        self.cuda = cuda
        inner = runner.prefill

        def timed(token_ids, *args, **kwargs):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            logits = inner(token_ids, *args, **kwargs)
            host = time.perf_counter() - t0
            device = None
            if self.cuda:
                end.record()
                end.synchronize()
                device = start.elapsed_time(end) / 1e3
            self.calls.append({'tokens': len(token_ids), 'host_s': host, 'device_s': device})
            return logits

        runner.prefill = timed


def sync(device: str) -> None:
    if device == 'cuda':
        torch.cuda.synchronize()


def vision_ms(engine, device: str, reps: int = 5) -> dict:
    out = {}
    processor = engine.prompts.image_processor
    for name, (h, w) in FRAMES.items():
        rgb = np.random.default_rng(7).integers(0, 256, (h, w, 3), dtype=np.uint8)
        image = processor.preprocess(rgb)
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            engine.runner.encode_image(image.pixel_values, image.grid_thw)
            sync(device)
            times.append(time.perf_counter() - t0)
        out[name] = {'grid_thw': list(image.grid_thw), 'tokens': image.num_tokens,
                     'ms': statistics.median(times) * 1e3}
    return out


def bench_model(size: str, args, workdir: Path) -> dict:
    path = model_dir(size, workdir / size)
    dtype = 'bfloat16' if args.device == 'cuda' else 'float32'
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(model_path=path, device=args.device, dtype=dtype,
                                    max_model_len=8192, kv_cache_memory_mb=args.kv_cache_mb,
                                    block_order_seed=0))
    out = {'load_s': time.perf_counter() - t0, 'dtype': dtype,
           'cuda_graph_decode': engine.uses_cuda_graph,
           'prefill_buckets': (list(engine.runner.prefill_graphs.buckets)
                               if engine.runner.prefill_graphs else None)}
    out['warmup_s'] = engine.warmup(list(FRAMES.values()))
    timer = PrefillTimer(engine.runner, args.device == 'cuda')
    greedy = SamplingParams(max_tokens=4, ignore_eos=True)
    frame = gd.random_rgb(0, 448)

    cold, vision, conv = [], [], None
    for i in range(args.repeat):  # cold: nothing cached from earlier repeats
        engine.reset()
        engine.vision_cache = VisionCache(engine.vision_cache.max_bytes)
        engine.pool.clear_cache()
        conv = engine.new_conversation()
        res = engine.chat(conv, gd.prompt_of(engine, 32, 100 + i), [frame], greedy)
        cold.append(res.ttft_s)
        vision.append(res.vision_s)
    out['cold'] = {'prompt_tokens': len(res.prompt_token_ids),
                   'ttft_ms': statistics.median(cold) * 1e3,
                   'vision_ms': statistics.median(vision) * 1e3}

    follow = []
    for i, length in enumerate(FOLLOW_UPS):
        before = len(timer.calls)
        res = engine.chat(conv, gd.prompt_of(engine, length, 500 + i), sampling=greedy)
        call = timer.calls[before]  # the turn's own prefill (later ones: after the answer)
        follow.append({'new_tokens': len(res.prompt_token_ids) - res.cached_tokens,
                       'context': len(res.prompt_token_ids), 'ttft_ms': res.ttft_s * 1e3,
                       'prefill_host_ms': call['host_s'] * 1e3,
                       'prefill_device_ms': (None if call['device_s'] is None
                                             else call['device_s'] * 1e3)})
    ttfts = [f['ttft_ms'] for f in follow]
    p50 = statistics.median(ttfts)
    out['follow_ups'] = follow
    out['follow_up_ttft_ms'] = {'p50': p50, 'max': max(ttfts)}
    out['follow_up_vs_cold'] = p50 / out['cold']['ttft_ms']
    out['slowest_vs_median'] = max(ttfts) / p50
    out['vision_tower'] = vision_ms(engine, args.device)
    out['targets'] = {'follow_up_le_20pct_of_cold': out['follow_up_vs_cold'] <= 0.2,
                      'slowest_le_1.5x_median': out['slowest_vs_median'] <= 1.5,
                      'cold_le_30ms (2B, H100)': out['cold']['ttft_ms'] <= 30}
    del engine
    gd._MODELS.clear()
    if args.device == 'cuda':
        torch.cuda.empty_cache()
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    models = result['models']
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    names = list(models)
    x = np.arange(len(names))
    for i, (key, label) in enumerate((('cold', 'cold image turn'), ('p50', 'follow-up p50'),
                                      ('max', 'follow-up max'))):
        vals = [models[n]['cold']['ttft_ms'] if key == 'cold'
                else models[n]['follow_up_ttft_ms'][key] for n in names]
        axes[0].bar(x + (i - 1) * 0.27, vals, 0.27, label=label)
    axes[0].set_xticks(x, names)
    axes[0].set_ylabel('time to first token (ms)')
    axes[0].legend()
    for n in names:
        f = models[n]['follow_ups']
        axes[1].plot([e['new_tokens'] for e in f], [e['ttft_ms'] for e in f], 'o-', label=n)
    axes[1].set_xlabel('new tokens of the follow-up (each length seen once)')
    axes[1].set_ylabel('time to first token (ms)')
    axes[1].legend()
    for i, frame in enumerate(FRAMES):
        axes[2].bar(x + (i - 0.5) * 0.4, [models[n]['vision_tower'][frame]['ms'] for n in names],
                    0.4, label=frame)
    axes[2].set_xticks(x, names)
    axes[2].set_ylabel('vision tower (ms)')
    axes[2].legend()
    fig.suptitle(f"time to first token on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    p.add_argument('--models', default=None, help='2b,8b (GPU, default) or small (CPU)')
    p.add_argument('--repeat', type=int, default=3, help='cold turns (median)')
    p.add_argument('--kv-cache-mb', type=float, default=None)
    p.add_argument('--threads', type=int, default=1, help='CPU intra-op threads (0: default)')
    p.add_argument('--out', type=Path, default=BENCH / 'results')
    args = p.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        sys.exit('ttft: no CUDA GPU (use --device cpu)')
    if args.device == 'cpu' and args.threads > 0:
        torch.set_num_threads(args.threads)
    args.models = args.models or ('2b,8b' if args.device == 'cuda' else 'small')
    args.kv_cache_mb = args.kv_cache_mb or (4096 if args.device == 'cuda' else 64)
    gd.DEV = args.device
    if args.device == 'cuda':  # random weights built on the GPU, no checkpoint on disk
        llm_engine_module.load_model = gd.random_load_model
    name = torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'
    result = {'device': name, 'torch': torch.__version__, 'models': {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.models.split(','):
            result['models'][size] = bench_model(size, args, Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f'ttft_{args.device}'
    (args.out / f'{stem}.json').write_text(json.dumps(result, indent=2))
    try:
        plot(result, args.out / f'{stem}.png')
        result['png'] = str(args.out / f'{stem}.png')
    except ImportError as exc:  # a bare GPU box may lack matplotlib; the JSON is written
        print(f'ttft: no PNG ({exc})', file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
