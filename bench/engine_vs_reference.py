# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: our paged-KV engine against transformers' ``generate`` on the same prompt.

One mid-size random Qwen3-VL checkpoint (text hidden 512, 8 layers; reduced vision tower),
one 224x224 image + prompt, 128 greedy tokens on both sides whatever they are (no EOS ends
either answer: the random model writes one at token 127), compared token for token
(``tokens_identical``). Measured for both, each side in its own child
process (so peak RSS is its own): time to first token and decode tokens/s (medians of
``--repeat`` cold turns), peak RSS; then the second turn's time to first token with (median
over the ``--repeat`` conversations) and without our prefix cache (transformers recomputes the
whole history), and the KV bytes the engine holds
against a contiguous allocation of ``max_model_len`` tokens. Prints JSON on stdout and writes a
PNG (default ``bench/results/engine_vs_reference.png``).

    .venv/bin/python bench/engine_vs_reference.py [--device cpu|cuda] [--threads N] [--out DIR]
    .venv/bin/python bench/engine_vs_reference.py --repeat 1   # the quick run: about 2 min

On a shared CPU the figures move by tens of percent from run to run; both sides are bound by
reading the fp32 weights once per token there. Not run by CI; needs transformers (test
requirements) and matplotlib.
"""

import argparse
import copy
import json
import multiprocessing as mp
from pathlib import Path
import resource
import sys
import tempfile
import time

import numpy as np

TEXT = {
    'hidden_size': 512, 'intermediate_size': 1536, 'num_hidden_layers': 8,
    'num_attention_heads': 8, 'num_key_value_heads': 4, 'head_dim': 64,
    'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0,
                        'mrope_section': [12, 10, 10], 'mrope_interleaved': True},
}
VISION = {'depth': 4, 'hidden_size': 128, 'intermediate_size': 256, 'num_heads': 4,
          'deepstack_visual_indexes': [1, 2, 3]}
PROMPT = 'What is in front of you? Describe the image.'
FOLLOW_UP = 'And what colour is it?'
NEW_TOKENS = 128
MAX_MODEL_LEN = 8192
KV_MB = 64  # the engine's block pool: 256 blocks of 16 tokens here


def _peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)


def _sync(device):
    import torch

    if device == 'cuda':
        torch.cuda.synchronize()


def _set_threads(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


def run_ours(ckpt: str, device: str, threads: int, repeat: int, queue) -> None:
    """Child process: our engine, with and without the prefix cache."""
    _set_threads(threads)
    from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
    from orin_llm_node.engine.vision_cache import VisionCache

    out = {}
    t = time.perf_counter()
    eng = LLMEngine(EngineConfig(model_path=ckpt, device=device, max_model_len=MAX_MODEL_LEN,
                                 kv_cache_memory_mb=KV_MB))
    out['load_s'] = time.perf_counter() - t
    img = _image()
    greedy = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    warm = eng.new_conversation()
    eng.chat(warm, 'Hello.', [img], SamplingParams(max_tokens=8, ignore_eos=True))
    eng.reset(warm)
    eng.vision_cache = VisionCache(eng.vision_cache.max_bytes)
    eng.pool.clear_cache()  # a cold first turn: nothing from the warm-up is reused

    ttft, vision, decode, turn2 = [], [], [], []
    for _ in range(repeat):  # cold first turn + follow-up; the medians are reported
        eng.reset()
        eng.vision_cache = VisionCache(eng.vision_cache.max_bytes)
        eng.pool.clear_cache()
        conv = eng.new_conversation()
        r1 = eng.chat(conv, PROMPT, [img], greedy)
        ttft.append(r1.ttft_s)
        vision.append(r1.vision_s)
        decode.append(r1.decode_tok_s)
        stats = eng.stats()
        r2 = eng.chat(conv, FOLLOW_UP, sampling=SamplingParams(max_tokens=8, ignore_eos=True))
        turn2.append(r2.ttft_s)
    out['prompt_tokens'] = len(r1.prompt_token_ids)
    out['ttft_s'] = float(np.median(ttft))
    out['vision_s'] = float(np.median(vision))
    out['decode_tok_s'] = float(np.median(decode))
    out['token_ids'] = r1.token_ids
    out['kv_bytes_in_use'] = stats.used_blocks * stats.bytes_per_block
    out['kv_tokens_held'] = len(r1.prompt_token_ids) + len(r1.token_ids)
    out['turn2_prompt_tokens'] = len(r2.prompt_token_ids)
    out['turn2_cached_tokens'] = r2.cached_tokens
    out['turn2_ttft_s'] = float(np.median(turn2))
    out['turn2_prompt_token_ids'] = r2.prompt_token_ids
    out['kv_bytes_after_turn2'] = eng.stats().used_blocks * stats.bytes_per_block
    tc = eng.model.config.text
    itemsize = eng.runner.kv_cache.element_size()
    out['kv_bytes_contiguous_max_model_len'] = (
        tc.num_hidden_layers * 2 * MAX_MODEL_LEN * tc.num_key_value_heads * tc.head_dim
        * itemsize
    )
    out['block_size'] = stats.block_size
    out['bytes_per_block'] = stats.bytes_per_block
    out['dtype'] = str(eng.dtype).replace('torch.', '')
    out['kv_pool_bytes'] = eng.runner.kv_cache.numel() * itemsize
    out['peak_rss_mb'] = _peak_rss_mb()  # before the second engine below
    del eng, conv, warm

    # Same two turns without the prefix cache: turn 2 recomputes the whole history.
    eng = LLMEngine(EngineConfig(model_path=ckpt, device=device, max_model_len=MAX_MODEL_LEN,
                                 kv_cache_memory_mb=KV_MB, enable_prefix_cache=False,
                                 vision_cache_mb=0))
    warm = eng.new_conversation()
    eng.chat(warm, 'Hello.', [img], SamplingParams(max_tokens=8, ignore_eos=True))
    eng.reset(warm)
    conv = eng.new_conversation()
    eng.chat(conv, PROMPT, [img], greedy)
    r2 = eng.chat(conv, FOLLOW_UP, sampling=SamplingParams(max_tokens=8, ignore_eos=True))
    out['turn2_ttft_no_prefix_cache_s'] = r2.ttft_s
    queue.put(out)


class _Timestamps:
    """A transformers streamer that records when each generated token arrives."""

    def __init__(self):
        self.times = []
        self._prompt_seen = False

    def put(self, value):
        if not self._prompt_seen:  # the first put is the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_reference(ckpt: str, device: str, threads: int, repeat: int, prompt_ids, turn2_ids,
                  queue) -> None:
    """Child process: transformers ``generate`` on our exact prompt ids and pixels."""
    _set_threads(threads)
    import torch
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration

    dtype = torch.bfloat16 if device == 'cuda' else torch.float32
    out = {}
    t = time.perf_counter()
    model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=dtype).to(device).eval()
    proc = Qwen2VLImageProcessorPil.from_pretrained(ckpt)
    out['load_s'] = time.perf_counter() - t
    pixels = proc(images=[_image()], return_tensors='pt')
    image_id = model.config.image_token_id

    def generate(ids, n):
        ids = torch.tensor([ids], device=device)
        config = copy.deepcopy(model.generation_config)
        config.do_sample, config.max_new_tokens = False, n
        # No EOS ends the answer, as ignore_eos on our side: every run is n tokens on both.
        # An empty list, not None: generate takes a None from the checkpoint's
        # generation_config, and the random model's EOS then cut its answer short.
        config.eos_token_id, config.pad_token_id = [], 0
        stamps = _Timestamps()
        _sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            gen = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                pixel_values=pixels['pixel_values'].to(device, dtype),
                image_grid_thw=pixels['image_grid_thw'].to(device),
                mm_token_type_ids=(ids == image_id).int(), streamer=stamps,
            )
        _sync(device)
        return gen[0, ids.shape[1]:].tolist(), t0, stamps.times

    generate(prompt_ids, 8)  # warm-up
    ttft, decode = [], []
    for _ in range(repeat):
        tokens, t0, times = generate(prompt_ids, NEW_TOKENS)
        ttft.append(times[0] - t0)
        decode.append((len(times) - 1) / (times[-1] - times[0]))
    out['token_ids'] = tokens
    out['ttft_s'] = float(np.median(ttft))
    out['decode_tok_s'] = float(np.median(decode))
    _, t0, times = generate(turn2_ids, 1)
    out['turn2_ttft_s'] = times[0] - t0
    out['peak_rss_mb'] = _peak_rss_mb()
    queue.put(out)


def _child(target, *args):
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    ours, ref = result['ours'], result['reference']
    fig, axes = plt.subplots(1, 5, figsize=(20, 4))
    panels = [
        ('time to first token (ms)', ['ours', 'transformers'],
         [ours['ttft_s'] * 1e3, ref['ttft_s'] * 1e3]),
        ('decode (tokens/s)', ['ours', 'transformers'],
         [ours['decode_tok_s'], ref['decode_tok_s']]),
        ('peak RSS (MiB)', ['ours', 'transformers'],
         [ours['peak_rss_mb'], ref['peak_rss_mb']]),
        ('turn-2 time to first token (ms)', ['prefix cache', 'no prefix cache', 'transformers'],
         [ours['turn2_ttft_s'] * 1e3, ours['turn2_ttft_no_prefix_cache_s'] * 1e3,
          ref['turn2_ttft_s'] * 1e3]),
        ('KV cache (MiB)', ['in use', 'whole pool', f'contiguous {MAX_MODEL_LEN}'],
         [ours['kv_bytes_in_use'] / 2**20, ours['kv_pool_bytes'] / 2**20,
          ours['kv_bytes_contiguous_max_model_len'] / 2**20]),
    ]
    for ax, (title, labels, values) in zip(axes, panels, strict=True):
        bars = ax.bar(labels, values, color=['tab:blue', 'tab:orange', 'tab:gray'][:len(values)])
        ax.bar_label(bars, fmt='%.1f')
        ax.set_title(title)
        ax.tick_params(axis='x', labelrotation=15)
    fig.suptitle(f"engine vs transformers generate — {result['config']['device']}, "
                 f"{result['ours']['dtype']}, {NEW_TOKENS} greedy tokens, 224x224 image")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--out', default=str(Path(__file__).resolve().parent / 'results'))
    # One intra-op thread by default: on a shared CPU, OpenMP barriers of oversubscribed
    # threads cost milliseconds per op and swamp what is measured (0 = torch's default).
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--repeat', type=int, default=3, help='cold first turns per side')
    args = parser.parse_args(argv)
    from orin_llm_node.testing import make_tiny_checkpoint

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(make_tiny_checkpoint(Path(tmp) / 'mid', seed=0, text_config=TEXT,
                                        vision_config=VISION))
        ours = _child(run_ours, ckpt, args.device, args.threads, args.repeat)
        ref = _child(run_reference, ckpt, args.device, args.threads, args.repeat,
                     ours['turn2_prompt_token_ids'][:ours['prompt_tokens']],
                     ours['turn2_prompt_token_ids'])
    same = ours['token_ids'] == ref['token_ids']
    for side in (ours, ref):
        side.pop('token_ids')
    ours.pop('turn2_prompt_token_ids')
    result = {
        'config': {'device': args.device, 'text': TEXT, 'vision': VISION,
                   'new_tokens': NEW_TOKENS, 'max_model_len': MAX_MODEL_LEN,
                   'image': '224x224', 'cpu_threads': args.threads,
                   'repeat': args.repeat},
        'ours': ours,
        'reference': ref,
        'tokens_identical': same,
        'speedup': {
            'ttft': ref['ttft_s'] / ours['ttft_s'],
            'decode': ours['decode_tok_s'] / ref['decode_tok_s'],
            'turn2_ttft_vs_cold_turn': ours['turn2_ttft_s'] / ours['ttft_s'],
            'turn2_ttft_prefix_cache_vs_none': (
                ours['turn2_ttft_s'] / ours['turn2_ttft_no_prefix_cache_s']),
        },
        'kv_in_use_vs_contiguous': (
            ours['kv_bytes_in_use'] / ours['kv_bytes_contiguous_max_model_len']),
    }
    png = out_dir / 'engine_vs_reference.png'
    plot(result, png)
    result['png'] = str(png)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == '__main__':
    sys.exit(main())
