# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Which linear layers of a checkpoint are quantized, in which format, and how to load them.

Three sources, decided once from ``config.json`` and the tensor names before any weight is
allocated (so a quantized model never materialises a dense copy):

* **quantize-at-load** (``quantization="int8" | "int4" | "int4_asym" | "fp8"`` on a float
  checkpoint): the text decoder's projections are rounded to nearest as they are read; no
  calibration data, no randomness.
* **compressed-tensors "pack-quantized"** (what llm-compressor writes for W4A16 / W8A16 GPTQ,
  AWQ or RTN recipes): ``weight_packed`` int32 (``32 / bits`` codes per word, stored as
  ``q + 2^(bits-1)``), ``weight_scale [out, G]``, ``weight_zero_point`` (asymmetric only,
  packed along the *output* dim), ``weight_shape``. The config's ``config_groups`` (targets,
  bits, strategy ``group`` / ``channel``, symmetry) and ``ignore`` list say which layers are
  quantized; the tensors must agree.
* **fine-grained FP8** (Qwen's own ``-FP8`` checkpoints: ``quant_method: "fp8"``,
  ``weight_block_size: [128, 128]``): e4m3 ``weight`` + ``weight_scale_inv`` per 128x128 block.

Anything else that declares a ``quantization_config`` fails with one sentence.
"""

from dataclasses import dataclass
from pathlib import Path
import re

import torch

from orin_llm_node.errors import ModelLoadError

from . import AT_LOAD_FORMATS
from .base import QuantLinear
from .fp8 import BLOCK, Fp8Linear, block_scales_to_rows
from .int4 import Int4Linear, unpack_int4
from .int8 import Int8Linear

__all__ = [
    "LayerQuant",
    "QuantPlan",
    "plan_quantization",
]

#: Group size of quantize-at-load INT4 (layers with fewer input columns use one group per row).
INT4_GROUP = 128
#: Our module names that quantize-at-load converts: the text decoder's projections.
_DECODER_PROJ = re.compile(r"^language_model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj$")
_SUPPORTED = ("compressed-tensors pack-quantized INT4/INT8 weight-only (W4A16, W8A16), "
              "fp8 with weight_block_size [128, 128]")


@dataclass(frozen=True)
class LayerQuant:
    """How one checkpoint linear layer is stored and which layer class holds it."""

    cls: type[QuantLinear]
    group_size: int | None  # None: per output channel (one group of all input columns)
    asymmetric: bool
    source: str  # "at-load", "compressed-tensors" or "fp8"

    def make(self, in_features: int, out_features: int, bias: bool = False) -> QuantLinear:
        """A quantized layer of this shape (on the current default device)."""
        return self.cls(in_features, out_features, group_size=self.group_size or in_features,
                        bias=bias, asymmetric=self.asymmetric)


def _hf_module(key: str, suffixes: tuple[str, ...]) -> str | None:
    for s in suffixes:
        if key.endswith("." + s):
            return key[: -len(s) - 1]
    return None


def _match(name: str, target: str) -> bool:
    """compressed-tensors' name matching: ``re:<pattern>`` (re.match) or the exact name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def _unsupported(model_dir: Path, qc: dict, why: str) -> ModelLoadError:
    method, fmt = qc.get("quant_method"), qc.get("format")
    return ModelLoadError(
        f"{model_dir}: quantization_config (quant_method={method!r}, format={fmt!r}) is not "
        f"supported: {why}; supported: {_SUPPORTED}, or a float checkpoint")


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
        module, _, suffix = key.rpartition(".")
        lq = self.layers.get(module)
        if lq is None or suffix == "bias":
            return None
        return module, suffix

    def expected(self, module: str) -> set[str]:
        """The tensor suffixes a layer needs before it can be loaded."""
        lq = self.layers[module]
        if lq.source == "at-load":
            return {"weight"}
        if lq.source == "fp8":
            return {"weight", "weight_scale_inv"}
        return {"weight_packed", "weight_scale", "weight_shape"} | (
            {"weight_zero_point"} if lq.asymmetric else set())

    def add(self, module: str, suffix: str, tensor: torch.Tensor,
            layer: QuantLinear, row0: int = 0) -> bool:
        """Collect one tensor; load the layer's rows once all its tensors are in.

        A CPU layer whose rows are all in moves to the CPU layout
        (``QuantLinear.use_cpu_layout``). Returns True when the layer part was loaded.
        """
        want = self.expected(module)
        if suffix not in want:
            raise ModelLoadError(f"{module}.{suffix}: unexpected tensor for a "
                                 f"{self.layers[module].source} {layer.format} layer")
        got = self._pending.setdefault(module, {})
        got[suffix] = tensor
        if set(got) != want:
            return False
        del self._pending[module]
        try:
            rows = self._load(module, got, layer, row0)
        except ValueError as e:
            raise ModelLoadError(f"{module}: {e}") from None
        self._rows[layer] = self._rows.get(layer, 0) + rows
        if self._rows[layer] == layer.out_features and layer.qweight.device.type == "cpu":
            layer.use_cpu_layout()
        return True

    def incomplete(self) -> list[str]:
        """Layers with some but not all of their tensors (after every file was read)."""
        return [f"{m}.{s}" for m, got in self._pending.items()
                for s in self.expected(m) - set(got)]

    def _load(self, module: str, t: dict, layer: QuantLinear, row0: int) -> int:
        """Load one part into ``layer``'s rows ``row0...``; returns its number of rows."""
        lq = self.layers[module]
        dev = layer.qweight.device
        if lq.source == "at-load":
            return layer.quantize_from(t["weight"].to(dev), row0)
        if lq.source == "fp8":
            w = t["weight"]
            if w.dtype != torch.float8_e4m3fn:
                raise ValueError(f"fp8 weight has dtype {w.dtype}, expected float8_e4m3fn")
            rows, cols = w.shape
            grid = (-(-rows // BLOCK), -(-cols // BLOCK))
            if tuple(t["weight_scale_inv"].shape) != grid:
                raise ValueError(f"weight_scale_inv has shape {list(t['weight_scale_inv'].shape)}"
                                 f", 128x128 blocks of {[rows, cols]} need {list(grid)}")
            return layer.load_rows({"qweight": w.view(torch.uint8),
                                    "scale": block_scales_to_rows(t["weight_scale_inv"], rows)},
                                   row0)
        return layer.load_rows(_from_pack_quantized(t, layer), row0)


def _unpack_dense(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """compressed-tensors' dense int32 packing (bits 4 or 8) -> unsigned codes ``[rows, cols]``."""
    if bits == 4:
        return unpack_int4(packed, cols)
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
    return ((packed[..., None] >> shifts) & 0xFF).flatten(-2)[..., :cols].to(torch.uint8)


def _from_pack_quantized(t: dict, layer: QuantLinear) -> dict[str, torch.Tensor]:
    shape = [int(v) for v in t["weight_shape"].tolist()]
    rows = t["weight_scale"].shape[0]
    if shape != [rows, layer.in_features]:
        raise ValueError(f"weight_shape {shape} does not fit {rows} rows of "
                         f"{layer.in_features} input features")
    if tuple(t["weight_scale"].shape) != (rows, layer.num_groups):
        raise ValueError(f"weight_scale has shape {list(t['weight_scale'].shape)}, expected "
                         f"[{rows}, {layer.num_groups}] (group size {layer.group_size})")
    out = {"scale": t["weight_scale"].float()}
    if layer.bits == 4:
        want = (rows, -(-layer.in_features // 8))
        if tuple(t["weight_packed"].shape) != want:
            raise ValueError(f"weight_packed has shape {list(t['weight_packed'].shape)}, "
                             f"expected {list(want)}")
        out["qweight"] = t["weight_packed"]  # the same nibble layout as Int4Linear's
    else:
        out["qweight"] = (_unpack_dense(t["weight_packed"], 8, layer.in_features).to(torch.int16)
                          - 128).to(torch.int8)
    if layer.asymmetric:
        zp = t["weight_zero_point"]
        # Packed along the output dim, as unsigned q + 2^(bits-1): our zero point domain.
        out["zero"] = _unpack_dense(zp.t().contiguous(), layer.bits, rows).t().contiguous()
    return out


def _compressed_tensors(model_dir: Path, qc: dict, keys: list[str],
                        linears: dict[str, str]) -> dict[str, LayerQuant]:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise _unsupported(model_dir, qc, "no config_groups")
    schemes = []
    for name, g in groups.items():
        fmt_g = g.get("format") or fmt
        w = g.get("weights") or {}
        if fmt_g != "pack-quantized":
            raise _unsupported(model_dir, qc, f"group {name} has format {fmt_g!r}")
        if g.get("input_activations") or g.get("output_activations"):
            raise _unsupported(model_dir, qc, f"group {name} quantizes activations "
                                              "(only weight-only schemes run here)")
        if w.get("type") != "int" or w.get("num_bits") not in (4, 8) or w.get("dynamic"):
            raise _unsupported(model_dir, qc, f"group {name} has weights {w.get('type')!r} "
                                              f"{w.get('num_bits')}-bit")
        strategy, gs = w.get("strategy"), w.get("group_size")
        if strategy not in ("group", "channel") or (strategy == "group" and not gs):
            raise _unsupported(model_dir, qc, f"group {name} has strategy {strategy!r}")
        asym = not w.get("symmetric", True)
        if asym and w["num_bits"] == 8:
            raise _unsupported(model_dir, qc, f"group {name} is asymmetric INT8")
        cls = Int4Linear if w["num_bits"] == 4 else Int8Linear
        lq = LayerQuant(cls, gs if strategy == "group" else None, asym, "compressed-tensors")
        schemes.append((g.get("targets") or [], lq))
    ignore = qc.get("ignore") or []
    plan = {}
    for module in linears:
        if any(_match(module, i) for i in ignore):
            continue
        for targets, lq in schemes:
            if any(t == "Linear" or _match(module, t) for t in targets):
                plan[module] = lq
                break
    packed = {_hf_module(k, ("weight_packed",)) for k in keys} - {None}
    if packed != set(plan):
        extra, missing = sorted(packed - set(plan)), sorted(set(plan) - packed)
        raise ModelLoadError(
            f"{model_dir}: quantization_config and tensors disagree: packed but not targeted "
            f"(or ignored): {extra[:3]}; targeted but not packed: {missing[:3]}")
    if any(k.endswith(".weight_g_idx") for k in keys):
        raise _unsupported(model_dir, qc, "activation-ordered groups (weight_g_idx)")
    return plan


def _fp8(model_dir: Path, qc: dict, keys: list[str]) -> dict[str, LayerQuant]:
    if qc.get("weight_block_size") != [BLOCK, BLOCK]:
        raise _unsupported(model_dir, qc, f"weight_block_size {qc.get('weight_block_size')} "
                                          f"(need [{BLOCK}, {BLOCK}])")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise _unsupported(model_dir, qc, f"fmt {qc.get('fmt')!r}")
    lq = LayerQuant(Fp8Linear, BLOCK, False, "fp8")
    plan = {m: lq for m in (_hf_module(k, ("weight_scale_inv",)) for k in keys) if m}
    skip = qc.get("modules_to_not_convert") or []
    bad = [m for m in plan if any(s in m for s in skip)]
    if bad:
        raise ModelLoadError(f"{model_dir}: fp8 tensors for layers the config keeps dense: "
                             f"{bad[:3]}")
    return plan


def plan_quantization(model_dir: Path, qc, keys: list[str], linears: dict[str, str],
                      quantization: str = "none") -> QuantPlan | None:
    """Decide which checkpoint layers load quantized, and how.

    ``qc``: the config's ``quantization_config`` (``Qwen3VLConfig.quantization_config``, None
    for a float checkpoint); ``keys``: every checkpoint tensor name; ``linears``: checkpoint
    module name -> our module name, for each of the checkpoint's layers that is an
    ``nn.Linear`` in our model (the checkpoint names are what the config's targets and ignore
    list use); ``model_dir`` names the checkpoint in errors. Returns None for a plain float
    model.
    """
    if qc is not None:
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        if quantization != "none":
            raise ModelLoadError(
                f"{model_dir}: the checkpoint is already quantized ({method}); "
                f"quantization={quantization!r} applies to float checkpoints only (use 'none')")
        if method == "compressed-tensors":
            layers = _compressed_tensors(model_dir, qc, keys, linears)
        elif method == "fp8":
            layers = _fp8(model_dir, qc, keys)
        else:
            raise _unsupported(model_dir, qc if isinstance(qc, dict) else {}, "unknown method")
        kinds = sorted({f"{lq.cls.format}" + ("-asym" if lq.asymmetric else "")
                        for lq in layers.values()})
        return QuantPlan(layers, f"{method}:{'+'.join(kinds)}")
    if quantization == "none":
        return None
    if quantization not in AT_LOAD_FORMATS:
        raise ValueError(f"quantization must be 'none' or one of {sorted(AT_LOAD_FORMATS)}, "
                         f"got {quantization!r}")
    cls, asym = AT_LOAD_FORMATS[quantization]
    group = INT4_GROUP if cls is Int4Linear else (BLOCK if cls is Fp8Linear else None)
    lq = LayerQuant(cls, group, asym, "at-load")
    layers = {m: lq for m, ours in linears.items() if _DECODER_PROJ.match(ours)}
    if not layers:
        raise ModelLoadError(f"{model_dir}: no decoder projections found to quantize")
    return QuantPlan(layers, f"at-load:{quantization}")
