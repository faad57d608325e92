# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""RGB images to Qwen3-VL pixel patches, bit-for-bit like transformers' Qwen2VLImageProcessorPil.

The reference path, which every step here mirrors: the uint8 image is resized by Pillow
(``Image.resize`` with BICUBIC, so in uint8 with Pillow's own rounding and clipping), rescaled in
float64 by ``rescale_factor`` and cast to float32, normalised in float32 as ``(x - mean) / std``,
duplicated to ``temporal_patch_size`` frames and cut into patches ordered
``(merge row, merge col, row in window, col in window)`` with each patch flattened as
``(C, T, py, px)``.
"""

from dataclasses import dataclass, replace
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image
import torch

__all__ = ['ImageProcessor', 'ProcessedImage', 'smart_resize']

MAX_ASPECT_RATIO = 200


def smart_resize(
    height: int, width: int, factor: int = 32, min_pixels: int = 256 * 256,
    max_pixels: int = 4096 * 4096,
) -> tuple[int, int]:
    """
    Return the ``(height, width)`` the reference resizes an image to.

    Both sides become multiples of ``factor`` (patch size times merge size) and the area is
    brought inside ``[min_pixels, max_pixels]`` keeping the aspect ratio as well as possible —
    the same arithmetic as transformers' ``smart_resize`` (Python's round-half-even included).
    Raises ``ValueError`` for an empty image or an aspect ratio above 200.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f'image has zero size: {height}x{width}')
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f'image aspect ratio {ratio:.1f} ({height}x{width}) exceeds {MAX_ASPECT_RATIO}'
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _first(*values):
    return next((v for v in values if v is not None), None)


@dataclass(frozen=True)
class ProcessedImage:
    """
    One preprocessed image.

    ``pixel_values``: float32 ``[t*h*w, 3 * temporal_patch_size * patch_size**2]`` patches;
    ``grid_thw``: the patch grid ``(1, H / patch, W / patch)``; ``num_tokens``: how many
    ``<|image_pad|>`` tokens (merged patches) the image takes in the prompt; ``image``: the
    uint8 RGB image at the size the model sees (what the patches were cut from).
    """

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    num_tokens: int
    image: np.ndarray


@dataclass(frozen=True)
class ImageProcessor:
    """
    Resize, rescale, normalise and patchify RGB uint8 images for the Qwen3-VL vision tower.

    Defaults are the Qwen3-VL checkpoints' (``preprocessor_config.json``); robots usually pass
    a much lower ``max_pixels``. ``resample`` is a Pillow filter number (3 = BICUBIC).
    """

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 256 * 256
    max_pixels: int = 4096 * 4096
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = int(Image.Resampling.BICUBIC)

    def __post_init__(self):
        for name in ('patch_size', 'temporal_patch_size', 'merge_size', 'min_pixels'):
            if int(getattr(self, name)) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.max_pixels < self.factor * self.factor:
            raise ValueError(
                f'max_pixels {self.max_pixels} is below one merged patch '
                f'({self.factor}x{self.factor} = {self.factor * self.factor})'
            )
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f'min_pixels {self.min_pixels} is larger than max_pixels {self.max_pixels}'
            )
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f'mean and std need 3 values each, got {self.mean} and {self.std}')
        if any(s == 0 for s in self.std):
            raise ValueError(f'std must not contain zeros, got {self.std}')
        object.__setattr__(self, 'mean', tuple(float(m) for m in self.mean))
        object.__setattr__(self, 'std', tuple(float(s) for s in self.std))
        Image.Resampling(self.resample)  # ValueError for an unknown filter

    @property
    def factor(self) -> int:
        """Side multiple of a resized image: patch size times merge size."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_pretrained(
        cls, model_dir, min_pixels: int | None = None, max_pixels: int | None = None,
    ) -> 'ImageProcessor':
        """
        Read ``preprocessor_config.json`` from a checkpoint directory.

        Pixel bounds come from ``size`` (``shortest_edge`` / ``longest_edge``, the names the
        reference uses for min/max pixels) or top-level ``min_pixels`` / ``max_pixels`` (these
        win, as in the reference); the arguments override both.
        """
        path = Path(model_dir) / 'preprocessor_config.json'
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f'no preprocessor_config.json in {model_dir}') from None
        size = cfg.get('size') or {}
        lo = _first(cfg.get('min_pixels'), size.get('shortest_edge'), size.get('min_pixels'))
        hi = _first(cfg.get('max_pixels'), size.get('longest_edge'), size.get('max_pixels'))
        defaults = cls()
        kwargs = {
            'patch_size': int(cfg.get('patch_size', defaults.patch_size)),
            'temporal_patch_size': int(
                cfg.get('temporal_patch_size', defaults.temporal_patch_size)
            ),
            'merge_size': int(cfg.get('merge_size', defaults.merge_size)),
            'min_pixels': int(_first(min_pixels, lo, defaults.min_pixels)),
            'max_pixels': int(_first(max_pixels, hi, defaults.max_pixels)),
            'mean': tuple(cfg.get('image_mean', defaults.mean)),
            'std': tuple(cfg.get('image_std', defaults.std)),
            'rescale_factor': float(cfg.get('rescale_factor', defaults.rescale_factor)),
            'resample': int(cfg.get('resample', defaults.resample)),
        }
        return cls(**kwargs)

    def capped(self, max_pixels: int | None = None,
               min_pixels: int | None = None) -> 'ImageProcessor':
        """
        A copy with a deployment's pixel bounds applied on top of the checkpoint's.

        ``max_pixels`` is a cost cap: it lowers the checkpoint's maximum but never raises it (a
        model trained at a fixed resolution, such as the embedded demo checkpoint, must not be
        fed images many times larger than it has seen). ``min_pixels`` replaces the minimum;
        the minimum is then lowered to the maximum where it would exceed it. None keeps a bound.
        """
        hi = self.max_pixels if max_pixels is None else min(int(max_pixels), self.max_pixels)
        lo = self.min_pixels if min_pixels is None else int(min_pixels)
        return replace(self, min_pixels=min(lo, hi), max_pixels=hi)

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """Return the ``(height, width)`` an image of this size is resized to."""
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def num_tokens(self, height: int, width: int) -> int:
        """Return how many image pad tokens an image of this size takes."""
        h, w = self.target_size(height, width)
        return (h // self.factor) * (w // self.factor)

    def resize(self, rgb: np.ndarray) -> np.ndarray:
        """Return ``rgb`` (``H x W x 3`` uint8) at the size the model sees, as a new array.

        This is all that re-prefilling the image needs: ``patchify`` of it gives the same
        patches as ``preprocess`` of the original, bit for bit.
        """
        if not isinstance(rgb, np.ndarray):
            raise ValueError(f'image must be a numpy array, got {type(rgb).__name__}')
        if rgb.dtype != np.uint8:
            raise ValueError(f'image must be uint8, got dtype {rgb.dtype}')
        if rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f'image must be H x W x 3 (RGB), got shape {tuple(rgb.shape)}')
        height, width = rgb.shape[:2]
        new_h, new_w = self.target_size(height, width)
        # Pillow resizes uint8 in uint8 (rounding and clipping inside), exactly the reference.
        pil = Image.fromarray(np.ascontiguousarray(rgb))
        if (new_h, new_w) != (height, width):
            pil = pil.resize((new_w, new_h), resample=self.resample)
        return np.array(pil)  # a copy: never a view of the caller's frame

    def patchify(self, resized: np.ndarray) -> ProcessedImage:
        """Pixel patches of an image ``resize`` returned (no second resize)."""
        height, width = resized.shape[:2]
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        if height % self.factor or width % self.factor:
            raise ValueError(f'patchify needs sides that are multiples of {self.factor}, got '
                             f'{height}x{width} (resize the image first)')

        # Rescale in float64 then cast, normalise in float32: the reference's order and dtypes.
        x = (resized.astype(np.float64) * self.rescale_factor).astype(np.float32)
        x = (x - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)

        gh, gw = height // p, width // p
        x = x.reshape(gh // m, m, p, gw // m, m, p, 3)
        # -> (merge row, merge col, row in window, col in window, C, py, px)
        x = x.transpose(0, 3, 1, 4, 6, 2, 5)
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
        patches = torch.from_numpy(np.ascontiguousarray(x).reshape(gh * gw, 3 * t * p * p))
        return ProcessedImage(
            pixel_values=patches, grid_thw=(1, gh, gw), num_tokens=gh * gw // (m * m),
            image=resized,
        )

    def preprocess(self, rgb: np.ndarray) -> ProcessedImage:
        """Turn one ``H x W x 3`` uint8 RGB array into pixel patches and its grid."""
        return self.patchify(self.resize(rgb))
