# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Tiny random Qwen3-VL checkpoints in Hugging Face format, for tests and the demo fallback.

Everything is generated locally and deterministically from a seed: a byte-level BPE tokenizer
trained with `tokenizers` on a small built-in corpus (Qwen's special tokens, then its tool-call
tokens, appended after the learned vocabulary, so their ids differ from the real 151643+ on
purpose), the Qwen3-VL chat template, the image and video processor configs, the model config in
the format transformers >= 5 writes, and random weights under the real tensor names.

The weights are initialised so that bugs show: a larger std in the vision tower (at 0.02 a missing
vision RoPE moves the logits by only ~3e-4) and in the decoder, so that greedy decoding is not
flat (a degenerate model repeats one token whatever the input, and then token-for-token parity
proves nothing).
"""

from collections.abc import Iterable
import copy
import json
from pathlib import Path

from safetensors.torch import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
import torch

from orin_llm_node import package_files

SPECIAL_TOKENS = (
    '<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|vision_start|>', '<|vision_end|>',
    '<|image_pad|>', '<|video_pad|>',
)
# Tool-call markup: added tokens that are not special, as in the published tokenizers (a decode
# that skips special tokens keeps them). Appended after SPECIAL_TOKENS, so the ids of those stay.
TOOL_TOKENS = ('<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>')

# Qwen2's pre-tokenizer split (digits one by one, contractions, letters, punctuation, spaces).
# The ids the published checkpoints use; the tiny tokenizer must not reproduce them.
REAL_SPECIAL_IDS = {
    '<|endoftext|>': 151643, '<|im_start|>': 151644, '<|im_end|>': 151645,
    '<|vision_start|>': 151652, '<|vision_end|>': 151653, '<|image_pad|>': 151655,
    '<|video_pad|>': 151656,
}

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = (
    'What is in front of you? Describe the image. What colour is the shape? What shape is it?',
    'How many shapes are there? And what colour is it? There is a red circle on a grey floor.',
    'A robot arm picks up the blue cube and places it on the green table next to the door.',
    'The camera sees a person walking towards the charging station in the warehouse aisle.',
    'Is the path clear? Yes, the path is clear. No, there is an obstacle two metres ahead.',
    'square triangle star circle red green blue yellow purple orange white black grey one two',
    'three four five six seven eight nine ten left right top bottom centre near far small big',
    'You are a helpful assistant running on a robot. Answer briefly and precisely. Thank you!',
    'Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 3.14; punctuation: , . ; : ! ? ( ) [ ] { } - _ / *',
    'Ünïcödé: café, naïve, Grüße, 日本語のテキスト, 中文文本, emoji 🤖📷✅, ñandú, smörgåsbord.',
    'The quick brown fox jumps over the lazy dog while the drone hovers above the field.',
    'Turn left at the shelf, then go straight until you reach the loading dock on the right.',
)

TEXT_DEFAULTS = {
    'hidden_size': 64,
    'intermediate_size': 128,
    'num_hidden_layers': 3,
    'num_attention_heads': 4,
    'num_key_value_heads': 2,
    'head_dim': 32,
    'hidden_act': 'silu',
    'max_position_embeddings': 4096,
    'rms_norm_eps': 1e-6,
    'rope_parameters': {
        'rope_type': 'default', 'rope_theta': 10000.0, 'mrope_section': [6, 5, 5],
        'mrope_interleaved': True,
    },
    'attention_bias': False,
    'attention_dropout': 0.0,
    'initializer_range': 0.02,
    'model_type': 'qwen3_vl_text',
}

VISION_DEFAULTS = {
    'depth': 3,
    'hidden_size': 64,
    'hidden_act': 'gelu_pytorch_tanh',
    'intermediate_size': 128,
    'num_heads': 4,
    'in_channels': 3,
    'patch_size': 16,
    'spatial_merge_size': 2,
    'temporal_patch_size': 2,
    'num_position_embeddings': 256,
    'deepstack_visual_indexes': [0, 1],
    'initializer_range': 0.02,
    'model_type': 'qwen3_vl_vision',
}

# Small pixel bounds keep CPU tests fast: 64x64 .. 256x256 (4 .. 64 image tokens).
MIN_PIXELS = 64 * 64
MAX_PIXELS = 256 * 256

# Std of the random weights (see the module docstring for why they are not 0.02).
TEXT_STD = 0.2
VISION_STD = 0.1
EMBED_STD = 0.2
# Tokens a real model never generates: their output rows are zeroed so that greedy decoding never
# picks them (their logit is 0 while the best random logit is always positive).
NEVER_GENERATED = ('<|vision_start|>', '<|vision_end|>', '<|image_pad|>', '<|video_pad|>')


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512) -> Tokenizer:
    """Train a Qwen-style byte-level BPE tokenizer; Qwen's special and tool tokens appended."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior='isolated', invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def write_tokenizer_files(out_dir: Path, tokenizer: Tokenizer) -> dict:
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja; return the special ids."""
    out_dir = Path(out_dir)
    tokenizer.save(str(out_dir / 'tokenizer.json'))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {
        str(tokenizer.token_to_id(t)): {'content': t, 'lstrip': False, 'normalized': False,
                                        'rstrip': False, 'single_word': False,
                                        'special': t in SPECIAL_TOKENS}
        for t in (*SPECIAL_TOKENS, *TOOL_TOKENS) if tokenizer.token_to_id(t) is not None
    }
    tok_cfg = {
        'tokenizer_class': 'Qwen2Tokenizer',
        'added_tokens_decoder': added,
        'bos_token': None,
        'eos_token': '<|im_end|>',
        'pad_token': '<|endoftext|>',
        'unk_token': None,
        'clean_up_tokenization_spaces': False,
        'model_max_length': 4096,
        'errors': 'replace',
        'split_special_tokens': False,
    }
    (out_dir / 'tokenizer_config.json').write_text(json.dumps(tok_cfg, indent=2))
    # Qwen3-VL's chat template: one copy in the package, the demo checkpoint's.
    template = (package_files.DEMO_MODEL_DIR / 'chat_template.jinja').read_text()
    (out_dir / 'chat_template.jinja').write_text(template)
    return ids


def write_preprocessor_config(out_dir: Path, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                              patch_size=16, temporal_patch_size=2, merge_size=2) -> None:
    """Write preprocessor_config.json (Qwen3-VL's values, with small pixel bounds)."""
    cfg = {
        'do_convert_rgb': True, 'do_normalize': True, 'do_rescale': True, 'do_resize': True,
        'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5],
        'image_processor_type': 'Qwen2VLImageProcessor',
        'merge_size': merge_size, 'patch_size': patch_size, 'resample': 3,
        'rescale_factor': 1 / 255, 'temporal_patch_size': temporal_patch_size,
        'size': {'shortest_edge': min_pixels, 'longest_edge': max_pixels},
    }
    (Path(out_dir) / 'preprocessor_config.json').write_text(json.dumps(cfg, indent=2))


def write_video_preprocessor_config(out_dir: Path, patch_size=16, temporal_patch_size=2,
                                    merge_size=2) -> None:
    """Write video_preprocessor_config.json: the published Qwen3-VL checkpoints' values.

    Their pixel bounds hold for a whole clip (frames x height x width), so the real ones are
    kept: a test's clip size, not the bound, keeps it small.
    """
    cfg = {
        'do_convert_rgb': True, 'do_normalize': True, 'do_rescale': True, 'do_resize': True,
        'do_sample_frames': True, 'fps': 2, 'min_frames': 4, 'max_frames': 768,
        'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5],
        'merge_size': merge_size, 'patch_size': patch_size, 'resample': 3,
        'rescale_factor': 1 / 255, 'return_metadata': False,
        'size': {'longest_edge': 25165824, 'shortest_edge': 4096},
        'temporal_patch_size': temporal_patch_size,
        'video_processor_type': 'Qwen3VLVideoProcessor',
    }
    (Path(out_dir) / 'video_preprocessor_config.json').write_text(json.dumps(cfg, indent=2))


def write_generation_config(out_dir: Path, special_ids: dict) -> None:
    """Write generation_config.json: greedy, stopping at <|im_end|> or <|endoftext|>."""
    gen_cfg = {
        'bos_token_id': special_ids['<|endoftext|>'],
        'eos_token_id': [special_ids['<|im_end|>'], special_ids['<|endoftext|>']],
        'pad_token_id': special_ids['<|endoftext|>'],
        'do_sample': False,
    }
    (Path(out_dir) / 'generation_config.json').write_text(json.dumps(gen_cfg, indent=2))


def build_config(special_ids: dict, vocab_size: int, text_config=None, vision_config=None,
                 **top_level) -> dict:
    """Return a Qwen3-VL config.json dict (transformers 5 format) with overrides applied."""
    text = copy.deepcopy(TEXT_DEFAULTS)
    text.update(copy.deepcopy(text_config or {}))
    text.setdefault('vocab_size', vocab_size)
    text.setdefault('bos_token_id', special_ids['<|endoftext|>'])
    text.setdefault('eos_token_id', special_ids['<|im_end|>'])
    vision = copy.deepcopy(VISION_DEFAULTS)
    vision.update(copy.deepcopy(vision_config or {}))
    vision.setdefault('out_hidden_size', text['hidden_size'])
    section = text['rope_parameters']['mrope_section']
    if 2 * sum(section) != text['head_dim']:
        raise ValueError(
            f'mrope_section {section} must sum to head_dim/2 = {text["head_dim"] // 2}')
    cfg = {
        'architectures': ['Qwen3VLForConditionalGeneration'],
        'model_type': 'qwen3_vl',
        'image_token_id': special_ids['<|image_pad|>'],
        'video_token_id': special_ids['<|video_pad|>'],
        'vision_start_token_id': special_ids['<|vision_start|>'],
        'vision_end_token_id': special_ids['<|vision_end|>'],
        'tie_word_embeddings': True,
        'dtype': 'float32',
        'text_config': text,
        'vision_config': vision,
    }
    cfg.update(top_level)
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor of a Qwen3-VL checkpoint with this config."""
    t, v = cfg['text_config'], cfg['vision_config']
    shapes = {}
    vh, vi = v['hidden_size'], v['intermediate_size']
    p, tp = v['patch_size'], v['temporal_patch_size']
    merged = vh * v['spatial_merge_size'] ** 2
    pre = 'model.visual.'
    shapes[pre + 'patch_embed.proj.weight'] = (vh, v['in_channels'], tp, p, p)
    shapes[pre + 'patch_embed.proj.bias'] = (vh,)
    shapes[pre + 'pos_embed.weight'] = (v['num_position_embeddings'], vh)
    for i in range(v['depth']):
        b = f'{pre}blocks.{i}.'
        for n in ('norm1', 'norm2'):
            shapes[b + n + '.weight'] = shapes[b + n + '.bias'] = (vh,)
        shapes[b + 'attn.qkv.weight'], shapes[b + 'attn.qkv.bias'] = (3 * vh, vh), (3 * vh,)
        shapes[b + 'attn.proj.weight'], shapes[b + 'attn.proj.bias'] = (vh, vh), (vh,)
        shapes[b + 'mlp.linear_fc1.weight'], shapes[b + 'mlp.linear_fc1.bias'] = (vi, vh), (vi,)
        shapes[b + 'mlp.linear_fc2.weight'], shapes[b + 'mlp.linear_fc2.bias'] = (vh, vi), (vh,)
    mergers = [(pre + 'merger.', vh)] + [
        (f'{pre}deepstack_merger_list.{j}.', merged)
        for j in range(len(v['deepstack_visual_indexes']))]
    for m, norm_dim in mergers:
        shapes[m + 'norm.weight'] = shapes[m + 'norm.bias'] = (norm_dim,)
        shapes[m + 'linear_fc1.weight'] = (merged, merged)
        shapes[m + 'linear_fc1.bias'] = (merged,)
        shapes[m + 'linear_fc2.weight'] = (v['out_hidden_size'], merged)
        shapes[m + 'linear_fc2.bias'] = (v['out_hidden_size'],)
    h, d, inter = t['hidden_size'], t['head_dim'], t['intermediate_size']
    nq, nkv = t['num_attention_heads'], t['num_key_value_heads']
    pre = 'model.language_model.'
    shapes[pre + 'embed_tokens.weight'] = (t['vocab_size'], h)
    for i in range(t['num_hidden_layers']):
        b = f'{pre}layers.{i}.'
        shapes[b + 'self_attn.q_proj.weight'] = (nq * d, h)
        shapes[b + 'self_attn.k_proj.weight'] = (nkv * d, h)
        shapes[b + 'self_attn.v_proj.weight'] = (nkv * d, h)
        shapes[b + 'self_attn.o_proj.weight'] = (h, nq * d)
        shapes[b + 'self_attn.q_norm.weight'] = shapes[b + 'self_attn.k_norm.weight'] = (d,)
        shapes[b + 'mlp.gate_proj.weight'] = shapes[b + 'mlp.up_proj.weight'] = (inter, h)
        shapes[b + 'mlp.down_proj.weight'] = (h, inter)
        shapes[b + 'input_layernorm.weight'] = (h,)
        shapes[b + 'post_attention_layernorm.weight'] = (h,)
    shapes[pre + 'norm.weight'] = (h,)
    if not cfg.get('tie_word_embeddings', False):
        shapes['lm_head.weight'] = (t['vocab_size'], h)
    return shapes


def random_weights(cfg: dict, seed: int = 0, silent_ids: Iterable[int] = ()) -> dict:
    """Random fp32 weights for every tensor of `cfg` (norm scales near 1, not exactly 1).

    Output-embedding rows of `silent_ids` are zero, so greedy decoding never emits them.
    """
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        vision = name.startswith('model.visual.')
        if 'norm' in name.split('.')[-2] and name.endswith('.weight'):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith('.bias'):
            w = 0.02 * torch.randn(shape, generator=gen)
        elif name.endswith('embed_tokens.weight'):
            w = EMBED_STD * torch.randn(shape, generator=gen)
        else:
            w = (VISION_STD if vision else TEXT_STD) * torch.randn(shape, generator=gen)
        out[name] = w.contiguous()
    head = 'model.language_model.embed_tokens.weight'
    if not cfg.get('tie_word_embeddings', False):
        head = 'lm_head.weight'
    out[head][list(silent_ids)] = 0.0
    return out


def make_tiny_checkpoint(out_dir, seed: int = 0, text_config: dict | None = None,
                         vision_config: dict | None = None, **top_level) -> Path:
    """Write a tiny random Qwen3-VL checkpoint directory in Hugging Face format.

    `text_config` / `vision_config` override any field of the tiny defaults (for example
    `num_hidden_layers`, `head_dim` with a matching `rope_parameters.mrope_section`, `depth`,
    `deepstack_visual_indexes`); other keyword arguments override top-level fields such as
    `tie_word_embeddings`. Deterministic for a seed; needs no network and no transformers.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(CORPUS)
    special_ids = write_tokenizer_files(out, tokenizer)
    cfg = build_config(special_ids, tokenizer.get_vocab_size(), text_config, vision_config,
                       **top_level)
    (out / 'config.json').write_text(json.dumps(cfg, indent=2))
    write_generation_config(out, special_ids)
    vis = cfg['vision_config']
    write_preprocessor_config(out, patch_size=vis['patch_size'],
                              temporal_patch_size=vis['temporal_patch_size'],
                              merge_size=vis['spatial_merge_size'])
    write_video_preprocessor_config(out, patch_size=vis['patch_size'],
                                    temporal_patch_size=vis['temporal_patch_size'],
                                    merge_size=vis['spatial_merge_size'])
    silent = [special_ids[t] for t in NEVER_GENERATED]
    save_file(random_weights(cfg, seed, silent), str(out / 'model.safetensors'),
              metadata={'format': 'pt'})
    return out
