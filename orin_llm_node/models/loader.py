# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Load a Hugging Face Qwen3-VL directory (safetensors only) into our modules.

The module is built on the ``meta`` device (no memory), its parameters are allocated once in the
target dtype/device, then filled tensor by tensor from memory-mapped safetensors files: peak
memory is the model plus one tensor, never a second full copy. Pickle files are never read.

Quantized weights (``orin_llm_node.quantization``): the plan -- which linear layers load as
INT8 / INT4 / FP8, from the checkpoint's ``quantization_config`` or quantized as they are read
-- is made from the tensor names before anything is allocated; those layers are swapped for
their quantized modules on the ``meta`` device, so no dense copy of them ever exists.

The checkpoint keeps the Hugging Face layout (separate ``q_proj``/``k_proj``/``v_proj`` and
``gate_proj``/``up_proj``); the decoder holds them merged (``qkv_proj``, ``gate_up_proj``), so
each of those tensors goes to its merged module's ``weight_loader`` with a shard id: the model
class declares which (``packed_modules_mapping``), and the loader reads it there, as
nano-vllm's does.
"""

import json
from pathlib import Path

from safetensors import safe_open
import torch
from torch import nn

from orin_llm_node.errors import LoadInterrupted, ModelLoadError
from orin_llm_node.layers import LinearBase
from orin_llm_node.quantization.checkpoint import plan_quantization
from orin_llm_node.quantization.linear_method import quant_part, quantize_module

from .config import Qwen3VLConfig, load_config
from .qwen3_vl import Qwen3VLForCausalLM

__all__ = [
    'ModelLoadError',
    'build_model',
    'check_stop',
    'checkpoint_names',
    'checkpoint_target',
    'checkpoint_to_param_name',
    'checkpoint_view',
    'linear_module_names',
    'load_model',
    'meta_model',
]

SINGLE_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
#: What the model this loader builds holds merged: checkpoint module -> (ours, shard id).
_PACKED = Qwen3VLForCausalLM.packed_modules_mapping


def checkpoint_to_param_name(name: str) -> str:
    """Map a checkpoint tensor name to our state-dict name (current and legacy HF layouts)."""
    for prefix, ours in (('model.visual.', 'visual.'),
                         ('model.language_model.', 'language_model.'),
                         ('visual.', 'visual.'), ('model.', 'language_model.')):
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return name


def checkpoint_target(name: str) -> tuple[str, object]:
    """Our parameter holding checkpoint tensor ``name``, and its shard id (None: the whole)."""
    parts = checkpoint_to_param_name(name).split('.')
    if len(parts) >= 2 and parts[-2] in _PACKED:
        merged, shard_id = _PACKED[parts[-2]]
        return '.'.join((*parts[:-2], merged, parts[-1])), shard_id
    return '.'.join(parts), None


def checkpoint_names(param_name: str) -> list[str]:
    """The checkpoint-side (unmerged) names a parameter of ours is loaded from."""
    parts = param_name.split('.')
    if len(parts) >= 2:
        sources = [hf for hf, (merged, _) in _PACKED.items() if merged == parts[-2]]
        if sources:
            return ['.'.join((*parts[:-2], hf, parts[-1])) for hf in sources]
    return [param_name]


def checkpoint_view(model: nn.Module, name: str) -> torch.Tensor:
    """The part of ``model``'s parameters that holds checkpoint tensor ``name`` (a view)."""
    target, shard_id = checkpoint_target(name)
    param = model.get_parameter(target)
    if shard_id is None:
        return param
    return model.get_submodule(target.rsplit('.', 1)[0]).shard(param, shard_id)


def _load_tensor(model: nn.Module, param: torch.Tensor, target: str, shard_id,
                 tensor: torch.Tensor) -> None:
    if shard_id is None:
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f'has shape {list(tensor.shape)}, the config implies '
                             f'{list(param.shape)}')
        param.copy_(tensor)  # per-tensor read from the mmap + cast
        return
    model.get_submodule(target.rsplit('.', 1)[0]).weight_loader(param, tensor, shard_id)


def build_model(cfg: Qwen3VLConfig, dtype: torch.dtype = torch.float32,
                device: str | torch.device = 'meta',
                quantized: dict | None = None,
                weight_format: str | None = None) -> Qwen3VLForCausalLM:
    """
    Build the model with uninitialised weights in ``dtype`` on ``device`` (``meta``: no memory).

    Rotary buffers stay fp32 whatever ``dtype`` is (the reference computes RoPE in fp32), and
    so do quantized layers' scales. ``quantized`` maps our linear layer names to the
    :class:`~orin_llm_node.quantization.checkpoint_formats.LayerQuant` that replaces them.
    ``model.weight_format`` is ``weight_format`` (a ``QuantPlan.description``) or, for a float
    model, the dtype's name.
    """
    with torch.device('meta'):
        model = Qwen3VLForCausalLM(cfg)
    for name, lq in (quantized or {}).items():
        parent, _, attr = name.rpartition('.')
        quantize_module(model.get_submodule(parent), attr, lq.make)
    device = torch.device(device)
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = nn.Parameter(
                    torch.empty(p.shape, dtype=dtype, device=device), requires_grad=False
                )
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)
    model.tie_weights()  # re-share lm_head after the parameters were replaced
    model.init_buffers()
    model.weight_format = weight_format or str(dtype).replace('torch.', '')
    return model.eval()


def _weight_files(model_dir: Path) -> dict[Path, set[str] | None]:
    """Safetensors files to read, each with the tensor names the index promises (or None)."""
    if (model_dir / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((model_dir / INDEX_FILE).read_text())['weight_map']
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f'{model_dir / INDEX_FILE}: unreadable index ({e})') from None
        files: dict[Path, set[str] | None] = {}
        for name, fname in weight_map.items():
            files.setdefault(model_dir / fname, set()).add(name)
        for path in files:
            if not path.is_file():
                raise ModelLoadError(f'{model_dir}: shard {path.name} (in the index) is missing')
        return files
    if (model_dir / SINGLE_FILE).is_file():
        return {model_dir / SINGLE_FILE: None}
    pickles = sorted(p.name for p in [*model_dir.glob('*.bin'), *model_dir.glob('*.pt')])
    extra = f" (found {', '.join(pickles)}; pickle is never loaded)" if pickles else ''
    raise ModelLoadError(f'{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}{extra}')


def _names(names: set[str] | list[str], limit: int = 5) -> str:
    names = sorted(names)
    more = f', ... ({len(names)} total)' if len(names) > limit else ''
    return ', '.join(names[:limit]) + more


def _checkpoint_keys(files: dict[Path, set[str] | None]) -> list[str]:
    keys = []
    for path, promised in files.items():
        if promised is not None:
            keys += promised
            continue
        try:
            with safe_open(str(path), framework='pt', device='cpu') as f:
                keys += f.keys()
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f'{path}: cannot read safetensors ({e})') from None
    return keys


def linear_module_names(cfg: Qwen3VLConfig) -> set[str]:
    """Our linear layers (``nn.Linear`` or merged ``LinearBase``): what may be quantized."""
    with torch.device('meta'):
        return {n for n, m in Qwen3VLForCausalLM(cfg).named_modules()
                if isinstance(m, nn.Linear | LinearBase)}


def _checkpoint_linears(cfg: Qwen3VLConfig, keys: list[str]) -> dict[str, str]:
    """Checkpoint module name -> our (possibly merged) linear module holding it."""
    ours = linear_module_names(cfg)
    linears = {}
    for key in keys:
        module = checkpoint_target(key)[0].rpartition('.')[0]
        if module in ours:
            linears[key.rpartition('.')[0]] = module
    return linears


def _quantized_modules(model_dir: Path, plan, linears: dict[str, str]) -> dict:
    """Our module -> LayerQuant; every part of a merged module must share one format."""
    quantized, parts = {}, {}
    for ckpt, ours in linears.items():
        parts.setdefault(ours, []).append(plan.layers.get(ckpt))
    for ours, kinds in parts.items():
        if any(k is not None for k in kinds):
            if len(set(kinds)) != 1:
                raise ModelLoadError(f'{model_dir}: the parts of {ours} are stored in different '
                                     'formats (quantized and not, or two schemes); they share '
                                     'one merged layer here')
            quantized[ours] = kinds[0]
    return quantized


def _plan(model_dir: Path, cfg: Qwen3VLConfig, keys: list[str], linears: dict[str, str],
          quantization: str):
    """The quantization plan and our module -> LayerQuant map (empty for a float model)."""
    plan = plan_quantization(model_dir, cfg.quantization_config, keys, linears, quantization)
    quantized = _quantized_modules(model_dir, plan, linears) if plan else {}
    if 'lm_head' in quantized and cfg.tie_word_embeddings:
        raise ModelLoadError(f'{model_dir}: a quantized lm_head with tied embeddings is not '
                             'supported')
    return plan, quantized


def meta_model(model_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
               quantization: str = 'none', cfg: Qwen3VLConfig | None = None
               ) -> Qwen3VLForCausalLM:
    """The model ``load_model`` would build, on the ``meta`` device: sizes without memory.

    Reads ``config.json`` (or takes ``cfg``) and, where the weight files exist, their tensor
    names (headers only). Without weight files -- a published ``config.json`` alone -- the
    checkpoint is taken to be a float one with our layer names, which is what at-load
    quantization needs. ``memory_plan`` counts its bytes before any weight is read.
    """
    model_dir = Path(model_dir)
    cfg = cfg if cfg is not None else load_config(model_dir)
    try:
        keys = _checkpoint_keys(_weight_files(model_dir))
    except ModelLoadError:
        keys = []                       # config only; load_model reports the missing files
    linears = (_checkpoint_linears(cfg, keys) if keys
               else {n: n for n in linear_module_names(cfg)})
    plan, quantized = _plan(model_dir, cfg, keys, linears, quantization)
    return build_model(cfg, dtype, 'meta', quantized, plan and plan.description)


def check_stop(should_stop, what: str) -> None:
    """Raise :class:`LoadInterrupted` if ``should_stop`` (a callable or None) says so."""
    if should_stop is not None and should_stop():
        raise LoadInterrupted(f'stopped while {what}')


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = 'cpu',
               quantization: str = 'none', should_stop=None) -> Qwen3VLForCausalLM:
    """
    Load the Qwen3-VL checkpoint in ``model_dir`` cast to ``dtype`` on ``device``.

    ``quantization`` ("none", "int8", "int4", "int4_asym", "fp8") quantizes a float
    checkpoint's decoder projections as they load; a checkpoint with a supported
    ``quantization_config`` loads in its own format (with ``quantization="none"``).
    Raises :class:`ModelLoadError` (a ``ValueError``) with a one-line reason for a missing
    directory, a non-Qwen3-VL config, unreadable/truncated files, missing or unexpected tensors,
    shape mismatches and unsupported quantization formats.  ``should_stop`` (a callable) is
    asked before each shard and each tensor; when it answers True, :class:`LoadInterrupted` is
    raised (a signal need not wait for the whole load).
    """
    model_dir = Path(model_dir)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ModelLoadError(f'unsupported dtype {dtype} (float32, bfloat16 or float16)')
    cfg = load_config(model_dir)
    files = _weight_files(model_dir)
    all_keys = _checkpoint_keys(files)
    linears = _checkpoint_linears(cfg, all_keys)
    plan, quantized = _plan(model_dir, cfg, all_keys, linears, quantization)
    check_stop(should_stop, 'building the model')
    model = build_model(cfg, dtype, device, quantized, plan and plan.description)
    params = dict(model.named_parameters())  # a tied lm_head appears once, as embed_tokens
    expected = {hf for name in params for hf in checkpoint_names(name)}
    loaded, unexpected = set(), []
    for path, promised in files.items():
        check_stop(should_stop, f'loading {path.name}')
        try:
            with safe_open(str(path), framework='pt', device='cpu') as f:
                keys = set(f.keys())
                if promised is not None and promised - keys:
                    raise ModelLoadError(
                        f'{path.name}: tensors named in the index are missing from the file: '
                        f'{_names(promised - keys)}'
                    )
                for key in sorted(keys):
                    check_stop(should_stop, f'loading {path.name}')
                    role = plan.tensor_role(key) if plan else None
                    if role is not None:
                        layer, row0 = quant_part(model.get_submodule(linears[role[0]]),
                                                 checkpoint_target(key)[1])
                        if plan.add(*role, f.get_tensor(key), layer, row0):
                            loaded.add(role[0])
                        continue
                    name = checkpoint_to_param_name(key)
                    if name == 'lm_head.weight' and cfg.tie_word_embeddings:
                        continue  # some tied checkpoints store a copy; the embedding wins
                    target, shard_id = checkpoint_target(key)
                    param = params.get(target)
                    if param is None or name not in expected:
                        unexpected.append(key)
                        continue
                    try:
                        _load_tensor(model, param, target, shard_id, f.get_tensor(key))
                    except ValueError as e:
                        raise ModelLoadError(f'{path.name}: tensor {key} {e}') from None
                    loaded.add(name)
        except (ModelLoadError, LoadInterrupted):
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f'{path}: cannot read safetensors ({e})') from None
    if unexpected:
        raise ModelLoadError(f'{model_dir}: unexpected tensors: {_names(unexpected)}')
    missing = (expected - loaded) | (set(plan.layers) - loaded if plan else set())
    if missing:
        raise ModelLoadError(f'{model_dir}: missing tensors: {_names(missing)}')
    return model
