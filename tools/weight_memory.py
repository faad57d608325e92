# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Weight memory per Qwen3-VL size and weight format, and what fits on each Jetson Orin.

Builds our model on the ``meta`` device (no memory) from the published configs in
``test/data/qwen3_vl_configs`` with the text decoder's projections swapped for the quantized
layers exactly as quantize-at-load does, and counts bytes: codes + scales + every float
parameter (bf16; the vision tower, embeddings, norms and lm_head stay bf16). KV per token is
bf16 K and V over all layers. Prints a Markdown table (the README's) and, with ``--json``,
the numbers.

    .venv/bin/python tools/weight_memory.py [--json out.json]
"""

import argparse
import json
from pathlib import Path
import sys

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orin_llm_node.models import config_from_dict  # noqa: E402
from orin_llm_node.models.loader import meta_model  # noqa: E402

CONFIGS = REPO / 'test' / 'data' / 'qwen3_vl_configs'
SIZES = ('2b', '4b', '8b')
FORMATS = ('none', 'int8', 'fp8', 'int4')
LABEL = {'none': 'bf16', 'int8': 'int8', 'fp8': 'fp8', 'int4': 'int4 (g128)'}
ORIN_GB = (8, 16, 32, 64)
#: Unified memory assumed taken by JetPack, the CUDA context, ROS 2 and the node's Python.
RESERVED_GB = 3.0
#: AGX Orin 64 GB DRAM bandwidth, for the decode upper bound per format.
ORIN_BW = 204.8e9


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(size: str, quantization: str) -> dict:
    """Weight bytes (text, vision, read per decode token) and KV bytes per token."""
    path = CONFIGS / f'qwen3-vl-{size}-instruct.config.json'
    cfg = config_from_dict(json.loads(path.read_text()))
    model = meta_model(CONFIGS, torch.bfloat16, quantization, cfg)   # what load_model builds
    vision = _bytes(model.visual.parameters())
    text = _bytes({id(p): p for m in (model.language_model, model.lm_head)
                   for p in m.parameters()}.values())
    text += _bytes(b for n, b in model.named_buffers()
                   if n.startswith('language_model.layers.') and 'rotary' not in n)
    embed = _bytes([model.language_model.embed_tokens.weight])
    # Decode reads one embedding row; a tied embedding is read in full as the lm_head.
    per_token = text - (0 if cfg.tie_word_embeddings else embed)
    tc = cfg.text
    kv = tc.num_hidden_layers * 2 * tc.num_key_value_heads * tc.head_dim * 2
    return {'text_bytes': text, 'vision_bytes': vision, 'decode_read_bytes': per_token,
            'kv_bytes_per_token': kv}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--json', type=Path)
    args = ap.parse_args(argv)
    rows = {(s, q): measure(s, q) for s in SIZES for q in FORMATS}
    gb = 1e9
    print('| model | weights | text decoder | + vision | AGX Orin decode bound | KV / token |'
          + ''.join(f' Orin {m} GB |' for m in ORIN_GB))
    print('|---|---|---|---|---|---|' + '---|' * len(ORIN_GB))
    for (size, q), r in rows.items():
        total = r['text_bytes'] + r['vision_bytes']
        cells = []
        for mem in ORIN_GB:
            free = (mem - RESERVED_GB) * gb - total
            cells.append(f"{int(free / r['kv_bytes_per_token'] / 1000)}k tok" if free > 0
                         else 'no')
        print(f"| {size.upper()} | {LABEL[q]} | {r['text_bytes'] / gb:.2f} GB | "
              f"{total / gb:.2f} GB | {ORIN_BW / r['decode_read_bytes']:.0f} tok/s | "
              f"{r['kv_bytes_per_token'] / 1024:.0f} KiB |" + ''.join(f' {c} |' for c in cells))
    if args.json:
        args.json.write_text(json.dumps({f'{s}-{q}': r for (s, q), r in rows.items()},
                                        indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
