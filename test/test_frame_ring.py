# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""frame_ring.FrameRing: one camera's video frames, bounded, at the model's size and fps.

The long test pushes ten minutes of a 30 Hz 640x480 camera (18000 stamped frames) through the
ring object and checks that its memory stays flat once full (held bytes and Python's traced
allocations alike); the others check the fps grid (no beat, no two frames a camera period
apart after a gap), out-of-order and duplicate stamps, a camera that changes its resolution,
the clip window, and the size frames are kept at (FrameSizer: the smaller of the image's and
the shortest clip's).
"""

import tracemalloc

import numpy as np
import pytest

from orin_llm_node.processing.image import ImageProcessor
from orin_llm_node.processing.video import VideoProcessor
from orin_llm_node.ros.cameras.frame_ring import FrameRing, FrameSizer, resize_for_model

NS = 1_000_000_000
CAMERA_PERIOD_NS = NS // 30


def frame(h=480, w=640, value=0):
    return np.full((h, w, 3), value % 256, np.uint8)


def test_ten_minutes_of_30hz_640x480_keep_memory_flat():
    processor = ImageProcessor(min_pixels=1024, max_pixels=200_704)     # the model sees ~448x448
    ring = FrameRing(fps=2.0, seconds=8.0)
    full = frame()
    decoded = []

    def decode_and_resize():
        decoded.append(1)
        return resize_for_model(full, processor)

    tracemalloc.start()
    try:
        held, traced = [], []
        for i in range(18000):                              # 10 min x 60 s x 30 Hz
            ring.offer(i * CAMERA_PERIOD_NS, decode_and_resize, 'cam')
            if i % 1800 == 1799:                            # once a minute
                held.append(ring.nbytes)
                traced.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    shape = processor.target_size(480, 640) + (3,)
    assert ring.frame_shape == shape and shape != full.shape, 'never full resolution'
    assert len(ring) == ring.capacity == 16
    limit = ring.limit_bytes(*shape[:2])
    assert held == [limit] * 10, 'full after the first minute and flat since'
    # Traced allocations (numpy's included) stay within one frame of the first minute's.
    assert max(traced) - min(traced) < full.nbytes, traced
    assert len(decoded) == 1201, 'only the frames due at 2 fps are decoded (0 s to 599.97 s)'


@pytest.mark.parametrize('fps', [2.0, 7.0, 10.0])
def test_frames_follow_the_fps_grid_without_beating(fps):
    ring = FrameRing(fps=fps, seconds=60.0)
    for i in range(30 * 10):                                # 10 s of a 30 Hz camera
        ring.offer(i * CAMERA_PERIOD_NS, frame)
    stamps = [f.stamp_ns for f in ring.clip(-1, 10 * NS)]
    # 0 s, then one per 1 / fps: fps frames a second even where 30 Hz is no multiple of fps.
    assert abs(len(stamps) - (10 * fps + 1)) <= 1, len(stamps)
    gaps = np.diff(stamps) / NS
    assert np.all(np.abs(gaps - 1 / fps) <= 1 / 30 + 1e-6), gaps


def test_a_frame_on_the_slot_after_a_skipped_one_is_not_kept_too():
    # 2 fps: kept at 0 s; the 0.5 s slot goes by without a frame; a frame 1/30 s before the 1 s
    # slot is kept, and the frame exactly on that slot is not: it would be a camera period on.
    ring = FrameRing(fps=2.0, seconds=10.0)
    assert ring.offer(0, frame)
    assert ring.offer(NS - CAMERA_PERIOD_NS, frame)
    assert not ring.offer(NS, frame), 'two frames 1/30 s apart'
    assert ring.offer(NS - CAMERA_PERIOD_NS + NS // 2, frame), 'the grid goes on from it'


@pytest.mark.parametrize('fps', [1.0, 2.0, 7.0])
def test_frames_lost_in_bursts_never_leave_two_kept_frames_close(fps):
    # A 30 Hz camera losing bursts of up to 25 frames: each kept frame is at least 0.4 / fps
    # after the one before (a frame late by over half a period restarts the grid).
    rng = np.random.default_rng(int(fps))
    for _ in range(50):
        ring = FrameRing(fps=fps, seconds=60.0)
        i = 0
        while i < 30 * 20:
            if rng.random() < 0.05:
                i += int(rng.integers(1, 26))
                continue
            ring.offer(i * CAMERA_PERIOD_NS, lambda: frame(2, 2))
            i += 1
        gaps = np.diff([f.stamp_ns for f in ring.clip(-1, 30 * NS)]) / NS
        assert gaps.min() >= 0.4 / fps - 1e-9, gaps.min()


def test_out_of_order_and_duplicate_stamps_are_skipped():
    ring = FrameRing(fps=10.0, seconds=10.0)
    assert ring.offer(NS, frame)
    assert not ring.offer(NS, frame), 'the same frame again (the reliable twin)'
    assert not ring.offer(NS // 2, frame), 'older than the newest kept'
    assert ring.offer(NS + NS // 10, frame)
    assert [f.stamp_ns for f in ring.clip(0, 2 * NS)] == [NS, NS + NS // 10]


def test_a_new_resolution_empties_the_ring_so_clips_never_mix_sizes():
    ring = FrameRing(fps=1.0, seconds=10.0)
    for t in range(3):
        ring.offer(t * NS, lambda: frame(48, 64))
    ring.offer(3 * NS, lambda: frame(96, 128))
    assert len(ring) == 1 and ring.resets == 1 and ring.frame_shape == (96, 128, 3)
    assert {f.rgb.shape for f in ring.clip(-1, 10 * NS)} == {(96, 128, 3)}


def test_clip_window_and_read_only_frames():
    ring = FrameRing(fps=1.0, seconds=5.0)
    for t in range(8):
        ring.offer(t * NS, lambda t=t: frame(value=t), f'f{t}')
    assert len(ring) == 5
    clip = ring.clip(4 * NS, 7 * NS)                         # (4, 7]
    assert [f.frame_id for f in clip] == ['f5', 'f6', 'f7']
    with pytest.raises(ValueError):
        clip[0].rgb[0, 0, 0] = 1
    ring.clear()
    assert len(ring) == 0 and ring.nbytes == 0 and ring.frame_shape is None


def test_no_buffer_keeps_nothing_and_bad_settings_are_refused():
    ring = FrameRing(fps=2.0, seconds=0.0)
    assert ring.capacity == 0 and not ring.wants(0)
    assert not ring.offer(0, frame)
    with pytest.raises(ValueError):
        FrameRing(fps=0.0, seconds=1.0)


def test_resize_is_the_image_processors_own():
    processor = ImageProcessor(min_pixels=1024, max_pixels=50_000)
    rgb = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
    small = resize_for_model(rgb, processor)
    assert small.shape[:2] == processor.target_size(480, 640)
    # The engine takes the kept frame as it is: the same patches as from a frame of that size.
    assert processor.target_size(*small.shape[:2]) == small.shape[:2]
    np.testing.assert_array_equal(resize_for_model(small, processor), small)


def area(size):
    return size[0] * size[1]


@pytest.mark.parametrize('height, width', [(720, 1280), (1080, 1920), (1280, 720)])
def test_video_frames_are_kept_at_the_smaller_of_the_image_and_clip_sizes(height, width):
    video = VideoProcessor()                    # a clip of at most 768 x 32 x 32 pixels
    clip = video.target_size(video.temporal_patch_size, height, width)     # the shortest clip
    rgb = frame(height, width)
    # Image sizes well above the clip's, a little above it (its sides' squares below it), and
    # below it.
    big, near, small = (ImageProcessor(min_pixels=1024, max_pixels=m)
                        for m in (4096 * 4096, area(clip) * 13 // 10, 50_000))
    sizes = [image.target_size(height, width) for image in (big, near, small)]
    assert area(sizes[2]) < area(clip) < area(sizes[1]) < area(sizes[0])
    assert max(sizes[1]) ** 2 > area(clip) > min(sizes[1]) ** 2
    for image, want in ((big, clip), (near, clip), (small, sizes[2])):
        sizer = FrameSizer(image, video)
        assert sizer.target_size(height, width) == want
        assert resize_for_model(rgb, sizer).shape == want + (3,)
        assert sizer.resample == image.resample
        # Without a video processor: the image's size.
        assert FrameSizer(image).target_size(height, width) == image.target_size(height, width)
