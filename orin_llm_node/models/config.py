# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-VL model configuration: frozen dataclasses parsed and validated once from config.json.

Two on-disk formats exist. The published checkpoints (written by transformers 4.57) keep
``rope_theta`` and ``rope_scaling`` (with ``mrope_section``) directly in ``text_config``;
transformers 5 writes a single ``rope_parameters`` dict instead. Both parse to the same
:class:`TextConfig`. Token ids come from the file; eos ids live in generation_config.json and
the tokenizer, not here.
"""

from dataclasses import dataclass, field
import json
import math
from pathlib import Path
from typing import Any

from orin_llm_node.errors import ModelLoadError

__all__ = [
    'Qwen3VLConfig',
    'TextConfig',
    'VisionConfig',
    'config_from_dict',
    'load_config',
]


@dataclass(frozen=True)
class TextConfig:
    """The language decoder's shape and RoPE settings."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    attention_bias: bool = False
    max_position_embeddings: int = 262144


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's shape."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        """Per-head width of the vision attention."""
        return self.hidden_size // self.num_heads

    @property
    def num_grid_per_side(self) -> int:
        """Side of the square learned position table."""
        return math.isqrt(self.num_position_embeddings)


@dataclass(frozen=True)
class Qwen3VLConfig:
    """Whole-model configuration."""

    text: TextConfig
    vision: VisionConfig
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    tie_word_embeddings: bool
    #: The checkpoint's ``quantization_config`` as written (``quantization.checkpoint`` reads it).
    quantization_config: dict | None = field(default=None, compare=False)


def _get(d: dict, key: str, where: str, default: Any = ...) -> Any:
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise ModelLoadError(f'config.json: {where}.{key} is missing')
    return default


def _rope(tc: dict) -> tuple[float, list]:
    """Return (rope_theta, mrope_section) from either config format, checking the rope type."""
    params = tc.get('rope_parameters') or tc.get('rope_scaling') or {}
    if not isinstance(params, dict):
        raise ModelLoadError('config.json: text_config.rope_parameters must be an object')
    rope_type = params.get('rope_type', params.get('type', 'default'))
    if rope_type not in ('default', 'mrope'):
        raise ModelLoadError(f"config.json: unsupported rope_type {rope_type!r} (need 'default')")
    # The reference always applies the interleaved layout; a False here names a layout we
    # (and it) do not implement, so refuse rather than run wrong positions.
    if params.get('mrope_interleaved', True) is not True:
        raise ModelLoadError('config.json: only interleaved M-RoPE (mrope_interleaved) supported')
    theta = params.get('rope_theta', tc.get('rope_theta'))
    if theta is None:
        raise ModelLoadError('config.json: text_config rope_theta is missing')
    section = params.get('mrope_section')
    if section is None:
        raise ModelLoadError('config.json: text_config mrope_section is missing')
    return float(theta), list(section)


def config_from_dict(raw: dict) -> Qwen3VLConfig:
    """Parse and validate a config.json dict (either format); raise ModelLoadError on errors."""
    model_type = raw.get('model_type')
    archs = raw.get('architectures') or []
    if model_type != 'qwen3_vl' and 'Qwen3VLForConditionalGeneration' not in archs:
        raise ModelLoadError(
            f"config.json: not a Qwen3-VL checkpoint (model_type={model_type!r}, "
            f"architectures={archs}); expected model_type 'qwen3_vl'"
        )
    tc, vc = raw.get('text_config'), raw.get('vision_config')
    if not isinstance(tc, dict) or not isinstance(vc, dict):
        raise ModelLoadError('config.json: text_config and vision_config objects are required')
    if tc.get('hidden_act', 'silu') != 'silu':
        raise ModelLoadError(f"config.json: text hidden_act {tc['hidden_act']!r} != 'silu'")
    if vc.get('hidden_act', 'gelu_pytorch_tanh') != 'gelu_pytorch_tanh':
        raise ModelLoadError(
            f"config.json: vision hidden_act {vc['hidden_act']!r} != 'gelu_pytorch_tanh'"
        )
    theta, section = _rope(tc)
    heads = int(_get(tc, 'num_attention_heads', 'text_config'))
    text = TextConfig(
        vocab_size=int(_get(tc, 'vocab_size', 'text_config')),
        hidden_size=int(_get(tc, 'hidden_size', 'text_config')),
        intermediate_size=int(_get(tc, 'intermediate_size', 'text_config')),
        num_hidden_layers=int(_get(tc, 'num_hidden_layers', 'text_config')),
        num_attention_heads=heads,
        num_key_value_heads=int(_get(tc, 'num_key_value_heads', 'text_config', heads)),
        head_dim=int(_get(tc, 'head_dim', 'text_config')),
        rms_norm_eps=float(_get(tc, 'rms_norm_eps', 'text_config', 1e-6)),
        rope_theta=theta,
        mrope_section=tuple(int(s) for s in section),
        attention_bias=bool(_get(tc, 'attention_bias', 'text_config', False)),
        max_position_embeddings=int(_get(tc, 'max_position_embeddings', 'text_config', 262144)),
    )
    vrope = vc.get('rope_parameters') or {}
    vision = VisionConfig(
        depth=int(_get(vc, 'depth', 'vision_config')),
        hidden_size=int(_get(vc, 'hidden_size', 'vision_config')),
        intermediate_size=int(_get(vc, 'intermediate_size', 'vision_config')),
        num_heads=int(_get(vc, 'num_heads', 'vision_config')),
        out_hidden_size=int(_get(vc, 'out_hidden_size', 'vision_config')),
        num_position_embeddings=int(_get(vc, 'num_position_embeddings', 'vision_config')),
        deepstack_visual_indexes=tuple(
            int(i) for i in _get(vc, 'deepstack_visual_indexes', 'vision_config')
        ),
        in_channels=int(_get(vc, 'in_channels', 'vision_config', 3)),
        patch_size=int(_get(vc, 'patch_size', 'vision_config', 16)),
        temporal_patch_size=int(_get(vc, 'temporal_patch_size', 'vision_config', 2)),
        spatial_merge_size=int(_get(vc, 'spatial_merge_size', 'vision_config', 2)),
        rope_theta=float(vrope.get('rope_theta', 10000.0)),
    )
    cfg = Qwen3VLConfig(
        text=text,
        vision=vision,
        image_token_id=int(_get(raw, 'image_token_id', 'config')),
        video_token_id=int(_get(raw, 'video_token_id', 'config')),
        vision_start_token_id=int(_get(raw, 'vision_start_token_id', 'config')),
        vision_end_token_id=int(_get(raw, 'vision_end_token_id', 'config')),
        # Only the top-level flag decides tying (text_config may carry a stale copy).
        tie_word_embeddings=bool(raw.get('tie_word_embeddings', False)),
        quantization_config=raw.get('quantization_config'),
    )
    _validate(cfg)
    return cfg


def _validate(cfg: Qwen3VLConfig) -> None:
    t, v = cfg.text, cfg.vision
    checks = [
        (t.num_attention_heads % t.num_key_value_heads == 0,
         f'num_attention_heads {t.num_attention_heads} is not a multiple of '
         f'num_key_value_heads {t.num_key_value_heads}'),
        (len(t.mrope_section) == 3 and sum(t.mrope_section) == t.head_dim // 2,
         f'mrope_section {list(t.mrope_section)} must have 3 entries summing to '
         f'head_dim/2 = {t.head_dim // 2}'),
        (t.head_dim % 2 == 0, f'text head_dim {t.head_dim} must be even'),
        (v.hidden_size % v.num_heads == 0 and v.head_dim % 4 == 0,
         f'vision hidden_size {v.hidden_size} / num_heads {v.num_heads} must give a head dim '
         'divisible by 4 (2-D rotary)'),
        (v.num_grid_per_side ** 2 == v.num_position_embeddings,
         f'vision num_position_embeddings {v.num_position_embeddings} is not a square'),
        (all(0 <= i < v.depth for i in v.deepstack_visual_indexes),
         f'deepstack_visual_indexes {list(v.deepstack_visual_indexes)} out of range for depth '
         f'{v.depth}'),
        (len(v.deepstack_visual_indexes) <= t.num_hidden_layers,
         'more DeepStack levels than decoder layers'),
        (v.out_hidden_size == t.hidden_size,
         f'vision out_hidden_size {v.out_hidden_size} != text hidden_size {t.hidden_size}'),
    ]
    for ok, msg in checks:
        if not ok:
            raise ModelLoadError(f'config.json: {msg}')


def load_config(model_dir: str | Path) -> Qwen3VLConfig:
    """Read ``model_dir/config.json`` (published or transformers-5 format) into a config."""
    path = Path(model_dir) / 'config.json'
    if not Path(model_dir).is_dir():
        raise ModelLoadError(f'model directory not found: {model_dir}')
    if not path.is_file():
        raise ModelLoadError(f'no config.json in {model_dir}')
    try:
        raw = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f'{path}: cannot parse ({e})') from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f'{path}: expected a JSON object')
    return config_from_dict(raw)
