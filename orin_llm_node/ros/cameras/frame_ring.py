# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""One camera's recent frames for video prompts: a bounded ring at the model's size and fps.

A camera sends 30 frames a second at full resolution; a video prompt needs a few frames a
second at the size the vision tower sees.  So a frame is kept only when it is due on the
``fps`` grid (the others are never decoded), it is resized at once with the image processor's
own size rule and Pillow filter, and the ring holds at most ``ceil(fps * seconds)`` frames:
its memory is bounded by that count times the largest frame (README: "Video requests").

Pure numpy/Pillow (no rclpy); not thread-safe: the caller holds its own lock.
"""

from collections import deque
from dataclasses import dataclass
import math

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class BufferedFrame:
    """One kept frame: its header stamp (ns), RGB pixels at the model's size, frame_id."""

    stamp_ns: int
    rgb: np.ndarray
    frame_id: str = ''
    stamped: bool = True

    def describe(self):
        """The frame as ``response/info`` names an image: its header stamp and frame_id."""
        return {'stamp': {'sec': self.stamp_ns // 1_000_000_000,
                          'nanosec': self.stamp_ns % 1_000_000_000},
                'frame_id': self.frame_id, 'stamped': self.stamped}


@dataclass(frozen=True)
class FrameSizer:
    """The size a camera frame is kept at for video: the largest the model sees it at.

    That is the video processor's size for the shortest clip (``temporal_patch_size`` frames:
    a clip's pixel budget is shared by its frames, so longer clips are smaller still), and
    never more than the image processor's size (``image_max_pixels``, the node's cost cap).
    """

    image: object                   # processing.image.ImageProcessor
    video: object = None            # processing.video.VideoProcessor, if the engine has one

    @classmethod
    def of(cls, prompts):
        """The sizer of an engine's PromptBuilder (``engine.prompts``)."""
        return cls(prompts.image_processor, getattr(prompts, 'video_processor', None))

    @property
    def resample(self):
        """The Pillow filter of the resize (the image processor's)."""
        return self.image.resample

    def target_size(self, height, width):
        """``(height, width)`` a frame of this size is kept at."""
        size = self.image.target_size(height, width)
        if self.video is not None:
            video = self.video.target_size(self.video.temporal_patch_size, height, width)
            if video[0] * video[1] < size[0] * size[1]:
                size = video
        return size


def resize_for_model(rgb, processor):
    """``rgb`` at the size ``processor`` resizes it to, with its Pillow filter.

    ``processor``: a :class:`FrameSizer` or an ImageProcessor (``target_size``, ``resample``).
    """
    height, width = rgb.shape[:2]
    new_h, new_w = processor.target_size(height, width)
    if (new_h, new_w) == (height, width):
        return np.ascontiguousarray(rgb)
    pil = Image.fromarray(np.ascontiguousarray(rgb))
    return np.asarray(pil.resize((new_w, new_h), resample=processor.resample))


class FrameRing:
    """The newest ``ceil(fps * seconds)`` frames of one camera, one per ``1 / fps`` at most.

    Frames are kept on a grid of ``1 / fps`` (a frame up to a tenth of a period early counts,
    so a 30 Hz camera gives exactly ``fps`` frames a second, not a beat of it); a frame kept more
    than half a period after its slot (the camera paused, frames were lost) starts the grid
    again from itself, so two kept frames are never closer than ``0.4 / fps``.  A frame whose
    stamp is not newer than the last kept one (out of order, or the same frame again through a
    second subscription) is skipped.  A frame of another size than the ones held (the camera
    changed its resolution) empties the ring first, so a clip never mixes sizes.
    """

    def __init__(self, fps, seconds):
        if not fps > 0 or seconds < 0:
            raise ValueError(f'need fps > 0 and seconds >= 0, got {fps} and {seconds}')
        self.fps = float(fps)
        self.period_ns = round(1e9 / fps)
        self.capacity = math.ceil(fps * seconds - 1e-9)
        self._frames = deque(maxlen=max(self.capacity, 1))
        self._due_ns = None
        self.resets = 0                 # emptied because the frame size changed

    def wants(self, stamp_ns):
        """Whether a frame stamped ``stamp_ns`` would be kept (decide before decoding it)."""
        if self.capacity == 0:
            return False
        if not self._frames:
            return True
        return (stamp_ns > self._frames[-1].stamp_ns
                and stamp_ns >= self._due_ns - self.period_ns // 10)

    def offer(self, stamp_ns, make_frame, frame_id='', stamped=True):
        """Keep the frame ``make_frame()`` builds if it is due; True if it was kept.

        ``make_frame`` returns the frame already at the model's size (see
        :func:`resize_for_model`); it is called only for a frame that is kept.
        """
        if not self.wants(stamp_ns):
            return False
        rgb = make_frame()
        if self._frames and self._frames[-1].rgb.shape != rgb.shape:
            self._frames.clear()
            self.resets += 1
        rgb.flags.writeable = False     # shared with the clips handed out
        self._frames.append(BufferedFrame(stamp_ns, rgb, frame_id, stamped))
        # The next frame is due one period after this one was due.  A frame more than half a
        # period late is nearer the next slot than its own: kept on the old grid, that slot's
        # frame could follow it by a single camera period, so the grid restarts from it.
        due = self._due_ns
        late = due is None or stamp_ns >= due + self.period_ns // 2
        self._due_ns = (stamp_ns if late else due) + self.period_ns
        return True

    def clip(self, start_ns, end_ns):
        """The kept frames stamped in ``(start_ns, end_ns]``, oldest first."""
        return [f for f in self._frames if start_ns < f.stamp_ns <= end_ns]

    def clear(self):
        """Forget every frame (unsubscribed)."""
        self._frames.clear()
        self._due_ns = None

    def __len__(self):
        return len(self._frames)

    @property
    def newest_stamp(self):
        """Stamp (ns) of the newest kept frame, or None when empty."""
        return self._frames[-1].stamp_ns if self._frames else None

    @property
    def frame_shape(self):
        """Shape of the frames held now (``(h, w, 3)``), or None when empty."""
        return self._frames[-1].rgb.shape if self._frames else None

    @property
    def nbytes(self):
        """Bytes of pixels held now."""
        return sum(f.rgb.nbytes for f in self._frames)

    def limit_bytes(self, height, width):
        """The most pixel bytes the ring holds for frames of this (model) size."""
        return self.capacity * height * width * 3
