# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Quantized tiny checkpoints for the tests, written by independent code.

* :func:`compressed_tensors_checkpoint`: the ``compressed-tensors`` library itself quantizes a
  transformers model loaded from a tiny float checkpoint (min/max round-to-nearest scales from
  its own ``calculate_qparams``, the observer llm-compressor's RTN recipes use), packs it
  (``ModelCompressor``, "pack-quantized") and writes config + tensors as llm-compressor does.
* :func:`fp8_checkpoint`: Qwen's fine-grained FP8 layout built by hand (e4m3 bytes +
  ``weight_scale_inv`` per 128x128 block); :func:`e4m3_to_float` decodes e4m3 bits with
  integer arithmetic only (no torch float8), the test's independent dequantisation.
"""

import json
from pathlib import Path
import shutil

from safetensors.torch import load_file, save_file
import torch

E4M3_MAX = 448.0
BLOCK = 128


def _copy_aux(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.suffix != '.safetensors' and not (dst / f.name).exists():
            shutil.copy(f, dst / f.name)


def compressed_tensors_checkpoint(src: Path, dst: Path, bits: int, strategy: str,
                                  group_size: int | None = None, symmetric: bool = True,
                                  ignore=('lm_head', 're:.*visual.*')) -> Path:
    """Quantize ``src``'s Linear layers (but ``ignore``) with compressed-tensors into ``dst``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    import transformers

    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    args = QuantizationArgs(num_bits=bits, type='int', symmetric=symmetric, strategy=strategy,
                            group_size=group_size)
    scheme = QuantizationScheme(targets=['Linear'], weights=args)
    apply_quantization_config(model, QuantizationConfig(config_groups={'group_0': scheme},
                                                        ignore=list(ignore)))
    n = 0
    for _name, module in model.named_modules():
        if getattr(module, 'quantization_scheme', None) is None:
            continue
        w = module.weight.data
        w = w.unflatten(-1, (-1, group_size)) if strategy == 'group' else w[:, None]
        scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, 'weight_zero_point'):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
        n += 1
    assert n > 0
    compressor = ModelCompressor.from_pretrained_model(model, 'pack-quantized')
    compressor.compress_model(model)
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(dst)
    compressor.update_config(dst)
    _copy_aux(src, dst)
    return dst


def load_ct_reference(ckpt: Path):
    """Transformers' model of a compressed-tensors checkpoint, decompressed to dense fp32."""
    import transformers

    return transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32,
        quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)).eval()


def e4m3_to_float(bits: torch.Tensor) -> torch.Tensor:
    """OCP e4m3fn bytes -> fp32 by integer arithmetic.

    Sign, 4-bit exponent (bias 7), 3-bit mantissa, subnormals at exponent 0, 0x7f/0xff NaN.
    """
    b = bits.to(torch.int64)
    sign = torch.where(b & 0x80 != 0, -1.0, 1.0).double()
    exp = (b >> 3) & 0xF
    man = (b & 0x7).double()
    normal = (1.0 + man / 8.0) * torch.pow(2.0, (exp - 7).double())
    sub = man / 8.0 * 2.0 ** -6
    value = sign * torch.where(exp == 0, sub, normal)
    value = torch.where((b & 0x7F) == 0x7F, torch.nan, value)
    return value.float()


def fp8_checkpoint(src: Path, dst: Path, scale_dtype=torch.float32) -> tuple[Path, dict]:
    """Qwen-style FP8 copy of ``src`` (text decoder projections only).

    Also returns the fp32 dequantised weights ``{tensor name: dense weight}``, computed with
    :func:`e4m3_to_float`.
    """
    tensors = load_file(str(src / 'model.safetensors'))
    dense = {}
    out = {}
    for name, t in tensors.items():
        if '.language_model.layers.' in name and name.endswith('_proj.weight'):
            rows, cols = t.shape
            br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
            padded = torch.zeros(br * BLOCK, bc * BLOCK)
            padded[:rows, :cols] = t.float()
            amax = padded.view(br, BLOCK, bc, BLOCK).abs().amax(dim=(1, 3))
            s = (amax / E4M3_MAX).to(scale_dtype)
            full = s.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
            codes = (t.float() / full[:rows, :cols]).to(torch.float8_e4m3fn)
            out[name] = codes
            out[name.replace('.weight', '.weight_scale_inv')] = s
            dense[name] = e4m3_to_float(codes.view(torch.uint8)) * full[:rows, :cols]
        else:
            out[name] = t
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / 'model.safetensors'))
    _copy_aux(src, dst)
    cfg = json.loads((src / 'config.json').read_text())
    cfg['quantization_config'] = {
        'quant_method': 'fp8', 'fmt': 'e4m3', 'activation_scheme': 'dynamic',
        'weight_block_size': [BLOCK, BLOCK], 'modules_to_not_convert': ['lm_head', 'visual'],
    }
    (dst / 'config.json').write_text(json.dumps(cfg, indent=2))
    return dst, dense
