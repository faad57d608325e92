# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Train the embedded demo checkpoint: a tiny Qwen3-VL that answers questions about shapes.

Never run by CI. A seeded CPU run (defaults: 400 vision warm-up steps, then 880 joint steps;
see the README for the measured time) that writes a complete Hugging Face checkpoint directory
(default ``orin_llm_node/demo_model/``):

* a byte-level BPE tokenizer (from scratch) trained on the question/answer corpus of
  ``orin_llm_node.testing.shapes`` and the chat template's tools header (Qwen special and tool
  tokens appended, so answers are 2 tokens plus ``<|im_end|>``), the Qwen3-VL chat template, the
  processor config (every image resized to about 160x160 pixels: 16-30 image tokens), the
  generation config;
* ``model.safetensors``: transformers' ``Qwen3VLForConditionalGeneration`` built from our
  ``config.json`` and trained with AdamW on the answer tokens, plus an auxiliary per-image-token
  loss on the vision tower (`cell_targets`; its head is thrown away, the checkpoint is a plain
  Qwen3-VL). The vision tower first trains alone on that loss (``--vision-steps``): shapes at
  random positions, sizes and backgrounds are what a from-scratch ViT learns slowest.

The conversations (``shapes.random_conversation``) ask colours, shapes and counts, where the
shape is (its box, as Qwen3-VL's grounding answers) and, in the conversations that declare the
``point_at`` tool (``--tools-share`` of the batches), to point at it (a call) and what to say
to the tool's result. ``--init-from DIR`` fine-tunes an earlier checkpoint instead of training
from random weights: its tokenizer is kept (the tool tokens appended where it lacks them, so
every earlier token keeps its id), and so is every tensor of the same name and shape, and the
embedding row of every token the two tokenizers share; ``--freeze-vision`` then trains the
language model alone, on what the earlier vision tower already sees.

Training inputs are built exactly as inference builds them: the checkpoint's chat template
rendered over the whole conversation (history answers followed by ``<|im_end|>\n``), each
``<|image_pad|>`` expanded to the image's token count, pixel patches from transformers'
``Qwen2VLImageProcessorPil`` loaded from the checkpoint directory.

    .venv/bin/python tools/train_demo_model.py [--out DIR] [--steps N] [--vision-steps N]
        [--init-from DIR] [--freeze-vision] [--tools-share P] [--workers N] [--device D]
"""

import argparse
import collections
import json
import math
import multiprocessing
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

from orin_llm_node import package_files  # noqa: E402
from orin_llm_node.processing.chat import ChatTemplate  # noqa: E402
from orin_llm_node.testing import shapes  # noqa: E402
from orin_llm_node.testing.tiny_checkpoint import (  # noqa: E402
    TOOL_TOKENS,
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


def tools_header() -> str:
    """The system turn the chat template writes for ``shapes.TOOLS`` (tokenizer corpus)."""
    template = (package_files.DEMO_MODEL_DIR / 'chat_template.jinja').read_text()
    text = ChatTemplate(template).render([{'role': 'user', 'content': 'x'}], tools=shapes.TOOLS)
    return text[:text.index('<|im_start|>user')]


def earlier_tokenizer(old: Path):
    """The tokenizer of the checkpoint in `old`, with the tool tokens appended where missing.

    A fine-tune keeps the earlier token ids: a retrained tokenizer would split the answers the
    model already knows into other tokens, and it would have to learn them again.
    """
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(old / 'tokenizer.json'))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS
                          if tokenizer.token_to_id(t) is None])
    return tokenizer


def write_checkpoint_files(out: Path, init_from: Path | None = None) -> dict:
    """Write everything but the weights into `out`; return the config dict.

    `init_from`: an earlier checkpoint whose tokenizer is kept (`earlier_tokenizer`).
    """
    out.mkdir(parents=True, exist_ok=True)
    if init_from is not None:
        tokenizer = earlier_tokenizer(init_from)
    else:
        # The tools header is most of a tools conversation: repeated, its words are merged.
        tokenizer = train_tokenizer(shapes.corpus() + [tools_header()] * 20, vocab_size=512)
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

    def render(self, messages, add_generation_prompt, tools=None):
        """Render HF-style messages with the checkpoint's chat template."""
        return self.hf_tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode_text(self, text):
        """Token ids of `text` (special tokens recognised, nothing added)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def images(self, images):
        """Pixel patches [P, C*T*p*p] and grid [n, 3] of a list of RGB arrays."""
        out = self.proc(images=list(images), return_tensors='pt')
        return out['pixel_values'], out['image_grid_thw']

    def messages(self, turns, system=None, answers=None):
        """HF messages for `turns`; answers of all but the last turn come from `answers`.

        A ``pointed`` turn is the tool's result (a ``tool`` message); a call is the answer's
        text as the template writes it.
        """
        msgs = [{'role': 'system', 'content': system}] if system else []
        for i, t in enumerate(turns):
            content = [{'type': 'image'}] if t.image is not None else []
            role = 'tool' if t.kind == 'pointed' else 'user'
            msgs.append({'role': role,
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

    def training_example(self, turns, system=None, tools=None):
        """(input_ids, labels, pixels, grids, aux): labels are the answers' tokens and <|im_end|>.

        `aux` holds the per-image-token targets of the auxiliary vision loss (see `cell_targets`).
        """
        full = self.messages(turns, system) + [{'role': 'assistant',
                                                'content': turns[-1].answer}]
        ids = self.encode_text(self.render(full, add_generation_prompt=False, tools=tools))
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
            return None, None, np.zeros((0, 3 + AUX_BOX), np.float32)
        pixels, grids = self.images([s.image for s in scenes])
        aux = np.concatenate([cell_targets(s, g, self.proc.merge_size)
                              for s, g in zip(scenes, grids, strict=True)])
        return pixels, grids, aux


# Auxiliary vision targets. Every image token (one merged 2 x 2 patch cell) is classified by a
# throw-away linear head on the vision merger's output: the shape kind and colour covering the
# cell (0 = background) and whether a shape's centre lies in it; and, where a shape covers the
# cell, the head regresses that shape's box (x1, y1, x2, y2 as fractions of the image). This
# dense signal teaches the vision tower in minutes what the answers alone teach it only slowly
# (a 160 px image is 5 x 5 tokens: a box's edges lie inside cells, so the tokens must say where);
# the language model then learns to read the answers off these features. The head is not
# saved: the checkpoint is a plain Qwen3-VL.
AUX_CLASSES = (1 + len(shapes.SHAPES), 1 + len(shapes.COLOURS), 2)
AUX_BOX = 4  # regressed box coordinates per cell
MIN_COVER = 0.15  # fraction of a cell a shape must cover to name the cell


def cell_targets(scene, grid, merge: int) -> np.ndarray:
    """[cells, 7] float32 targets of one image's tokens, row-major.

    Columns: kind, colour, centre (class indices) and the covering shape's box (fractions of
    the image; NaN where no shape covers the cell).
    """
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
    boxes = np.zeros((len(scene.shapes), AUX_BOX))
    for i in range(len(scene.shapes)):
        ys, xs = np.nonzero(index == i + 1)
        boxes[i] = (xs.min() / width, ys.min() / height, (xs.max() + 1) / width,
                    (ys.max() + 1) / height)
    out = np.zeros((ch * cw, 3 + AUX_BOX), np.float32)
    out[:, 0] = np.where(covered, kinds[best], 0)
    out[:, 1] = np.where(covered, colours[best], 0)
    out[:, 3:] = np.where(covered[:, None], boxes[best], np.nan)
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
    aux = torch.from_numpy(np.concatenate([e[4] for e in examples]))  # float32
    return batch, aux


def aux_loss_and_accuracy(aux_head, tokens, targets):
    """Summed auxiliary loss and (kind, colour, centre, box) accuracies.

    Cross-entropy of the three cell classes plus the smooth-L1 box regression (in 1/10 of the
    image, where a shape covers the cell). Kind and colour accuracy are taken over the cells a
    shape covers, centre accuracy over the cells holding a centre, box accuracy (every
    coordinate within 5 % of the image) over the covered cells: the cells that carry the
    answers.
    """
    out = aux_head(tokens)
    logits = out[:, :sum(AUX_CLASSES)].split(AUX_CLASSES, dim=-1)
    if out.shape[0] != targets.shape[0]:
        raise RuntimeError('image tokens and auxiliary targets are out of step')
    classes = targets[:, :3].long()
    loss = sum(torch.nn.functional.cross_entropy(lg, classes[:, i])
               for i, lg in enumerate(logits))
    box, want = out[:, sum(AUX_CLASSES):], targets[:, 3:]
    has_box = ~torch.isnan(want[:, 0])
    if has_box.any():
        loss = loss + torch.nn.functional.smooth_l1_loss(
            10 * box[has_box], 10 * want[has_box])
    with torch.no_grad():
        acc = []
        for i, lg in enumerate(logits):
            sel = classes[:, i] > 0
            hit = lg.argmax(-1)[sel] == classes[sel, i]
            acc.append(hit.float().mean().item() if sel.any() else float('nan'))
        close = ((box[has_box] - want[has_box]).abs() <= 0.05).all(dim=-1)
        acc.append(close.float().mean().item() if has_box.any() else float('nan'))
    return loss, acc


# Training leans on counting several shapes, the slowest skill (colour is learnt first, shapes
# next; counting one shape is trivial) and on boxes (many digits): a new image is asked each
# kind of question with TRAIN_MIX (``point`` only where the tools are declared; ``json`` keeps
# the colour and shape right where a schema makes the answer an object), and a counted image
# holds 1, 2 or 3 shapes with TRAIN_COUNT_SHAPES.
TRAIN_MIX = {'colour': 0.1, 'shape': 0.2, 'count': 0.2, 'where': 0.3, 'point': 0.1,
             'json': 0.1}
TRAIN_COUNT_SHAPES = (0.2, 0.4, 0.4)


def vision_batch(enc, rng, size):
    """Pixels, grids and auxiliary targets of `size` random scenes (vision warm-up)."""
    pixels, grids, targets = enc.scene_inputs([shapes.random_scene(rng) for _ in range(size)])
    return pixels, grids, torch.from_numpy(targets)


def random_example(enc, rng, tools):
    """One random training conversation (up to 4 turns: several questions per image), encoded.

    `tools`: the conversation declares ``shapes.TOOLS`` (and may ask to point).
    """
    turns = shapes.random_conversation(rng, max_turns=4, mix=TRAIN_MIX,
                                       count_shapes=TRAIN_COUNT_SHAPES, tools=tools)
    system = None
    if rng.random() < 0.3:
        system = str(rng.choice(shapes.SYSTEM_PROMPTS))
    return enc.training_example(turns, system, shapes.TOOLS if tools else None)


# Training batches are made in worker processes (``--workers``), batch `step` from its own
# generator seeded by (seed, step): the same data whatever the number of workers.
_worker_encoder = None


def _init_worker(ckpt: Path):
    global _worker_encoder
    torch.set_num_threads(1)
    _worker_encoder = Encoder(ckpt)


def _make_batch(job):
    seed, step, size, tools_share = job
    enc = _worker_encoder
    rng = np.random.default_rng([seed, step])
    # A whole batch declares the tools or none does: the tools' system turn is several times
    # longer than a conversation, and a batch is padded to its longest example.
    tools = rng.random() < tools_share
    return collate([random_example(enc, rng, tools) for _ in range(size)],
                   enc.tok.token_to_id('<|endoftext|>'), enc.image_id)


def training_batches(ckpt: Path, args):
    """The joint run's batches in step order, made ahead by ``args.workers`` processes."""
    ctx = multiprocessing.get_context('spawn')  # no fork of a process that holds CUDA
    with ctx.Pool(args.workers, _init_worker, (ckpt,)) as pool:
        ahead = collections.deque()
        for step in range(args.steps):
            job = (args.seed, step, args.batch, args.tools_share)
            ahead.append(pool.apply_async(_make_batch, (job,)))
            if len(ahead) > 2 * args.workers:  # bounded: batches hold whole images
                yield ahead.popleft().get()
        while ahead:
            yield ahead.popleft().get()


def save_weights(model, cfg, out: Path):
    """Save the state dict under the checkpoint tensor names (fp32 safetensors)."""
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
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
def greedy_answer(model, enc, turns, system=None, answers=None, max_new_tokens=8, tools=None):
    """Greedy answer of a transformers model to the last turn: (text, prompt token ids).

    History answers come from `answers`, or from `turns` when None (see `Encoder.messages`).
    """
    msgs = enc.messages(turns, system, answers)
    ids = enc.encode_text(enc.render(msgs, add_generation_prompt=True, tools=tools))
    images = [t.image for t in turns if t.image is not None]
    pixels, grids = enc.images(images) if images else (None, None)
    ids, _ = enc.expand(ids, grids if grids is not None else [])
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    kwargs = {'mm_token_type_ids': (x == enc.image_id).long()}
    if pixels is not None:
        kwargs.update(pixel_values=pixels.to(device), image_grid_thw=grids.to(device))
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                         do_sample=False, **kwargs)
    return enc.tok.decode(out[0, x.shape[1]:].tolist(), skip_special_tokens=True), ids


def quick_eval(model, enc, seed, per_kind=40):
    """Accuracy of single-turn colour/shape/count/point/json questions and 2-turn follow-ups.

    Free (unconstrained) greedy answers; ``where``: the box answer is right within 50 of 1000
    on every coordinate.
    """
    rng = np.random.default_rng(seed)
    model.eval()
    acc = {}
    for kind in ('colour', 'shape', 'count', 'follow_up', 'point', 'where', 'json'):
        ok = 0
        for _ in range(per_kind):
            if kind in ('point', 'where'):
                scene = shapes.random_scene(rng, num_shapes=1)
                turns = [shapes.Turn(shapes.QUESTIONS[kind][0], scene,
                                     shapes.answer(kind, scene), kind)]
                text = greedy_answer(model, enc, turns, max_new_tokens=72,
                                     tools=shapes.TOOLS if kind == 'point' else None)[0]
                ok += box_close(text, turns[-1].answer) if kind == 'where' else (
                    text == turns[-1].answer)
                continue
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
            tokens = 32 if kind == 'json' else 8
            ok += greedy_answer(model, enc, turns, max_new_tokens=tokens)[0] == turns[-1].answer
        acc[kind] = ok / per_kind
    model.train()
    return acc


def box_close(text, expected, within=50):
    """Whether a box answer parses and each coordinate is within `within` of the expected."""
    try:
        box = json.loads(text)[0]['bbox_2d']
    except (ValueError, LookupError, TypeError):
        return False
    want = json.loads(expected)[0]['bbox_2d']
    return len(box) == 4 and all(abs(a - b) <= within for a, b in zip(box, want, strict=True))


def init_from(model, tokenizer_json: Path, old: Path):
    """Copy an earlier checkpoint's weights into `model` (see the module docstring)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    weights = load_file(str(old / 'model.safetensors'))
    old_vocab = Tokenizer.from_file(str(old / 'tokenizer.json')).get_vocab(with_added_tokens=True)
    new_vocab = Tokenizer.from_file(str(tokenizer_json)).get_vocab(with_added_tokens=True)
    state = model.state_dict()
    copied, rows = 0, 0
    with torch.no_grad():
        for name, value in weights.items():
            if name in state and state[name].shape == value.shape:
                state[name].copy_(value)
                copied += 1
            elif name.endswith('embed_tokens.weight'):
                for token, i in new_vocab.items():
                    if token in old_vocab:
                        state[name][i] = value[old_vocab[token]]
                        rows += 1
    print(f'init from {old}: {copied} tensors, {rows} of {len(new_vocab)} embedding rows',
          flush=True)


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
        pixels, grids, targets = (t.to(args.device)
                                  for t in vision_batch(enc, rng, args.vision_batch))
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
    ap.add_argument('--final-eval', type=int, default=100,
                    help='questions per kind of the quick eval of the saved weights (0: none)')
    ap.add_argument('--aux-weight', type=float, default=1.0,
                    help='weight of the auxiliary per-image-token vision loss (0: off)')
    ap.add_argument('--vision-steps', type=int, default=400,
                    help='vision-only warm-up steps on the auxiliary loss before the joint run')
    ap.add_argument('--vision-batch', type=int, default=64)
    ap.add_argument('--tools-share', type=float, default=0.35,
                    help='share of the batches whose conversations declare the point_at tool')
    ap.add_argument('--freeze-vision', action='store_true',
                    help='train the language model only (a fine-tune that keeps what the vision'
                         ' tower sees; the auxiliary loss is then off)')
    ap.add_argument('--workers', type=int, default=1,
                    help='processes that make the training batches')
    ap.add_argument('--device', default='cpu',
                    help='torch device of the training (the data is made on the CPU)')
    ap.add_argument('--minutes', type=float,
                    help='end the joint run after this many minutes (of the joint run; the'
                         ' learning-rate schedule then follows the time, --steps is a bound):'
                         ' a run sized to the time a borrowed machine is lent')
    ap.add_argument('--init-from', type=Path,
                    help='start from this checkpoint (same architecture) instead of random')
    args = ap.parse_args(argv)

    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix='demo_model_'))
    cfg = write_checkpoint_files(work, args.init_from)
    enc = Encoder(work)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_pretrained(str(work)))
    if args.init_from is not None:
        init_from(model, work / 'tokenizer.json', args.init_from)
    model.to(args.device).train()
    if args.freeze_vision:
        model.model.visual.requires_grad_(False)
        args.aux_weight = 0.0
    n_params = sum(p.numel() for p in model.parameters())
    print(f'params {n_params / 1e6:.2f} M, vocab {cfg["text_config"]["vocab_size"]}', flush=True)

    # The auxiliary head reads the merger's output (the image tokens the decoder sees).
    aux_head = torch.nn.Linear(cfg['vision_config']['out_hidden_size'],
                               sum(AUX_CLASSES) + AUX_BOX).to(args.device)
    merged = {}
    model.model.visual.merger.register_forward_hook(
        lambda _m, _i, out: merged.__setitem__('tokens', out))

    start = time.time()
    if args.vision_steps:
        vision_warmup(model, aux_head, merged, enc, rng, args)

    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if p.ndim >= 2 and 'embed' not in n]
    no_decay = [p for n, p in trained if p.ndim < 2 or 'embed' in n]
    opt = torch.optim.AdamW([{'params': decay + [aux_head.weight], 'weight_decay': 0.01},
                             {'params': no_decay + [aux_head.bias], 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    # Warm-up: 5 % of a run sized by steps; 100 steps of one sized by time.
    warmup = 100 if args.minutes else max(1, args.steps // 20)

    joint_start = time.time()

    def progress(step):
        """Fraction of the joint run done: by steps, or by time with --minutes."""
        if args.minutes:
            return min(1.0, (time.time() - joint_start) / (60 * args.minutes))
        return (step - warmup) / max(1, args.steps - warmup)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * max(0.0, progress(step))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    data_s = 0.0
    running = running_aux = None
    batches = training_batches(work, args)
    steps = args.steps
    for step in range(args.steps):
        if args.minutes and step > warmup and progress(step) >= 1.0:
            steps = step
            break
        t0 = time.time()
        batch, aux = next(batches)
        batch = {k: v.to(args.device) for k, v in batch.items()}
        aux = aux.to(args.device)
        data_s += time.time() - t0
        merged.clear()
        loss = model(**batch).loss
        aux_loss, aux_acc = torch.zeros((), device=args.device), [float('nan')] * 4
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
        if step % 100 == 0 or step == args.steps - 1:
            el = time.time() - start
            print(f'step {step:5d} loss {running:.4f} aux {running_aux:.4f} '
                  f'(acc {" ".join(f"{a:.2f}" for a in aux_acc)}) '
                  f'lr {sched.get_last_lr()[0]:.2e} '
                  f'{el:7.1f} s (data wait {data_s / max(el, 1e-9):.0%})', flush=True)
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            print('quick eval', quick_eval(model, enc, seed=10_000 + step), flush=True)
    batches.close()
    train_s = time.time() - start
    print(f'trained {steps} steps in {train_s / 60:.1f} min', flush=True)

    save_weights(model, cfg, work)
    if args.final_eval:
        check = Qwen3VLForConditionalGeneration.from_pretrained(str(work)).to(args.device).eval()
        acc = quick_eval(check, enc, seed=999_999, per_kind=args.final_eval)
        print('final quick eval (reloaded with from_pretrained):', acc, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    for f in work.iterdir():
        shutil.copy2(f, args.out / f.name)
    shutil.rmtree(work)
    size = (args.out / 'model.safetensors').stat().st_size
    print(f'wrote {args.out} (model.safetensors {size / 2**20:.2f} MiB)', flush=True)


if __name__ == '__main__':
    main()
