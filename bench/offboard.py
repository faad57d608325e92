# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What answering over HTTP costs: local engine vs orin_llm_serve on loopback (vs vLLM).

The same checkpoint three ways, seen from the caller as the node sees its backend:

* ``local``: ``LLMEngine.chat_stream`` in this process;
* ``serve``: ``OpenAIBackend`` -> orin_llm_serve (started here on 127.0.0.1, same checkpoint);
* ``vllm``: ``OpenAIBackend`` -> a vLLM server you started (``--vllm-url``, ``--vllm-model``);
  left out without it.

Each round is a new conversation: a question with a camera frame (``first``), then a
follow-up question (``follow``: its history comes from the prefix cache). Per answer: time to
the first text (TTFT, from the call), decode tokens/s from it to the end of the answer and
the whole time of both answers (``ignore_eos`` answers of ``--tokens`` tokens, so all sides
decode the same count). The targets take turns in a rotated
order each round (interleaved, so a load change on a shared machine hits them alike); the JSON
gives median, min and max per target and the per-round ratio to ``local``, and the
conditions (CPU, cores, load average before and after).

    PYTHONPATH=$PWD .venv/bin/python bench/offboard.py --rounds 7

Prints JSON and writes ``offboard_<device>.json`` / ``.png`` to ``--out`` (bench/results).
"""

import argparse
import json
import os
from pathlib import Path
import platform
import statistics
import sys
import time

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / 'test'))

from serve_support import Server  # noqa: E402  (orin_llm_serve as a process on loopback)

from orin_llm_node.backends import OpenAIBackend, OpenAIConfig  # noqa: E402
from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from orin_llm_node.testing import shapes  # noqa: E402

DEMO = BENCH.parent / 'orin_llm_node' / 'demo_model'
QUESTIONS = ('What is in front of you?', 'And what colour is it?')


def timed_answer(target, conv, text, images, tokens):
    """(ttft_s, decode tok/s, answer_s) of one answer, measured from the call as a node would.

    Decode tok/s counts from the first text to the end of the answer: a server's chunks may
    arrive in bursts, so the time between two chunks says little.
    """
    t0 = time.perf_counter()
    first = None
    count = 0
    sampling = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for event in target.chat_stream(conv, text, images=images, sampling=sampling):
        if event.delta and first is None:
            first = time.perf_counter()
        if event.result is not None:
            assert not event.result.error, event.result.error
            count = len(event.result.token_ids or ()) or event.result.completion_tokens
    end = time.perf_counter()
    first = first or end
    return first - t0, (count - 1) / (end - first) if end > first else float('nan'), end - t0


def summary(values):
    return {'median': round(statistics.median(values), 5), 'min': round(min(values), 5),
            'max': round(max(values), 5), 'n': len(values)}


def conditions():
    load = os.getloadavg()
    return {'cpu': platform.processor() or platform.machine(), 'cores': os.cpu_count(),
            'torch_threads': torch.get_num_threads(), 'loadavg_1m': round(load[0], 2)}


def run(args):
    torch.set_num_threads(args.threads)
    path = Path(args.model_path) if args.model_path else DEMO
    targets = {'local': LLMEngine(EngineConfig(model_path=path, device=args.device,
                                               dtype='float32'))}
    targets['local'].warmup(image_sizes=[(240, 320)])
    server = Server(path, args.out / 'offboard_serve.log', '--device', args.device,
                    env={'OMP_NUM_THREADS': str(args.threads)}).start()
    targets['serve'] = OpenAIBackend(OpenAIConfig(server.url, path.name,
                                                  processor_path=str(path)))
    if args.vllm_url:
        targets['vllm'] = OpenAIBackend(OpenAIConfig(args.vllm_url, args.vllm_model,
                                                     processor_path=str(path)))
    image = shapes.simple_scene('circle', 'red', height=240, width=320).image
    names = list(targets)
    rows = {name: {'first_ttft_s': [], 'follow_ttft_s': [], 'decode_tok_s': [], 'answer_s': []}
            for name in names}
    before = conditions()
    try:
        for name in names:       # one untimed round each: first-call costs out of the way
            conv = targets[name].new_conversation()
            timed_answer(targets[name], conv, 'Hi', [image], 4)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                target = targets[name]
                conv = target.new_conversation('You are a robot.')
                ttft1, rate1, whole1 = timed_answer(target, conv, f'{QUESTIONS[0]} ({r})',
                                                    [image], args.tokens)
                ttft2, rate2, whole2 = timed_answer(target, conv, QUESTIONS[1], [], args.tokens)
                target.reset(conv)
                rows[name]['first_ttft_s'].append(ttft1)
                rows[name]['follow_ttft_s'].append(ttft2)
                rows[name]['decode_tok_s'].append(statistics.mean([rate1, rate2]))
                rows[name]['answer_s'].append(whole1 + whole2)
    finally:
        server.stop()
    result = {'checkpoint': path.name, 'device': args.device, 'tokens': args.tokens,
              'rounds': args.rounds, 'conditions_before': before,
              'conditions_after': conditions(), 'targets': {}}
    for name in names:
        entry = {metric: summary(values) for metric, values in rows[name].items()}
        if name != 'local':
            entry['ratio_to_local'] = {
                metric: summary([a / b for a, b in zip(values, rows['local'][metric],
                                                        strict=True)])
                for metric, values in rows[name].items()}
        result['targets'][name] = entry
    return result, rows


def plot(rows, out_png):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    metrics = ('first_ttft_s', 'follow_ttft_s', 'decode_tok_s', 'answer_s')
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    for ax, metric in zip(axes, metrics, strict=True):
        ax.boxplot([rows[n][metric] for n in rows], tick_labels=list(rows))
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    fig.suptitle('local engine vs OpenAI API on loopback (same checkpoint, interleaved)')
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model-path', default='', help='checkpoint (default: the demo)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--tokens', type=int, default=64)
    p.add_argument('--rounds', type=int, default=7)
    # One torch thread per process: on a shared CPU, more threads than free cores thrash
    # (the demo checkpoint decodes ~10x slower with 2 threads on 2 busy cores).
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--vllm-url', default='', help='e.g. http://127.0.0.1:8000/v1')
    p.add_argument('--vllm-model', default='', help='the model name vLLM serves')
    p.add_argument('--out', type=Path, default=BENCH / 'results')
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result, rows = run(args)
    stem = args.out / f'offboard_{args.device}'
    stem.with_suffix('.json').write_text(json.dumps(result, indent=2))
    plot(rows, stem.with_suffix('.png'))
    print(json.dumps(result, indent=2))


if __name__ == '__main__':
    main()
