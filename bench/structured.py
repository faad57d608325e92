# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What constrained decoding costs: per-token overhead against free decoding, compile time.

On the CPU (the host builds every mask, whatever the device), for the demo checkpoint and the
mid-size random checkpoint of bench/engine_vs_reference.py (fp32):

* ``free_ms_per_token``: decode time per token of an unconstrained answer (``ignore_eos``);
* ``constrained_ms_per_token``: the same for a json_schema answer (the nested schema of
  bench/structured_libraries.py, so that answers run long);
* ``mask_ms_per_token``: the host work constrained decoding adds per token (the grammar's
  bitmask and applying it to the logits; median and p99), and its share of a free decode step
  (target <= 10 % on the mid-size checkpoint);

and at Qwen3-VL's vocabulary (151,936 logits, the locally trained byte-level BPE of
bench/structured_libraries.py): the mask per token (target <= 0.3 ms) and the compile time of
each grammar. On a GPU the decode graphs apply the mask; run with ``--device cuda`` there.

    PYTHONPATH=$PWD .venv/bin/python bench/structured.py

Prints JSON and writes ``structured_<device>.json`` / ``.png`` to ``--out`` (bench/results).
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

import engine_vs_reference as evr  # noqa: E402  (the mid-size shape)
import structured_libraries as sl  # noqa: E402  (the 151,936-token tokenizer, the grammars)

from orin_llm_node.engine import (  # noqa: E402
    EngineConfig,
    LLMEngine,
    SamplingParams,
    structured,  # noqa: E402
)
from orin_llm_node.engine import sampler as sampler_module  # noqa: E402
from orin_llm_node.testing import shapes, tiny_checkpoint  # noqa: E402

DEMO = BENCH.parent / 'orin_llm_node' / 'demo_model'
NESTED = {'type': 'json_schema', 'schema': sl.NESTED_SCHEMA}


class MaskTimer:
    """Times the host's mask work (grammar bitmask + applying it) while installed."""

    def __init__(self):
        self.seconds = []

    def __enter__(self):
        fill, apply = structured.Grammar.fill_bitmask, sampler_module.apply_bitmask
        self._saved = fill, apply
        timer = self

        def timed_fill(grammar, out):
            t0 = time.perf_counter()
            fill(grammar, out)
            timer._t = time.perf_counter() - t0

        def timed_apply(*args):
            t0 = time.perf_counter()
            out = apply(*args)
            timer.seconds.append(timer._t + time.perf_counter() - t0)
            return out

        structured.Grammar.fill_bitmask = timed_fill
        sampler_module.apply_bitmask = timed_apply
        return self

    def __exit__(self, *exc):
        structured.Grammar.fill_bitmask, sampler_module.apply_bitmask = self._saved


def per_token_ms(res) -> float:
    return 1000.0 / res.decode_tok_s if res.decode_tok_s else float('nan')


def bench_model(name, path, device, tokens, repeat):
    eng = LLMEngine(EngineConfig(model_path=path, device=device, dtype='float32'))
    eng.warmup(image_sizes=[])
    image = shapes.simple_scene('circle', 'red', 160, 200).image
    free, constrained, masks, valid = [], [], [], 0
    for _ in range(repeat):
        conv = eng.new_conversation()
        free.append(per_token_ms(eng.chat(conv, 'Describe the shelf.', images=[image],
                                          sampling=SamplingParams(max_tokens=tokens,
                                                                  ignore_eos=True))))
        eng.reset(conv)
        with MaskTimer() as timer:
            res = eng.chat(conv, 'Describe the shelf.', images=[image],
                           sampling=SamplingParams(max_tokens=tokens, response_format=NESTED))
        eng.reset(conv)
        constrained.append(per_token_ms(res))
        masks.extend(timer.seconds)
        valid += bool(res.valid)
    free_ms = statistics.median(free)
    mask_ms = statistics.median(masks) * 1e3
    return {
        'model': name, 'vocab_size': eng.model.config.text.vocab_size,
        'free_ms_per_token': round(free_ms, 3),
        'constrained_ms_per_token': round(statistics.median(constrained), 3),
        'mask_ms_per_token': round(mask_ms, 4),
        'mask_ms_p99': round(float(np.percentile(masks, 99)) * 1e3, 4),
        'mask_share_of_free_step': round(mask_ms / free_ms, 4),
        'constrained_valid': f'{valid}/{repeat}',
    }


def bench_vocabulary(out: Path):
    tok_path, tok = sl.big_tokenizer(out)
    stop = [tok.token_to_id('<|im_end|>'), tok.token_to_id('<|endoftext|>')]
    t0 = time.perf_counter()
    gt = structured.GrammarTokenizer(tok_path, sl.VOCAB, stop)
    result = {'vocab_size': sl.VOCAB, 'index_vocabulary_s': round(time.perf_counter() - t0, 3),
              'grammars': {}}
    logits = torch.randn(sl.VOCAB)
    words = np.empty(-(-sl.VOCAB // 32), dtype=np.int32)
    shifts = torch.arange(32, dtype=torch.int32)
    for name, (fmt, answer) in sl.GRAMMARS.items():
        t0 = time.perf_counter()
        grammar = gt.grammar(fmt)
        compile_s = time.perf_counter() - t0
        if fmt['type'] != 'regex':  # the engine's JSON grammars are compact (no whitespace)
            answer = json.dumps(json.loads(answer), separators=(',', ':'))
        times = []
        for walk in range(3):  # the first walk warms torch and the library's lazy states
            grammar = grammar if walk == 0 else gt.grammar(fmt)
            for token in [*tok.encode(answer).ids, stop[0]]:
                t0 = time.perf_counter()
                grammar.fill_bitmask(words)
                structured.apply_bitmask(logits, torch.from_numpy(words), shifts)
                if walk:
                    times.append(time.perf_counter() - t0)
                grammar.accept(token)
            assert grammar.complete, name
        result['grammars'][name] = {
            'compile_ms': round(compile_s * 1e3, 3),
            'mask_ms_median': round(statistics.median(times) * 1e3, 4),
            'mask_ms_p99': round(float(np.percentile(times, 99)) * 1e3, 4),
        }
    return result


def plot(result, path):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    models = result['models']
    x = np.arange(len(models))
    for i, (key, label) in enumerate((('free_ms_per_token', 'free decode'),
                                      ('constrained_ms_per_token', 'json_schema decode'),
                                      ('mask_ms_per_token', 'mask (host)'))):
        axes[0].bar(x + (i - 1) * 0.27, [m[key] for m in models], 0.27, label=label)
    axes[0].set_xticks(x, [m['model'] for m in models])
    axes[0].set_ylabel('ms per token (CPU)')
    axes[0].legend()
    grammars = result['vocabulary_151936']['grammars']
    names = list(grammars)
    axes[1].bar(np.arange(len(names)) - 0.2, [grammars[n]['mask_ms_median'] for n in names],
                0.4, label='mask median (ms)')
    axes[1].bar(np.arange(len(names)) + 0.2, [grammars[n]['mask_ms_p99'] for n in names], 0.4,
                label='mask p99 (ms)')
    axes[1].axhline(0.3, color='k', ls='--', lw=1, label='target 0.3 ms')
    axes[1].set_xticks(np.arange(len(names)), names)
    axes[1].set_title('151,936-token vocabulary')
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--tokens', type=int, default=64)
    ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--out', type=Path, default=BENCH / 'results')
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {'device': args.device, 'threads': args.threads, 'models': []}
    with tempfile.TemporaryDirectory() as tmp:
        mid = tiny_checkpoint.make_tiny_checkpoint(Path(tmp) / 'mid', text_config=evr.TEXT,
                                                   vision_config=evr.VISION)
        for name, path in (('demo', DEMO), ('mid-size', mid)):
            result['models'].append(bench_model(name, path, args.device, args.tokens,
                                                args.repeat))
    result['vocabulary_151936'] = bench_vocabulary(args.out)
    text = json.dumps(result, indent=2)
    print(text)
    (args.out / f'structured_{args.device}.json').write_text(text + '\n')
    plot(result, args.out / f'structured_{args.device}.png')


if __name__ == '__main__':
    main()
