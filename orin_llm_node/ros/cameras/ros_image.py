# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""sensor_msgs Image / CompressedImage <-> RGB uint8 arrays, with every check a camera needs.

The node never trusts a camera driver: encodings are matched explicitly, ``step`` padding and
``is_bigendian`` are honoured, and anything unusable raises :class:`ImageConversionError` with a
one-line reason (published on ``error`` by the node) instead of crashing or silently swapping
red and blue.  Only numpy and OpenCV are needed (no cv_bridge), and the message objects are only
duck-typed, so the functions can be used without rclpy.

``check_image`` / ``check_compressed`` look at headers only (a compressed image is sized from
its PNG/JPEG header, never decoded) and run when the image arrives, with every geometry check
the engine's image processor would make; ``image_to_rgb`` / ``compressed_to_rgb`` do the pixel
work and run on the session thread, only for an image a prompt takes.
"""

import array
import io
import warnings

import cv2
import numpy as np
from PIL import Image as PILImage

from orin_llm_node.refusals import clip

# Limits: far above any robot camera, far below what would exhaust memory (a compressed image
# at MAX_PIXELS decodes to 3 x 32 MiB on the session thread; a larger one is refused from its
# header).
MAX_SIDE = 16384
MAX_PIXELS = 32 * 1024 * 1024
MAX_COMPRESSED_BYTES = 64 * 1024 * 1024
# The engine's image processor refuses more elongated images (processing/image.py says the same;
# test/test_ros_image.py keeps the two equal without importing torch here).
MAX_ASPECT_RATIO = 200

# encoding -> (channels, bytes per channel).  8UC1/8UC3 follow OpenCV's BGR convention.
_LAYOUT = {
    'rgb8': (3, 1),
    'bgr8': (3, 1),
    '8uc3': (3, 1),
    'rgba8': (4, 1),
    'bgra8': (4, 1),
    'mono8': (1, 1),
    '8uc1': (1, 1),
    'mono16': (1, 2),
    '16uc1': (1, 2),
    'yuv422': (2, 1),
    'uyvy': (2, 1),
    'yuv422_yuy2': (2, 1),
    'yuyv': (2, 1),
    'bayer_rggb8': (1, 1),
    'bayer_bggr8': (1, 1),
    'bayer_gbrg8': (1, 1),
    'bayer_grbg8': (1, 1),
}

# OpenCV names Bayer patterns after the second row's first two pixels, so ROS's (and the
# camera vendors') RGGB is OpenCV's "BG" (the mapping cv_bridge uses as well).
_CVT = {
    'bgr8': cv2.COLOR_BGR2RGB,
    '8uc3': cv2.COLOR_BGR2RGB,
    'rgba8': cv2.COLOR_RGBA2RGB,
    'bgra8': cv2.COLOR_BGRA2RGB,
    'mono8': cv2.COLOR_GRAY2RGB,
    '8uc1': cv2.COLOR_GRAY2RGB,
    'mono16': cv2.COLOR_GRAY2RGB,
    '16uc1': cv2.COLOR_GRAY2RGB,
    'yuv422': cv2.COLOR_YUV2RGB_UYVY,
    'uyvy': cv2.COLOR_YUV2RGB_UYVY,
    'yuv422_yuy2': cv2.COLOR_YUV2RGB_YUY2,
    'yuyv': cv2.COLOR_YUV2RGB_YUY2,
    'bayer_rggb8': cv2.COLOR_BayerBG2RGB,
    'bayer_bggr8': cv2.COLOR_BayerRG2RGB,
    'bayer_gbrg8': cv2.COLOR_BayerGR2RGB,
    'bayer_grbg8': cv2.COLOR_BayerGB2RGB,
}

SUPPORTED_ENCODINGS = tuple(sorted(_LAYOUT))

_JPEG_MAGIC = b'\xff\xd8\xff'
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


class ImageConversionError(ValueError):
    """An image message cannot be used; ``str(err)`` is a one-line reason.

    ``kind`` names the check that failed (a fixed word per check, never the sender's data):
    the node rate-limits its refusals per topic and kind.
    """

    def __init__(self, reason, kind):
        super().__init__(reason)
        self.kind = kind


def _check_size(width, height):
    if width <= 0 or height <= 0:
        raise ImageConversionError(f'zero-size image ({width}x{height})', 'zero_size')
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise ImageConversionError(
            f'image size {width}x{height} is absurd (limits: side <= {MAX_SIDE}, '
            f'{MAX_PIXELS} pixels)', 'absurd_size')
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise ImageConversionError(
            f'image aspect ratio {ratio:.1f} ({width}x{height}) exceeds {MAX_ASPECT_RATIO}',
            'aspect_ratio')


def check_image(msg):
    """Validate an Image's header fields without touching the pixels (cheap, O(1)).

    Returns the normalised (lower-case) encoding; raises :class:`ImageConversionError`.
    """
    encoding = str(msg.encoding).strip().lower()
    if encoding not in _LAYOUT:
        raise ImageConversionError(
            f"unsupported image encoding '{clip(msg.encoding)}' (supported: "
            f"{', '.join(SUPPORTED_ENCODINGS)})", 'encoding')
    width, height, step = int(msg.width), int(msg.height), int(msg.step)
    _check_size(width, height)
    channels, depth = _LAYOUT[encoding]
    row = width * channels * depth
    if step < row:
        raise ImageConversionError(
            f'step {step} < width*channels*bytes ({width}*{channels}*{depth} = {row}) '
            f'for {encoding}', 'step')
    if step > row + MAX_SIDE * 8:
        raise ImageConversionError(f'step {step} is absurd for a {width}-pixel {encoding} row',
                                   'step')
    if len(msg.data) < step * height:
        raise ImageConversionError(
            f'image data too short: {len(msg.data)} bytes < step*height = {step}*{height}',
            'too_short')
    if encoding in ('yuv422', 'uyvy', 'yuv422_yuy2', 'yuyv') and width % 2:
        raise ImageConversionError(f'{encoding} needs an even width, got {width}', 'odd_width')
    if encoding.startswith('bayer_') and (width < 2 or height < 2):
        raise ImageConversionError(f'{encoding} needs at least 2x2 pixels, got {width}x{height}',
                                   'bayer_size')
    return encoding


def image_to_rgb(msg):
    """Convert a sensor_msgs/Image to a C-contiguous ``HxWx3`` uint8 RGB array.

    Honours ``step`` padding (row stride) and ``is_bigendian`` (16-bit data); mono16 keeps the
    high byte (``>> 8``).  Raises :class:`ImageConversionError` with the reason.
    """
    encoding = check_image(msg)
    width, height, step = int(msg.width), int(msg.height), int(msg.step)
    channels, depth = _LAYOUT[encoding]
    buf = np.frombuffer(msg.data, dtype=np.uint8, count=step * height)
    rows = buf.reshape(height, step)[:, :width * channels * depth]
    if depth == 2:
        dtype = np.dtype('>u2' if msg.is_bigendian else '<u2')
        pixels = np.ascontiguousarray(rows).view(dtype).reshape(height, width)
        pixels = (pixels >> 8).astype(np.uint8)
    elif channels == 1:
        pixels = np.ascontiguousarray(rows)
    else:
        pixels = np.ascontiguousarray(rows).reshape(height, width, channels)
    if encoding == 'rgb8':
        return pixels.copy()
    return np.ascontiguousarray(cv2.cvtColor(pixels, _CVT[encoding]))


def check_compressed(msg):
    """Validate a CompressedImage's format and magic bytes (cheap).

    Returns ``'jpeg'`` or ``'png'``; raises :class:`ImageConversionError`.
    """
    fmt = str(msg.format).strip().lower()
    size = len(msg.data)
    if size == 0:
        raise ImageConversionError('compressed image has no data', 'no_data')
    if size > MAX_COMPRESSED_BYTES:
        raise ImageConversionError(
            f'compressed image of {size} bytes is absurd (limit {MAX_COMPRESSED_BYTES})',
            'absurd_size')
    kind = compressed_kind(msg.data)
    # image_transport writes e.g. "bgr8; jpeg compressed bgr8"; bare "jpeg"/"png" is common too.
    if 'compresseddepth' in fmt.replace(' ', ''):
        raise ImageConversionError(
            f"unsupported compressed format '{clip(msg.format)}' (depth)", 'format')
    named = ('jpeg' if ('jpeg' in fmt or 'jpg' in fmt) else 'png' if 'png' in fmt else None)
    if fmt and named is None:
        raise ImageConversionError(
            f"unsupported compressed format '{clip(msg.format)}' (supported: jpeg, png)",
            'format')
    if kind is None:
        raise ImageConversionError(
            f"compressed image data is not {named or 'jpeg/png'} (bad magic bytes)", 'magic')
    if named is not None and named != kind:
        raise ImageConversionError(
            f"compressed format says '{clip(msg.format)}' but data is {kind}", 'format')
    _check_size(*compressed_size(msg.data, kind))
    return kind


def compressed_kind(data):
    """``'jpeg'`` or ``'png'`` by the magic bytes that ``data`` starts with, else None."""
    head = bytes(data[:8])
    return 'jpeg' if head.startswith(_JPEG_MAGIC) else 'png' if head == _PNG_MAGIC else None


def compressed_size(data, kind):
    """(width, height) from a PNG/JPEG header, without decoding the pixels."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(bytes(data))) as img:     # reads the header only
                return img.size
    except PILImage.DecompressionBombError as exc:      # far beyond our own limits
        raise ImageConversionError(f'{kind} image size is absurd ({clip(exc, 120)})',
                                   'absurd_size') from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageConversionError(f'{kind} header could not be read ({clip(exc, 120)})',
                                   'header') from None


def compressed_to_rgb(msg):
    """Decode a sensor_msgs/CompressedImage (jpeg or png) to ``HxWx3`` uint8 RGB."""
    kind = check_compressed(msg)
    data = np.frombuffer(msg.data, dtype=np.uint8)
    bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if bgr is None:
        raise ImageConversionError(f'{kind} data could not be decoded (corrupt or truncated)',
                                   'decode')
    height, width = bgr.shape[:2]
    _check_size(width, height)
    return np.ascontiguousarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def rgb_to_image(rgb, msg_type, stamp=None, frame_id=''):
    """Fill a new ``msg_type`` (sensor_msgs/Image) with an ``HxWx3`` uint8 RGB array as rgb8."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f'expected an HxWx3 uint8 array, got shape {rgb.shape}')
    msg = msg_type()
    if stamp is not None:
        msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = 'rgb8'
    msg.is_bigendian = 0
    msg.step = msg.width * 3
    msg.data = array.array('B', rgb.tobytes())
    return msg
