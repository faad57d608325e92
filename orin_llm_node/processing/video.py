# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Short video clips to Qwen3-VL pixel patches, like transformers' Qwen3VLVideoProcessor.

Every step mirrors the reference (transformers 5.23.0 ``Qwen3VLVideoProcessor`` on the CPU):

* frames are sampled at ``fps`` with the reference's rule (``int(n / source_fps * fps)`` frames,
  at least ``min_frames``, at most ``max_frames`` and ``n``, picked at
  ``linspace(0, n - 1, k).round()``); a clip no denser than ``fps`` is used as it is.  The
  source rate is the clip's own, from its stamps in exact arithmetic (``fractions.Fraction``),
  so the clock's origin never changes which frames are taken;
* the size comes from the video ``smart_resize``: its pixel bounds are for the *whole clip*
  (``frames x height x width``), not one frame;
* the resize is torchvision's tensor resize on the CPU, which is
  ``torch.nn.functional.interpolate`` on the uint8 frames (mode bicubic, ``antialias=True``,
  ``align_corners=False``, no float round trip): the same call here, so the pixels are the
  reference's bit for bit;
* rescale and normalise fused in float32: ``(x - mean / rescale) / (std / rescale)``;
* an odd frame count is padded by repeating the last frame up to ``temporal_patch_size``; each
  temporal group of ``temporal_patch_size`` frames is one grid step ``t``;
* each group is introduced in the prompt by the text ``<{time:.1f} seconds>``, the mean of its
  first and last frame's time (the padded frames repeat the last time).

The clip keeps only what a re-prefill needs: the sampled frames at the size the model sees.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
import hashlib
import json
import math
import numbers
from pathlib import Path

import numpy as np
from PIL import Image
import torch
import torch.nn.functional as F

from orin_llm_node.processing.image import MAX_ASPECT_RATIO

__all__ = ['ProcessedVideo', 'VideoClip', 'VideoProcessor', 'video_key', 'video_smart_resize']

#: How well a stamp is known at best: to the nanosecond, ROS's resolution (a camera driver
#: rounds or truncates to it).
STAMP_RESOLUTION_S = Fraction(1, 10**9)


def exact_seconds(values: Sequence) -> tuple[Fraction, ...]:
    """``values`` (seconds: ints, floats, Fractions, numpy scalars) as exact Fractions.

    A float is taken at its exact binary value; ``Fraction(stamp_ns, 10**9)`` keeps a ROS stamp
    exact however far its clock is from 0.  ``ValueError`` for a non-number or a non-finite one.
    """
    values = list(values)
    try:
        floats = [float(t) for t in values]
    except (TypeError, ValueError):
        raise ValueError('video timestamps must be numbers (seconds)') from None
    if not all(math.isfinite(f) for f in floats):
        raise ValueError(f'video timestamps must be finite, got {tuple(floats)}')
    return tuple(Fraction(t) if isinstance(t, numbers.Rational) else Fraction(f)
                 for t, f in zip(values, floats, strict=True))


def stamp_slack(t: Fraction) -> Fraction:
    """How far the true time of a stamp ``t`` may be from it (seconds).

    Half a nanosecond, or half the spacing of floats there where that is coarser (a float of a
    stamp far from 0).
    """
    return max(STAMP_RESOLUTION_S, Fraction(math.ulp(float(t)))) / 2


@dataclass(frozen=True, eq=False)
class VideoClip:
    """
    A short clip: RGB uint8 ``H x W x 3`` frames (all the same size) and their times in seconds.

    ``timestamps`` increase strictly (any clock: only differences are used; the prompt shows
    each temporal group's time since the first frame); they are kept exact (``Fraction``, see
    :func:`exact_seconds`: pass ``Fraction(stamp_ns, 10**9)`` for ROS stamps). Invalid clips
    raise ``ValueError`` naming the problem.
    """

    frames: Sequence[np.ndarray]
    timestamps: Sequence[float]

    def __post_init__(self):
        frames = tuple(self.frames) if not isinstance(self.frames, np.ndarray) else tuple(
            self.frames[i] for i in range(self.frames.shape[0]))
        if not frames:
            raise ValueError('video clip has zero frames')
        for i, f in enumerate(frames):
            if not isinstance(f, np.ndarray):
                raise ValueError(f'video frame {i} must be a numpy array, got {type(f).__name__}')
            if f.dtype != np.uint8:
                raise ValueError(f'video frame {i} must be uint8, got dtype {f.dtype}')
            if f.ndim != 3 or f.shape[2] != 3:
                raise ValueError(
                    f'video frame {i} must be H x W x 3 (RGB), got shape {tuple(f.shape)}')
            if f.shape != frames[0].shape:
                raise ValueError(
                    f'video frames have mixed sizes: frame 0 is {frames[0].shape[1]}x'
                    f'{frames[0].shape[0]}, frame {i} is {f.shape[1]}x{f.shape[0]}')
        times = exact_seconds(self.timestamps)
        if len(times) != len(frames):
            raise ValueError(f'video clip has {len(frames)} frames but {len(times)} timestamps')
        for i in range(1, len(times)):
            if times[i] <= times[i - 1]:
                raise ValueError(
                    f'video timestamps must increase: frame {i} at {float(times[i])} s follows '
                    f'{float(times[i - 1])} s')
        object.__setattr__(self, 'frames', frames)
        object.__setattr__(self, 'timestamps', times)

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` of the frames."""
        return self.frames[0].shape[:2]

    def __len__(self) -> int:
        return len(self.frames)


def video_key(frames: np.ndarray) -> bytes:
    """Content hash of a clip's frames as the model sees them (``[T, H, W, 3]`` uint8)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b'video' + repr(frames.shape).encode())
    h.update(np.ascontiguousarray(frames).data)
    return h.digest()


def video_smart_resize(num_frames: int, height: int, width: int, temporal_factor: int = 2,
                       factor: int = 32, min_pixels: int = 128 * 32 * 32,
                       max_pixels: int = 768 * 32 * 32) -> tuple[int, int]:
    """
    Return the ``(height, width)`` the reference resizes every frame of a clip to.

    transformers' Qwen3-VL video ``smart_resize``: a side below ``factor`` scales the frame up
    first; both sides become multiples of ``factor``; the *clip's* pixels (frames rounded to
    ``temporal_factor``, times height, times width) are brought inside ``[min_pixels,
    max_pixels]``. Raises ``ValueError`` for fewer than ``temporal_factor`` frames or an aspect
    ratio above 200.
    """
    if num_frames < temporal_factor:
        raise ValueError(
            f'a video clip needs at least {temporal_factor} frames (temporal_patch_size), got '
            f'{num_frames}; send a single frame as an image')
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f'video aspect ratio {max(height, width) / min(height, width):.1f} '
                         f'({height}x{width}) exceeds {MAX_ASPECT_RATIO}')
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ProcessedVideo:
    """
    One preprocessed clip.

    ``clip``: the sampled frames at the size the model sees, with their timestamps (what a
    conversation keeps); ``pixel_values``: float32 ``[t*h*w, 3 * temporal_patch_size *
    patch_size**2]``; ``grid_thw``: ``(t, h, w)`` in patches; ``group_times``: the time of each
    temporal group in seconds since the clip's first frame; ``tokens_per_group``: video pad
    tokens per group.
    """

    clip: VideoClip
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    group_times: tuple[float, ...]
    tokens_per_group: int


@dataclass(frozen=True)
class VideoProcessor:
    """
    Sample, resize, normalise and patchify clips for the Qwen3-VL vision tower.

    Defaults are ``Qwen3VLVideoProcessor``'s class defaults; ``from_pretrained`` reads the
    checkpoint's values. ``min_pixels`` / ``max_pixels`` bound a whole clip (the reference's
    ``size.shortest_edge`` / ``size.longest_edge``).
    """

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    #: A clip up to this much denser than ``fps`` counts as already sampled: timestamps from
    #: a real camera jitter, and the reference's ``int()`` would drop a frame for 0.1 % jitter.
    RATE_TOLERANCE = 1.05

    def __post_init__(self):
        for name in ('patch_size', 'temporal_patch_size', 'merge_size', 'min_pixels',
                     'min_frames', 'max_frames', 'max_video_tokens'):
            if int(getattr(self, name)) < 1:
                raise ValueError(f'video {name} must be >= 1, got {getattr(self, name)}')
        if not (self.fps > 0 and math.isfinite(self.fps)):
            raise ValueError(f'video fps must be > 0, got {self.fps}')
        if self.min_pixels > self.max_pixels:
            raise ValueError(f'video min_pixels {self.min_pixels} is larger than max_pixels '
                             f'{self.max_pixels}')
        if len(self.mean) != 3 or len(self.std) != 3 or any(s == 0 for s in self.std):
            raise ValueError(f'video mean/std need 3 values, std non-zero: {self.mean}, '
                             f'{self.std}')
        object.__setattr__(self, 'mean', tuple(float(m) for m in self.mean))
        object.__setattr__(self, 'std', tuple(float(s) for s in self.std))

    @property
    def factor(self) -> int:
        """Side multiple of a resized frame: patch size times merge size."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_pretrained(cls, model_dir) -> 'VideoProcessor':
        """
        Read the video processor settings of a checkpoint directory, as transformers does.

        The first of ``processor_config.json``'s ``video_processor``,
        ``video_preprocessor_config.json`` and ``preprocessor_config.json`` (the image
        processor's, which transformers falls back to) supplies the values; missing keys keep
        the class defaults. Only bicubic resampling (3) is supported.
        """
        root = Path(model_dir)
        cfg = None
        nested = root / 'processor_config.json'
        if nested.is_file():
            cfg = json.loads(nested.read_text()).get('video_processor')
        for name in ('video_preprocessor_config.json', 'preprocessor_config.json'):
            if cfg is None and (root / name).is_file():
                cfg = json.loads((root / name).read_text())
        cfg = cfg or {}
        if int(cfg.get('resample', 3)) != int(Image.Resampling.BICUBIC):
            raise ValueError(f"video resample {cfg['resample']} is not supported (bicubic only)")
        size = cfg.get('size') or {}
        d = cls()
        return cls(
            patch_size=int(cfg.get('patch_size', d.patch_size)),
            temporal_patch_size=int(cfg.get('temporal_patch_size', d.temporal_patch_size)),
            merge_size=int(cfg.get('merge_size', d.merge_size)),
            min_pixels=int(size.get('shortest_edge', d.min_pixels)),
            max_pixels=int(size.get('longest_edge', d.max_pixels)),
            mean=tuple(cfg.get('image_mean', d.mean)),
            std=tuple(cfg.get('image_std', d.std)),
            rescale_factor=float(cfg.get('rescale_factor', d.rescale_factor)),
            fps=float(cfg.get('fps', d.fps)),
            min_frames=int(cfg.get('min_frames', d.min_frames)),
            max_frames=int(cfg.get('max_frames', d.max_frames)),
            cap_pixels_per_frame=bool(cfg.get('cap_pixels_per_frame') or False),
            max_video_tokens=int(cfg.get('max_video_tokens', d.max_video_tokens)),
        )

    def capped(self, max_pixels: int | None = None) -> 'VideoProcessor':
        """A copy whose clip pixel maximum is lowered to ``max_pixels`` (never raised).

        The minimum follows it down where it would exceed it; None keeps the bounds.
        """
        if max_pixels is None:
            return self
        hi = min(int(max_pixels), self.max_pixels)
        return replace(self, max_pixels=hi, min_pixels=min(self.min_pixels, hi))

    def sample_indices(self, timestamps: Sequence) -> np.ndarray:
        """Indices of the frames the reference samples from a clip with these timestamps.

        The source rate is the clip's mean rate, ``(n - 1) / (last - first)``, in exact
        arithmetic on the stamps (:func:`exact_seconds`).
        """
        times = exact_seconds(timestamps)
        n = len(times)
        num = n if n < 2 else self._frame_count(n, times[0], times[-1])
        num = min(max(num, self.min_frames), self.max_frames, n)
        return np.linspace(0, n - 1, num).round().astype(int)

    def _frame_count(self, n: int, first: Fraction, last: Fraction) -> int:
        """The reference's ``int(n / video_fps * fps)`` for a clip of ``n`` frames."""
        span = last - first
        rate = (n - 1) / span
        if rate <= self.fps * self.RATE_TOLERANCE:
            return n
        # The stamps are only known to their slack: where a span within it gives a whole count
        # (n / rate * fps), that rate is the clip's, so a stamp's rounding (a float far from 0,
        # a nanosecond) never costs a frame.  The count itself is the reference's float
        # expression on that rate, its rounding included.
        slack = stamp_slack(first) + stamp_slack(last)
        fps = Fraction(self.fps)
        whole = math.floor(n * fps * (span + slack) / (n - 1))
        if whole >= 1 and whole >= n * fps * (span - slack) / (n - 1):
            rate = n * fps / whole
        return int(n / float(rate) * self.fps)

    def target_size(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` every frame of a ``num_frames``-frame clip is resized to."""
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:  # the reference's per-frame cap (qwen-vl-utils)
            frame_cap = self.max_video_tokens * self.factor * self.factor
            per_frame = max(min(frame_cap, self.max_pixels // num_frames),
                            int(self.min_pixels * 1.05))
            max_pixels = per_frame * num_frames
        return video_smart_resize(num_frames, height, width, self.temporal_patch_size,
                                  self.factor, self.min_pixels, max_pixels)

    def resize(self, clip: VideoClip) -> VideoClip:
        """The frames of ``clip`` the model sees: sampled at ``fps`` and resized (uint8).

        What a conversation keeps of a clip (never the caller's full-resolution frames);
        ``patchify`` turns it into the vision tower's input.
        """
        if not isinstance(clip, VideoClip):
            raise ValueError(f'a video must be a VideoClip, got {type(clip).__name__}')
        idx = self.sample_indices(clip.timestamps)
        height, width = clip.size
        new_h, new_w = self.target_size(len(idx), height, width)
        # [T, C, H, W] contiguous uint8, as the reference holds a clip before resizing.
        video = torch.from_numpy(np.stack([clip.frames[i] for i in idx])).permute(0, 3, 1, 2)
        video = video.contiguous()
        if (new_h, new_w) != (height, width):
            video = F.interpolate(video, size=[new_h, new_w], mode='bicubic',
                                  align_corners=False, antialias=True)
        frames = np.ascontiguousarray(video.permute(0, 2, 3, 1).numpy())
        return VideoClip(frames, [clip.timestamps[i] for i in idx])

    def layout(self, clip: VideoClip) -> tuple[tuple[int, int, int], tuple[float, ...], int]:
        """``(grid_thw, group_times, tokens_per_group)`` of a clip from ``resize``.

        Group times count from the clip's first frame (sampling always keeps it).
        """
        tp, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        # Exact differences, rounded once: the reference's idx / video_fps for an even clip.
        times = [float(t - clip.timestamps[0]) for t in clip.timestamps]
        times.extend([times[-1]] * (-len(times) % tp))  # the padded frames repeat the last
        group_times = tuple((times[i] + times[i + tp - 1]) / 2 for i in range(0, len(times), tp))
        h, w = clip.size
        return (len(group_times), h // p, w // p), group_times, (h // p) * (w // p) // (m * m)

    def patchify(self, clip: VideoClip) -> ProcessedVideo:
        """Normalise and patchify a clip from ``resize`` (its frames already at model size)."""
        video = torch.from_numpy(np.stack(clip.frames)).permute(0, 3, 1, 2)
        # Fused rescale + normalise in float32, the reference's arithmetic.
        mean = torch.tensor(self.mean) * (1.0 / self.rescale_factor)
        std = torch.tensor(self.std) * (1.0 / self.rescale_factor)
        x = video.to(torch.float32).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
        tp, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        if pad := -x.shape[0] % tp:  # repeat the last frame up to a full temporal group
            x = torch.cat((x, x[-1:].expand(pad, -1, -1, -1)))
        grid, group_times, per_group = self.layout(clip)
        gt, gh, gw = grid
        x = x.view(gt, tp, x.shape[1], gh // m, m, p, gw // m, m, p)
        # -> (group, merge row, merge col, row in window, col in window, C, T, py, px)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        patches = x.reshape(gt * gh * gw, -1)
        return ProcessedVideo(clip, patches, grid, group_times, per_group)

    def preprocess(self, clip: VideoClip) -> ProcessedVideo:
        """``patchify(resize(clip))``: sample, resize and patchify ``clip``."""
        return self.patchify(self.resize(clip))
