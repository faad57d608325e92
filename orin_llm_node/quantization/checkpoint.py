# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Which linear layers of a checkpoint are quantized, in which format, and how to load them.

Decided once from ``config.json`` and the tensor names before any weight is allocated (so a
quantized model never materialises a dense copy): a checkpoint that declares a
``quantization_config`` loads in that format (``checkpoint_formats.DECLARED``, by
``quant_method``: compressed-tensors ``pack-quantized``, fine-grained FP8), a float one is
quantized as it loads when ``quantization`` asks for it (``"int8" | "int4" | "int4_asym" |
"fp8"``: the text decoder's projections, round-to-nearest, no calibration data, no
randomness). Each format says itself which tensors a layer needs and how they load; anything
else that declares a ``quantization_config`` fails with one sentence.
"""

from pathlib import Path
import re

import torch

from orin_llm_node.errors import ModelLoadError

from . import AT_LOAD_FORMATS
from .base import QuantLinear
from .checkpoint_formats import AT_LOAD, DECLARED, LayerQuant, unsupported

__all__ = [
    'LayerQuant',
    'QuantPlan',
    'plan_quantization',
]

#: Our module names that quantize-at-load converts: the text decoder's projections.
_DECODER_PROJ = re.compile(r'^language_model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj$')


class QuantPlan:
    """Layer name -> :class:`LayerQuant`, plus the per-layer tensor collection while loading.

    ``layers`` uses *checkpoint* module names (e.g. ``model.language_model.layers.0.mlp.up_proj``);
    the loader maps them to ours with the same rule it uses for parameter names.
    """

    def __init__(self, layers: dict[str, LayerQuant], description: str):
        self.layers = layers
        self.description = description
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self._rows: dict[QuantLinear, int] = {}  # rows loaded per layer (merged: all parts)

    def tensor_role(self, key: str) -> tuple[str, str] | None:
        """``(checkpoint layer, tensor suffix)`` when ``key`` belongs to a quantized layer."""
        module, _, suffix = key.rpartition('.')
        lq = self.layers.get(module)
        if lq is None or suffix == 'bias':
            return None
        return module, suffix

    def add(self, module: str, suffix: str, tensor: torch.Tensor,
            layer: QuantLinear, row0: int = 0) -> bool:
        """Collect one tensor; load the layer's rows once all its tensors are in.

        A CPU layer whose rows are all in moves to the CPU layout
        (``QuantLinear.use_cpu_layout``). Returns True when the layer part was loaded.
        """
        lq = self.layers[module]
        want = lq.tensors
        if suffix not in want:
            raise ModelLoadError(f'{module}.{suffix}: unexpected tensor for a '
                                 f'{lq.storage.name} {layer.format} layer')
        got = self._pending.setdefault(module, {})
        got[suffix] = tensor
        if set(got) != want:
            return False
        del self._pending[module]
        try:
            rows = lq.storage.load(got, layer, row0)
        except ValueError as e:
            raise ModelLoadError(f'{module}: {e}') from None
        self._rows[layer] = self._rows.get(layer, 0) + rows
        if self._rows[layer] == layer.out_features and layer.qweight.device.type == 'cpu':
            layer.use_cpu_layout()
        return True


def plan_quantization(model_dir: Path, qc, keys: list[str], linears: dict[str, str],
                      quantization: str = 'none') -> QuantPlan | None:
    """Decide which checkpoint layers load quantized, and how.

    ``qc``: the config's ``quantization_config`` (``Qwen3VLConfig.quantization_config``, None
    for a float checkpoint); ``keys``: every checkpoint tensor name; ``linears``: checkpoint
    module name -> our module name, for each of the checkpoint's layers that is an
    ``nn.Linear`` in our model (the checkpoint names are what the config's targets and ignore
    list use); ``model_dir`` names the checkpoint in errors. Returns None for a plain float
    model.
    """
    if qc is not None:
        method = qc.get('quant_method') if isinstance(qc, dict) else None
        if quantization != 'none':
            raise ModelLoadError(
                f"{model_dir}: the checkpoint is already quantized ({method}); "
                f"quantization={quantization!r} applies to float checkpoints only (use 'none')")
        storage = DECLARED.get(method) if isinstance(method, str) else None
        if storage is None:
            raise unsupported(model_dir, qc if isinstance(qc, dict) else {}, 'unknown method')
        layers = storage.layers(model_dir, qc, keys, linears)
        kinds = sorted({f'{lq.cls.format}' + ('-asym' if lq.asymmetric else '')
                        for lq in layers.values()})
        return QuantPlan(layers, f"{method}:{'+'.join(kinds)}")
    if quantization == 'none':
        return None
    if quantization not in AT_LOAD_FORMATS:
        raise ValueError(f"quantization must be 'none' or one of {sorted(AT_LOAD_FORMATS)}, "
                         f"got {quantization!r}")
    lq = AT_LOAD.layer(*AT_LOAD_FORMATS[quantization])
    layers = {m: lq for m, ours in linears.items() if _DECODER_PROJ.match(ours)}
    if not layers:
        raise ModelLoadError(f'{model_dir}: no decoder projections found to quantize')
    return QuantPlan(layers, f'{lq.storage.name}:{quantization}')
