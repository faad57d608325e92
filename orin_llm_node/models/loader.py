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
"""

import json
from pathlib import Path

from safetensors import safe_open
import torch
from torch import nn

from .config import ModelLoadError, Qwen3VLConfig, load_config
from .qwen3_vl import Qwen3VLForCausalLM

__all__ = ["ModelLoadError", "build_model", "checkpoint_to_param_name", "load_model"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_to_param_name(name: str) -> str:
    """Map a checkpoint tensor name to our state-dict name (current and legacy HF layouts)."""
    for prefix, ours in (("model.visual.", "visual."),
                         ("model.language_model.", "language_model."),
                         ("visual.", "visual."), ("model.", "language_model.")):
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return name


def build_model(cfg: Qwen3VLConfig, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "meta",
                quantized: dict | None = None) -> Qwen3VLForCausalLM:
    """
    Build the model with uninitialised weights in ``dtype`` on ``device`` (``meta``: no memory).

    Rotary buffers stay fp32 whatever ``dtype`` is (the reference computes RoPE in fp32), and
    so do quantized layers' scales. ``quantized`` maps our linear layer names to the
    :class:`~orin_llm_node.quantization.checkpoint.LayerQuant` that replaces them.
    """
    with torch.device("meta"):
        model = Qwen3VLForCausalLM(cfg)
    for name, lq in (quantized or {}).items():
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, attr, lq.make(getattr(owner, attr)))
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
    return model.eval()


def _weight_files(model_dir: Path) -> dict[Path, set[str] | None]:
    """Safetensors files to read, each with the tensor names the index promises (or None)."""
    if (model_dir / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((model_dir / INDEX_FILE).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{model_dir / INDEX_FILE}: unreadable index ({e})") from None
        files: dict[Path, set[str] | None] = {}
        for name, fname in weight_map.items():
            files.setdefault(model_dir / fname, set()).add(name)
        for path in files:
            if not path.is_file():
                raise ModelLoadError(f"{model_dir}: shard {path.name} (in the index) is missing")
        return files
    if (model_dir / SINGLE_FILE).is_file():
        return {model_dir / SINGLE_FILE: None}
    pickles = sorted(p.name for p in [*model_dir.glob("*.bin"), *model_dir.glob("*.pt")])
    extra = f" (found {', '.join(pickles)}; pickle is never loaded)" if pickles else ""
    raise ModelLoadError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}{extra}")


def _names(names: set[str] | list[str], limit: int = 5) -> str:
    names = sorted(names)
    more = f", ... ({len(names)} total)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _checkpoint_keys(files: dict[Path, set[str] | None]) -> list[str]:
    keys = []
    for path, promised in files.items():
        if promised is not None:
            keys += promised
            continue
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys += f.keys()
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"{path}: cannot read safetensors ({e})") from None
    return keys


def _checkpoint_linears(cfg: Qwen3VLConfig, keys: list[str]) -> dict[str, str]:
    """Checkpoint module name -> our module name, for the checkpoint's linear layers."""
    with torch.device("meta"):
        ours = {n for n, m in Qwen3VLForCausalLM(cfg).named_modules() if isinstance(m, nn.Linear)}
    linears = {}
    for key in keys:
        module = checkpoint_to_param_name(key).rpartition(".")[0]
        if module in ours:
            linears[key.rpartition(".")[0]] = module
    return linears


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu",
               quantization: str = "none") -> Qwen3VLForCausalLM:
    """
    Load the Qwen3-VL checkpoint in ``model_dir`` cast to ``dtype`` on ``device``.

    ``quantization`` ("none", "int8", "int4", "int4_asym", "fp8") quantizes a float
    checkpoint's decoder projections as they load; a checkpoint with a supported
    ``quantization_config`` loads in its own format (with ``quantization="none"``).
    Raises :class:`ModelLoadError` (a ``ValueError``) with a one-line reason for a missing
    directory, a non-Qwen3-VL config, unreadable/truncated files, missing or unexpected tensors,
    shape mismatches and unsupported quantization formats.
    """
    # Imported here: quantization.checkpoint itself imports this package's config module.
    from orin_llm_node.quantization.checkpoint import plan_quantization

    model_dir = Path(model_dir)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ModelLoadError(f"unsupported dtype {dtype} (float32, bfloat16 or float16)")
    cfg = load_config(model_dir)
    files = _weight_files(model_dir)
    all_keys = _checkpoint_keys(files)
    linears = _checkpoint_linears(cfg, all_keys)
    plan = plan_quantization(model_dir, all_keys, linears, quantization)
    quantized = {linears[m]: lq for m, lq in plan.layers.items()} if plan else {}
    if "lm_head" in quantized and cfg.tie_word_embeddings:
        raise ModelLoadError(f"{model_dir}: a quantized lm_head with tied embeddings is not "
                             "supported")
    model = build_model(cfg, dtype, device, quantized)
    model.weight_format = plan.description if plan else str(dtype).replace("torch.", "")
    params = dict(model.named_parameters())  # a tied lm_head appears once, as embed_tokens
    loaded, unexpected = set(), []
    for path, promised in files.items():
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys = set(f.keys())
                if promised is not None and promised - keys:
                    raise ModelLoadError(
                        f"{path.name}: tensors named in the index are missing from the file: "
                        f"{_names(promised - keys)}"
                    )
                for key in sorted(keys):
                    role = plan.tensor_role(key) if plan else None
                    if role is not None:
                        layer = model.get_submodule(linears[role[0]])
                        if plan.add(*role, f.get_tensor(key), layer):
                            loaded.add(role[0])
                        continue
                    name = checkpoint_to_param_name(key)
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue  # some tied checkpoints store a copy; the embedding wins
                    param = params.get(name)
                    if param is None:
                        unexpected.append(key)
                        continue
                    shape = tuple(f.get_slice(key).get_shape())
                    if shape != tuple(param.shape):
                        raise ModelLoadError(
                            f"{path.name}: tensor {key} has shape {list(shape)}, the config "
                            f"implies {list(param.shape)}"
                        )
                    param.copy_(f.get_tensor(key))  # per-tensor read from the mmap + cast
                    loaded.add(name)
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"{path}: cannot read safetensors ({e})") from None
    if unexpected:
        raise ModelLoadError(f"{model_dir}: unexpected tensors: {_names(unexpected)}")
    missing = (set(params) - loaded) | (set(plan.layers) - loaded if plan else set())
    if missing:
        raise ModelLoadError(f"{model_dir}: missing tensors: {_names(missing)}")
    return model
