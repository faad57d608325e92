# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Train the embedded demo checkpoint: a tiny Qwen3-VL that answers questions about shapes.

Never run by CI. A seeded CPU run on 2 threads (defaults: 400 vision warm-up steps, then 880
joint steps; see the README for the measured time) that writes a complete Hugging Face
checkpoint directory (default ``orin_llm_node/demo_model/``):

* a byte-level BPE tokenizer trained on the question/answer corpus of
  ``orin_llm_node.testing.shapes`` (Qwen special tokens appended, so answers are 2 tokens plus
  ``<|im_end|>``), the Qwen3-VL chat template, the processor config (every image resized to
  about 160x160 pixels: 16-30 image tokens), the generation config;
* ``model.safetensors``: transformers' ``Qwen3VLForConditionalGeneration`` built from our
  ``config.json`` and trained with AdamW on the answer tokens, plus an auxiliary per-image-token
  loss on the vision tower (`cell_targets`; its head is thrown away, the checkpoint is a plain
  Qwen3-VL). The vision tower first trains alone on that loss (``--vision-steps``): shapes at
  random positions, sizes and backgrounds are what a from-scratch ViT learns slowest.

Training inputs are built exactly as inference builds them: the checkpoint's chat template
rendered over the whole conversation (history answers followed by ``<|im_end|>\n``), each
``<|image_pad|>`` expanded to the image's token count, pixel patches from transformers'
``Qwen2VLImageProcessorPil`` loaded from the checkpoint directory.

    .venv/bin/python tools/train_demo_model.py [--out DIR] [--steps N] [--vision-steps N]
"""

import argparse
import json
import math
from pathlib import Path
import shutil
import sys
import tempfile
import time

import numpy as np
from safetensors.torch import save_file
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orin_llm_node.testing import shapes  # noqa: E402
from orin_llm_node.testing.tiny_checkpoint import (  # noqa: E402
    build_config,
    tensor_shapes,
    train_tokenizer,
    write_generation_config,
    write_preprocessor_config,
    write_tokenizer_files,
)

DEFAULT_OUT = REPO / 'orin_llm_node' / 'demo_model'
# Every image is resized to about 160 x 160 pixels (16-30 image tokens): small camera frames are
# scaled up so that even a 64 px image shows its shapes over several 16 px patches.
MIN_PIXELS, MAX_PIXELS = 160 * 160, 160 * 160
TEXT_CONFIG = {
    'hidden_size': 128, 'intermediate_size': 384, 'num_hidden_layers': 4,
    'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 32,
    'max_position_embeddings': 2048,
    'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0,
                        'mrope_section': [6, 5, 5], 'mrope_interleaved': True},
}
PATCH = 16
VISION_CONFIG = {
    'patch_size': PATCH, 'depth': 4, 'hidden_size': 96, 'intermediate_size': 384, 'num_heads': 6,
    'num_position_embeddings': 256, 'deepstack_visual_indexes': [1, 2],
}


def write_checkpoint_files(out: Path) -> dict:
    """Write everything but the weights into `out`; return the config dict."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(shapes.corpus(), vocab_size=512)
    special_ids = write_tokenizer_files(out, tokenizer)
    cfg = build_config(special_ids, tokenizer.get_vocab_size(), TEXT_CONFIG, VISION_CONFIG)
    (out / 'config.json').write_text(json.dumps(cfg, indent=2))
    write_generation_config(out, special_ids)
    write_preprocessor_config(out, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                              patch_size=PATCH)
    return cfg


class Encoder:
    """Turns shapes conversations into model inputs, the way inference builds them."""

    def __init__(self, ckpt: Path):
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        self.hf_tok = AutoTokenizer.from_pretrained(str(ckpt))
        self.tok = Tokenizer.from_file(str(ckpt / 'tokenizer.json'))
        self.proc = Qwen2VLImageProcessorPil.from_pretrained(str(ckpt))
        cfg = json.loads((ckpt / 'config.json').read_text())
        self.image_id = cfg['image_token_id']
        self.im_end = self.tok.token_to_id('<|im_end|>')
        self.im_start = self.tok.token_to_id('<|im_start|>')

    def render(self, messages, add_generation_prompt):
        """Render HF-style messages with the checkpoint's chat template."""
        return self.hf_tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode_text(self, text):
        """Token ids of `text` (special tokens recognised, nothing added)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def images(self, images):
        """Pixel patches [P, C*T*p*p] and grid [n, 3] of a list of RGB arrays."""
        out = self.proc(images=list(images), return_tensors='pt')
        return out['pixel_values'], out['image_grid_thw']

    def messages(self, turns, system=None, answers=None):
        """HF messages for `turns`; answers of all but the last turn come from `answers`."""
        msgs = [{'role': 'system', 'content': system}] if system else []
        for i, t in enumerate(turns):
            content = [{'type': 'image'}] if t.image is not None else []
            msgs.append({'role': 'user',
                         'content': content + [{'type': 'text', 'text': t.question}]})
            if i < len(turns) - 1:
                msgs.append({'role': 'assistant',
                             'content': t.answer if answers is None else answers[i]})
        return msgs

    def expand(self, ids, grids, labels=None):
        """Expand each image pad to its token count (labels get -100 there)."""
        merge = self.proc.merge_size
        counts = iter([int(g.prod()) // merge ** 2 for g in grids])
        out_ids, out_labels = [], []
        for j, tid in enumerate(ids):
            n = next(counts) if tid == self.image_id else 1
            out_ids += [tid] * n
            out_labels += [labels[j] if labels is not None else -100] * n
        return out_ids, out_labels

    def training_example(self, turns, system=None):
        """(input_ids, labels, pixels, grids, aux): labels are the answers' tokens and <|im_end|>.

        `aux` holds the per-image-token targets of the auxiliary vision loss (see `cell_targets`).
        """
        full = self.messages(turns, system) + [{'role': 'assistant',
                                                'content': turns[-1].answer}]
        ids = self.encode_text(self.render(full, add_generation_prompt=False))
        labels = [-100] * len(ids)
        # Each answer follows "<|im_start|>assistant\n" and ends with its <|im_end|>.
        head = [self.im_start] + self.encode_text('assistant\n')
        starts = [i + len(head) for i in range(len(ids)) if ids[i:i + len(head)] == head]
        if len(starts) != len(turns):
            raise RuntimeError('unexpected rendering of the conversation')
        for s, t in zip(starts, turns, strict=True):
            target = self.encode_text(t.answer) + [self.im_end]
            if ids[s:s + len(target)] != target:
                raise RuntimeError(f'answer {t.answer!r} is not where the template put it')
            labels[s:s + len(target)] = target
        pixels, grids, aux = self.scene_inputs([t.scene for t in turns if t.scene is not None])
        ids, labels = self.expand(ids, grids if grids is not None else [], labels)
        return ids, labels, pixels, grids, aux

    def scene_inputs(self, scenes):
        """Pixel patches, grids and auxiliary targets (`cell_targets`) of a list of scenes."""
        if not scenes:
            return None, None, np.zeros((0, 3), np.int64)
        pixels, grids = self.images([s.image for s in scenes])
        aux = np.concatenate([cell_targets(s, g, self.proc.merge_size)
                              for s, g in zip(scenes, grids, strict=True)])
        return pixels, grids, aux


# Auxiliary vision targets. Every image token (one merged 2 x 2 patch cell) is classified by a
# throw-away linear head on the vision merger's output: the shape kind and colour covering the
# cell (0 = background) and whether a shape's centre lies in it. This dense signal teaches the
# vision tower in minutes what the one-token answers alone teach it only slowly; the language
# model then learns to read the answers off these features. The head is not saved: the
# checkpoint is a plain Qwen3-VL.
AUX_CLASSES = (1 + len(shapes.SHAPES), 1 + len(shapes.COLOURS), 2)
MIN_COVER = 0.15  # fraction of a cell a shape must cover to name the cell


def cell_targets(scene, grid, merge: int) -> np.ndarray:
    """[cells, 3] int64 (kind, colour, centre) targets of one image's tokens, row-major."""
    _, gh, gw = (int(v) for v in grid)
    ch, cw = gh // merge, gw // merge
    height, width = scene.image.shape[:2]
    index = shapes.shape_index_map(height, width, scene.shapes).astype(np.int64)
    # Cell of every original pixel (the processor resizes the whole image onto the grid).
    cy = (np.arange(height) * ch) // height
    cx = (np.arange(width) * cw) // width
    cell = cy[:, None] * cw + cx[None, :]
    n = len(scene.shapes) + 1
    counts = np.bincount((cell * n + index).ravel(), minlength=ch * cw * n).reshape(-1, n)
    area = counts.sum(axis=1)
    best = counts[:, 1:].argmax(axis=1)
    covered = counts[np.arange(len(best)), best + 1] >= MIN_COVER * area
    kinds = np.array([1 + shapes.SHAPES.index(s.kind) for s in scene.shapes])
    colours = np.array([1 + list(shapes.COLOURS).index(s.colour) for s in scene.shapes])
    out = np.zeros((ch * cw, 3), np.int64)
    out[:, 0] = np.where(covered, kinds[best], 0)
    out[:, 1] = np.where(covered, colours[best], 0)
    for s in scene.shapes:
        r = min(int(s.cy * ch / height), ch - 1)
        c = min(int(s.cx * cw / width), cw - 1)
        out[r * cw + c, 2] = 1
    return out


def collate(examples, pad_id, image_id):
    """Right-padded batch for Qwen3VLForConditionalGeneration."""
    width = max(len(e[0]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for b, (i, lab, *_) in enumerate(examples):
        ids[b, :len(i)] = torch.tensor(i)
        labels[b, :len(lab)] = torch.tensor(lab)
        mask[b, :len(i)] = 1
    batch = {'input_ids': ids, 'attention_mask': mask, 'labels': labels,
             'mm_token_type_ids': (ids == image_id).long() * mask}
    pix = [e[2] for e in examples if e[2] is not None]
    if pix:
        batch['pixel_values'] = torch.cat(pix)
        batch['image_grid_thw'] = torch.cat([e[3] for e in examples if e[3] is not None])
    aux = torch.from_numpy(np.concatenate([e[4] for e in examples]))
    return batch, aux


def aux_loss_and_accuracy(aux_head, tokens, targets):
    """Summed cross-entropy of the auxiliary heads and (kind, colour, centre) accuracies.

    Kind and colour accuracy are taken over the cells a shape covers, centre accuracy over the
    cells holding a centre: the cells that carry the answers.
    """
    logits = aux_head(tokens).split(AUX_CLASSES, dim=-1)
    if logits[0].shape[0] != targets.shape[0]:
        raise RuntimeError('image tokens and auxiliary targets are out of step')
    loss = sum(torch.nn.functional.cross_entropy(lg, targets[:, i])
               for i, lg in enumerate(logits))
    with torch.no_grad():
        acc = []
        for i, lg in enumerate(logits):
            sel = targets[:, i] > 0
            hit = lg.argmax(-1)[sel] == targets[sel, i]
            acc.append(hit.float().mean().item() if sel.any() else float('nan'))
    return loss, acc


# Training leans on counting several shapes, the slowest skill (colour is learnt first, shapes
# next; counting one shape is trivial): a new image is asked about its colour, shape or count
# with TRAIN_MIX, and a counted image holds 1, 2 or 3 shapes with TRAIN_COUNT_SHAPES.
TRAIN_MIX = (0.15, 0.4, 0.45)
TRAIN_COUNT_SHAPES = (0.2, 0.4, 0.4)


def vision_batch(enc, rng, size):
    """Pixels, grids and auxiliary targets of `size` random scenes (vision warm-up)."""
    pixels, grids, targets = enc.scene_inputs([shapes.random_scene(rng) for _ in range(size)])
    return pixels, grids, torch.from_numpy(targets)


def random_example(enc, rng):
    """One random training conversation (up to 4 turns: several questions per image), encoded."""
    turns = shapes.random_conversation(rng, max_turns=4, mix=TRAIN_MIX,
                                       count_shapes=TRAIN_COUNT_SHAPES)
    system = None
    if rng.random() < 0.3:
        system = str(rng.choice(shapes.SYSTEM_PROMPTS))
    return enc.training_example(turns, system)


def save_weights(model, cfg, out: Path):
    """Save the state dict under the checkpoint tensor names (fp32 safetensors)."""
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if cfg['tie_word_embeddings']:
        state.pop('lm_head.weight', None)
    expected = tensor_shapes(cfg)
    if set(state) != set(expected):
        raise RuntimeError(f'tensor names differ: {sorted(set(state) ^ set(expected))[:5]}')
    for k, shape in expected.items():
        if tuple(state[k].shape) != tuple(shape):
            raise RuntimeError(f'{k}: shape {tuple(state[k].shape)} != {shape}')
    save_file(state, str(out / 'model.safetensors'), metadata={'format': 'pt'})


@torch.no_grad()
def greedy_answer(model, enc, turns, system=None, answers=None, max_new_tokens=8):
    """Greedy answer of a transformers model to the last turn: (text, prompt token ids).

    History answers come from `answers`, or from `turns` when None (see `Encoder.messages`).
    """
    msgs = enc.messages(turns, system, answers)
    ids = enc.encode_text(enc.render(msgs, add_generation_prompt=True))
    images = [t.image for t in turns if t.image is not None]
    pixels, grids = enc.images(images) if images else (None, None)
    ids, _ = enc.expand(ids, grids if grids is not None else [])
    x = torch.tensor([ids])
    kwargs = {'mm_token_type_ids': (x == enc.image_id).long()}
    if pixels is not None:
        kwargs.update(pixel_values=pixels, image_grid_thw=grids)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                         do_sample=False, **kwargs)
    return enc.tok.decode(out[0, x.shape[1]:].tolist(), skip_special_tokens=True), ids


def quick_eval(model, enc, seed, per_kind=40):
    """Accuracy of single-turn colour/shape/count questions and 2-turn follow-ups."""
    rng = np.random.default_rng(seed)
    model.eval()
    acc = {}
    for kind in ('colour', 'shape', 'count', 'follow_up'):
        ok = 0
        for _ in range(per_kind):
            if kind == 'follow_up':
                scene = shapes.random_scene(rng, num_shapes=1)
                first, second = ('shape', 'colour') if rng.random() < 0.5 else ('colour', 'shape')
                turns = [shapes.Turn(shapes.QUESTIONS[first][0], scene,
                                     shapes.answer(first, scene), first),
                         shapes.Turn(shapes.FOLLOW_UPS[second][0], None,
                                     shapes.answer(second, scene), second)]
            else:
                scene = shapes.random_scene(rng, num_shapes=None if kind == 'count' else 1)
                turns = [shapes.Turn(shapes.QUESTIONS[kind][0], scene,
                                     shapes.answer(kind, scene), kind)]
            ok += greedy_answer(model, enc, turns)[0] == turns[-1].answer
        acc[kind] = ok / per_kind
    model.train()
    return acc


def vision_warmup(model, aux_head, merged, enc, rng, args):
    """Train the vision tower alone on the auxiliary loss (cheap: no decoder, no text)."""
    visual = model.model.visual
    params = [*visual.parameters(), *aux_head.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, args.vision_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, 1.0))
    start = time.time()
    running = None
    for step in range(args.vision_steps):
        pixels, grids, targets = vision_batch(enc, rng, args.vision_batch)
        merged.clear()
        visual(pixels, grid_thw=grids)
        loss, acc = aux_loss_and_accuracy(aux_head, merged['tokens'], targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 25 == 0 or step == args.vision_steps - 1:
            print(f'vision {step:5d} aux {running:.4f} (acc {" ".join(f"{a:.2f}" for a in acc)})'
                  f' {(time.time() - start) / 60:5.1f} min', flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=DEFAULT_OUT)
    ap.add_argument('--steps', type=int, default=880)
    ap.add_argument('--batch', type=int, default=32)
    ap.add_argument('--lr', type=float, default=3e-3)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--eval-every', type=int, default=500)
    ap.add_argument('--aux-weight', type=float, default=1.0,
                    help='weight of the auxiliary per-image-token vision loss (0: off)')
    ap.add_argument('--vision-steps', type=int, default=400,
                    help='vision-only warm-up steps on the auxiliary loss before the joint run')
    ap.add_argument('--vision-batch', type=int, default=64)
    args = ap.parse_args(argv)

    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix='demo_model_'))
    cfg = write_checkpoint_files(work)
    enc = Encoder(work)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_pretrained(str(work)))
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f'params {n_params / 1e6:.2f} M, vocab {cfg["text_config"]["vocab_size"]}', flush=True)

    # The auxiliary head reads the merger's output (the image tokens the decoder sees).
    aux_head = torch.nn.Linear(cfg['vision_config']['out_hidden_size'], sum(AUX_CLASSES))
    merged = {}
    model.model.visual.merger.register_forward_hook(
        lambda _m, _i, out: merged.__setitem__('tokens', out))

    start = time.time()
    if args.vision_steps:
        vision_warmup(model, aux_head, merged, enc, rng, args)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and 'embed' not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or 'embed' in n]
    opt = torch.optim.AdamW([{'params': decay + [aux_head.weight], 'weight_decay': 0.01},
                             {'params': no_decay + [aux_head.bias], 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    pad_id = enc.tok.token_to_id('<|endoftext|>')
    data_s = 0.0
    running = running_aux = None
    for step in range(args.steps):
        t0 = time.time()
        batch, aux = collate([random_example(enc, rng) for _ in range(args.batch)], pad_id,
                             enc.image_id)
        data_s += time.time() - t0
        merged.clear()
        loss = model(**batch).loss
        aux_loss, aux_acc = torch.zeros(()), [float('nan')] * 3
        if 'tokens' in merged and args.aux_weight > 0:
            aux_loss, aux_acc = aux_loss_and_accuracy(aux_head, merged['tokens'], aux)
        opt.zero_grad(set_to_none=True)
        (loss + args.aux_weight * aux_loss).backward()
        torch.nn.utils.clip_grad_norm_([*model.parameters(), *aux_head.parameters()], 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        running_aux = (aux_loss.item() if running_aux is None
                       else 0.95 * running_aux + 0.05 * aux_loss.item())
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - start
            print(f'step {step:5d} loss {running:.4f} aux {running_aux:.4f} '
                  f'(acc {" ".join(f"{a:.2f}" for a in aux_acc)}) '
                  f'lr {sched.get_last_lr()[0]:.2e} '
                  f'{el / 60:5.1f} min (data {data_s / max(el, 1e-9):.0%})', flush=True)
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            print('quick eval', quick_eval(model, enc, seed=10_000 + step), flush=True)
    train_s = time.time() - start
    print(f'trained {args.steps} steps in {train_s / 60:.1f} min', flush=True)

    save_weights(model, cfg, work)
    check = Qwen3VLForConditionalGeneration.from_pretrained(str(work)).eval()
    acc = quick_eval(check, enc, seed=999_999, per_kind=100)
    print('final quick eval (reloaded with from_pretrained):', acc, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    for f in work.iterdir():
        shutil.copy2(f, args.out / f.name)
    shutil.rmtree(work)
    size = (args.out / 'model.safetensors').stat().st_size
    print(f'wrote {args.out} (model.safetensors {size / 2**20:.2f} MiB)', flush=True)


if __name__ == '__main__':
    main()
