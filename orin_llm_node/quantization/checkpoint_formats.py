# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""How quantized weights are stored in a checkpoint: each format describes itself.

A :class:`CheckpointFormat` says which tensors one quantized layer needs (:meth:`~CheckpointFormat.
tensors`), how they become rows of a :class:`~orin_llm_node.quantization.base.QuantLinear`
(:meth:`~CheckpointFormat.load`) and, for a format a checkpoint declares in its
``quantization_config``, which of its layers it covers (:meth:`~CheckpointFormat.layers`).
``checkpoint.plan_quantization`` picks the format from the config's ``quant_method``
(:data:`DECLARED`) or ``EngineConfig.quantization`` (:data:`AT_LOAD`) and asks it; nothing
switches on a format's name or a layer class.

* **quantize-at-load** (:class:`QuantizeAtLoad`): a float checkpoint's ``weight``, rounded to
  nearest as it is read; the group is the layer class's own (``QuantLinear.at_load_group``).
* **compressed-tensors "pack-quantized"** (:class:`PackQuantized`, what llm-compressor writes
  for W4A16 / W8A16 GPTQ, AWQ or RTN recipes): ``weight_packed`` int32 (``32 / bits`` codes
  per word, stored as ``q + 2^(bits-1)``), ``weight_scale [out, G]``, ``weight_zero_point``
  (asymmetric only, packed along the *output* dim), ``weight_shape``. The config's
  ``config_groups`` (targets, bits, strategy ``group`` / ``channel``, symmetry) and ``ignore``
  list say which layers are quantized; the tensors must agree.
* **fine-grained FP8** (:class:`BlockFp8`, Qwen's own ``-FP8`` checkpoints: ``quant_method:
  "fp8"``, ``weight_block_size: [128, 128]``): e4m3 ``weight`` + ``weight_scale_inv`` per
  128x128 block.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
import re
from typing import ClassVar

import torch

from orin_llm_node.errors import ModelLoadError

from .base import QuantLinear
from .fp8 import BLOCK, Fp8Linear, block_scales_to_rows
from .int4 import Int4Linear, unpack_int4
from .int8 import Int8Linear

__all__ = ['AT_LOAD', 'DECLARED', 'BlockFp8', 'CheckpointFormat', 'LayerQuant', 'PackQuantized',
           'QuantizeAtLoad', 'unsupported']

_SUPPORTED = ('compressed-tensors pack-quantized INT4/INT8 weight-only (W4A16, W8A16), '
              'fp8 with weight_block_size [128, 128]')


class CheckpointFormat(ABC):
    """One way a checkpoint stores the weight of a quantized linear layer."""

    #: How ``weight_format`` names it: ``at-load``, or the config's ``quant_method``.
    name: ClassVar[str]

    @abstractmethod
    def tensors(self, asymmetric: bool) -> frozenset[str]:
        """The tensor suffixes one layer (one part of a merged layer) needs to load."""

    @abstractmethod
    def load(self, tensors: dict[str, torch.Tensor], layer: QuantLinear, row0: int) -> int:
        """Fill rows ``row0...`` of ``layer`` from a part's ``tensors``; returns the row count.

        ``ValueError``: the tensors do not fit the layer.
        """

    def layers(self, model_dir: Path, qc: dict, keys: list[str],
               linears: dict[str, str]) -> dict[str, 'LayerQuant']:
        """Checkpoint layer -> :class:`LayerQuant` for a checkpoint declaring this format.

        ``qc``: its ``quantization_config``; ``keys``: every tensor name; ``linears``: the
        checkpoint's linear layers (checkpoint name -> ours).
        """
        raise NotImplementedError(f'{self.name} is not a format a checkpoint declares')


@dataclass(frozen=True)
class LayerQuant:
    """How one checkpoint linear layer is stored and which layer class holds it."""

    cls: type[QuantLinear]
    group_size: int | None  # None: per output channel (one group of all input columns)
    asymmetric: bool
    storage: CheckpointFormat

    def make(self, in_features: int, out_features: int, bias: bool = False) -> QuantLinear:
        """A quantized layer of this shape (on the current default device)."""
        return self.cls(in_features, out_features, group_size=self.group_size or in_features,
                        bias=bias, asymmetric=self.asymmetric)

    @property
    def tensors(self) -> frozenset[str]:
        """The tensor suffixes the layer needs before it can be loaded."""
        return self.storage.tensors(self.asymmetric)


def unsupported(model_dir: Path, qc: dict, why: str) -> ModelLoadError:
    """The one-sentence error for a ``quantization_config`` this package cannot load."""
    method, fmt = qc.get('quant_method'), qc.get('format')
    return ModelLoadError(
        f'{model_dir}: quantization_config (quant_method={method!r}, format={fmt!r}) is not '
        f'supported: {why}; supported: {_SUPPORTED}, or a float checkpoint')


def _modules_with(keys: list[str], suffix: str) -> list[str]:
    # The layers (checkpoint names) that have a tensor ``<layer>.<suffix>``, in key order.
    return list(dict.fromkeys(k[:-len(suffix) - 1] for k in keys if k.endswith('.' + suffix)))


def _match(name: str, target: str) -> bool:
    """compressed-tensors' name matching: ``re:<pattern>`` (re.match) or the exact name."""
    if target.startswith('re:'):
        return re.match(target[3:], name) is not None
    return name == target


class QuantizeAtLoad(CheckpointFormat):
    """A float ``weight``, rounded to nearest into the layer's format as it is read."""

    name = 'at-load'

    def tensors(self, asymmetric):
        """Just the float weight."""
        return frozenset({'weight'})

    def load(self, tensors, layer, row0):
        """Quantize the part's weight into its rows."""
        return layer.quantize_from(tensors['weight'].to(layer.qweight.device), row0)

    def layer(self, cls: type[QuantLinear], asymmetric: bool) -> LayerQuant:
        """How a float layer is quantized into ``cls`` (the class's own at-load group)."""
        return LayerQuant(cls, cls.at_load_group, asymmetric, self)


def _unpack_dense(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """compressed-tensors' dense int32 packing (bits 4 or 8) -> unsigned codes ``[rows, cols]``."""
    if bits == 4:
        return unpack_int4(packed, cols)
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
    return ((packed[..., None] >> shifts) & 0xFF).flatten(-2)[..., :cols].to(torch.uint8)


class PackQuantized(CheckpointFormat):
    """compressed-tensors' ``pack-quantized`` INT4 / INT8 weights (module docstring)."""

    name = 'compressed-tensors'
    #: Layer class by ``num_bits``.
    CLASSES: ClassVar[dict[int, type[QuantLinear]]] = {4: Int4Linear, 8: Int8Linear}

    def tensors(self, asymmetric):
        """Codes, scales and the dense shape (and zero points when asymmetric)."""
        names = {'weight_packed', 'weight_scale', 'weight_shape'}
        return frozenset(names | ({'weight_zero_point'} if asymmetric else set()))

    def load(self, tensors, layer, row0):
        """Check the shapes, unpack what differs from our layout, copy the rows."""
        t = tensors
        shape = [int(v) for v in t['weight_shape'].tolist()]
        rows = t['weight_scale'].shape[0]
        if shape != [rows, layer.in_features]:
            raise ValueError(f'weight_shape {shape} does not fit {rows} rows of '
                             f'{layer.in_features} input features')
        if tuple(t['weight_scale'].shape) != (rows, layer.num_groups):
            raise ValueError(f"weight_scale has shape {list(t['weight_scale'].shape)}, expected "
                             f"[{rows}, {layer.num_groups}] (group size {layer.group_size})")
        out = {'scale': t['weight_scale'].float()}
        if layer.bits == 4:
            want = (rows, -(-layer.in_features // 8))
            if tuple(t['weight_packed'].shape) != want:
                raise ValueError(f"weight_packed has shape {list(t['weight_packed'].shape)}, "
                                 f"expected {list(want)}")
            out['qweight'] = t['weight_packed']  # the same nibble layout as Int4Linear's
        else:
            out['qweight'] = (_unpack_dense(t['weight_packed'], 8, layer.in_features)
                              .to(torch.int16) - 128).to(torch.int8)
        if layer.asymmetric:
            zp = t['weight_zero_point']
            # Packed along the output dim, as unsigned q + 2^(bits-1): our zero point domain.
            out['zero'] = _unpack_dense(zp.t().contiguous(), layer.bits, rows).t().contiguous()
        return layer.load_rows(out, row0)

    def layers(self, model_dir, qc, keys, linears):
        """The config's groups matched against the layers; the packed tensors must agree."""
        fmt = qc.get('format')
        groups = qc.get('config_groups') or {}
        if not groups:
            raise unsupported(model_dir, qc, 'no config_groups')
        schemes = []
        for name, g in groups.items():
            fmt_g = g.get('format') or fmt
            w = g.get('weights') or {}
            if fmt_g != 'pack-quantized':
                raise unsupported(model_dir, qc, f'group {name} has format {fmt_g!r}')
            if g.get('input_activations') or g.get('output_activations'):
                raise unsupported(model_dir, qc, f'group {name} quantizes activations '
                                                 '(only weight-only schemes run here)')
            bits = w.get('num_bits')
            if w.get('type') != 'int' or bits not in tuple(self.CLASSES) or w.get('dynamic'):
                raise unsupported(model_dir, qc, f"group {name} has weights {w.get('type')!r} "
                                                 f"{w.get('num_bits')}-bit")
            strategy, gs = w.get('strategy'), w.get('group_size')
            if strategy not in ('group', 'channel') or (strategy == 'group' and not gs):
                raise unsupported(model_dir, qc, f'group {name} has strategy {strategy!r}')
            asym = not w.get('symmetric', True)
            if asym and w['num_bits'] == 8:
                raise unsupported(model_dir, qc, f'group {name} is asymmetric INT8')
            lq = LayerQuant(self.CLASSES[w['num_bits']], gs if strategy == 'group' else None,
                            asym, self)
            schemes.append((g.get('targets') or [], lq))
        ignore = qc.get('ignore') or []
        plan = {}
        for module in linears:
            if any(_match(module, i) for i in ignore):
                continue
            for targets, lq in schemes:
                if any(t == 'Linear' or _match(module, t) for t in targets):
                    plan[module] = lq
                    break
        packed = set(_modules_with(keys, 'weight_packed'))
        if packed != set(plan):
            extra, missing = sorted(packed - set(plan)), sorted(set(plan) - packed)
            raise ModelLoadError(
                f'{model_dir}: quantization_config and tensors disagree: packed but not '
                f'targeted (or ignored): {extra[:3]}; targeted but not packed: {missing[:3]}')
        if any(k.endswith('.weight_g_idx') for k in keys):
            raise unsupported(model_dir, qc, 'activation-ordered groups (weight_g_idx)')
        return plan


class BlockFp8(CheckpointFormat):
    """Fine-grained FP8: e4m3 ``weight`` and a ``weight_scale_inv`` per 128x128 block."""

    name = 'fp8'

    def tensors(self, asymmetric):
        """The e4m3 codes and their block scales."""
        return frozenset({'weight', 'weight_scale_inv'})

    def load(self, tensors, layer, row0):
        """The codes as they are; each block's scale repeated over its rows."""
        w, scales = tensors['weight'], tensors['weight_scale_inv']
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f'fp8 weight has dtype {w.dtype}, expected float8_e4m3fn')
        rows, cols = w.shape
        grid = (-(-rows // BLOCK), -(-cols // BLOCK))
        if tuple(scales.shape) != grid:
            raise ValueError(f'weight_scale_inv has shape {list(scales.shape)}, 128x128 blocks '
                             f'of {[rows, cols]} need {list(grid)}')
        return layer.load_rows({'qweight': w.view(torch.uint8),
                         'scale': block_scales_to_rows(scales, rows)}, row0)

    def layers(self, model_dir, qc, keys, linears):
        """Every layer with block scales; none of them among those the config keeps dense."""
        if qc.get('weight_block_size') != [BLOCK, BLOCK]:
            raise unsupported(model_dir, qc, f"weight_block_size {qc.get('weight_block_size')} "
                                             f"(need [{BLOCK}, {BLOCK}])")
        if qc.get('fmt', 'e4m3') != 'e4m3':
            raise unsupported(model_dir, qc, f"fmt {qc.get('fmt')!r}")
        lq = LayerQuant(Fp8Linear, BLOCK, False, self)
        plan = dict.fromkeys(_modules_with(keys, 'weight_scale_inv'), lq)
        skip = qc.get('modules_to_not_convert') or []
        bad = [m for m in plan if any(s in m for s in skip)]
        if bad:
            raise ModelLoadError(f'{model_dir}: fp8 tensors for layers the config keeps dense: '
                                 f'{bad[:3]}')
        return plan


#: The quantize-at-load format.
AT_LOAD = QuantizeAtLoad()
#: The formats a checkpoint may declare, by its ``quantization_config.quant_method``.
DECLARED: dict[str, CheckpointFormat] = {f.name: f for f in (PackQuantized(), BlockFp8())}
