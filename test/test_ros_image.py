# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""ros_image against ground truth: a red disc drawn in RGB must come out red, whatever the wire.

Every wire format is produced here by hand from the RGB ground truth (channel swaps, padding,
BT.601 YUV, Bayer mosaics) -- never by the OpenCV call the converter itself uses -- so a swapped
red/blue or a wrong Bayer pattern fails.
"""

from _image_samples import png_bomb, png_header_only
import cv2
import numpy as np
import pytest

from orin_llm_node.ros.cameras import ros_image
from orin_llm_node.ros.cameras.ros_image import ImageConversionError

sensor_msgs = pytest.importorskip('sensor_msgs.msg')

H, W = 60, 80
CY, CX, RADIUS = 30, 40, 18
GREY = 128


def _scene():
    yy, xx = np.mgrid[:H, :W]
    dist = np.hypot(yy - CY, xx - CX)
    rgb = np.full((H, W, 3), GREY, np.uint8)
    rgb[dist <= RADIUS] = (255, 0, 0)
    return rgb, dist


RGB, DIST = _scene()
INSIDE = DIST <= RADIUS - 4     # away from the edge (demosaicing / chroma subsampling blur it)
OUTSIDE = DIST >= RADIUS + 4


def _image(data, encoding, width=W, height=H, step=None, channels=3, bigendian=0):
    msg = sensor_msgs.Image()
    msg.height, msg.width, msg.encoding = height, width, encoding
    msg.is_bigendian = bigendian
    msg.step = width * channels if step is None else step
    msg.data = bytes(data)
    return msg


def _luma(rgb):
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    return 0.299 * r + 0.587 * g + 0.114 * b


def _yuv422(rgb, order):
    """BT.601 limited-range 4:2:2 (what ROS 'yuv422' cameras send), chroma averaged per pair."""
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    y = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255
    u = 128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255
    v = 128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255
    u = (u[:, 0::2] + u[:, 1::2]) / 2
    v = (v[:, 0::2] + v[:, 1::2]) / 2
    y0, y1 = y[:, 0::2], y[:, 1::2]
    planes = {'UYVY': (u, y0, v, y1), 'YUY2': (y0, u, y1, v)}[order]
    out = np.stack(planes, axis=-1).reshape(H, W * 2)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _bayer(rgb, pattern):
    """Sample the RGB ground truth through a colour filter array (ROS naming: rggb = R G / G B)."""
    index = {'r': 0, 'g': 1, 'b': 2}
    mosaic = np.empty((H, W), np.uint8)
    for k, colour in enumerate(pattern):
        dy, dx = divmod(k, 2)
        mosaic[dy::2, dx::2] = rgb[dy::2, dx::2, index[colour]]
    return mosaic


def _assert_red_disc(out):
    assert out.shape == (H, W, 3) and out.dtype == np.uint8 and out.flags['C_CONTIGUOUS']
    inside = out[INSIDE].astype(int)
    outside = out[OUTSIDE].astype(int)
    assert inside[:, 0].min() > 170, 'R must be high inside the disc'
    assert inside[:, 1].max() < 80 and inside[:, 2].max() < 80, 'G and B must be low inside'
    assert np.abs(outside - GREY).max() < 40, 'the background must stay grey'


def _wire_formats():
    bgr = RGB[..., ::-1]
    alpha = np.full((H, W, 1), 200, np.uint8)
    padded = np.full((H, W * 3 + 13), 0xAB, np.uint8)
    padded[:, :W * 3] = bgr.reshape(H, W * 3)
    yield 'rgb8', _image(RGB.tobytes(), 'rgb8')
    yield 'bgr8', _image(bgr.tobytes(), 'bgr8')
    yield '8UC3', _image(bgr.tobytes(), '8UC3')
    yield 'rgba8', _image(np.concatenate([RGB, alpha], -1).tobytes(), 'rgba8', channels=4)
    yield 'bgra8', _image(np.concatenate([bgr, alpha], -1).tobytes(), 'bgra8', channels=4)
    yield 'bgr8 padded step', _image(padded.tobytes(), 'bgr8', step=W * 3 + 13)
    yield 'yuv422 (UYVY)', _image(_yuv422(RGB, 'UYVY').tobytes(), 'yuv422', channels=2)
    yield 'yuv422_yuy2', _image(_yuv422(RGB, 'YUY2').tobytes(), 'yuv422_yuy2', channels=2)
    for pattern in ('rggb', 'bggr', 'gbrg', 'grbg'):
        yield f'bayer_{pattern}8', _image(_bayer(RGB, pattern).tobytes(), f'bayer_{pattern}8',
                                          channels=1)


WIRE = list(_wire_formats())


@pytest.mark.parametrize('name,msg', WIRE, ids=[name for name, _ in WIRE])
def test_raw_encodings_come_out_red(name, msg):
    _assert_red_disc(ros_image.image_to_rgb(msg))


def _compressed(data, fmt):
    msg = sensor_msgs.CompressedImage()
    msg.format = fmt
    msg.data = bytes(data)
    return msg


@pytest.mark.parametrize('ext,fmt', [('.jpg', 'jpeg'), ('.png', 'png'),
                                     ('.jpg', 'bgr8; jpeg compressed bgr8'),
                                     ('.png', 'rgb8; png compressed bgr8'), ('.png', '')])
def test_compressed_comes_out_red(ext, fmt):
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(RGB[..., ::-1]))  # OpenCV files are BGR
    assert ok
    _assert_red_disc(ros_image.compressed_to_rgb(_compressed(buf.tobytes(), fmt)))


@pytest.mark.parametrize('encoding', ['mono8', '8UC1'])
def test_mono8_is_grey_luma(encoding):
    gray = np.round(_luma(RGB)).astype(np.uint8)
    out = ros_image.image_to_rgb(_image(gray.tobytes(), encoding, channels=1))
    assert out.shape == (H, W, 3)
    assert (out[..., 0] == gray).all() and (out[..., 1] == gray).all()
    assert (out[..., 2] == gray).all()
    assert out[INSIDE, 0].max() < 90 and out[OUTSIDE, 0].min() == GREY


@pytest.mark.parametrize('bigendian', [0, 1])
def test_mono16_keeps_the_high_byte_in_either_byte_order(bigendian):
    gray = np.round(_luma(RGB)).astype(np.uint16)
    wide = gray * 256 + 77      # low byte must be dropped (>> 8), not the high one
    data = wide.astype('>u2' if bigendian else '<u2').tobytes()
    msg = _image(data + b'\0' * 10, 'mono16', channels=2, bigendian=bigendian)
    out = ros_image.image_to_rgb(msg)
    assert (out[..., 1] == gray).all()


def test_padded_mono16():
    gray = np.arange(H * 5, dtype=np.uint16).reshape(H, 5) * 200
    rows = np.zeros((H, 5 * 2 + 6), np.uint8)
    rows[:, :10] = gray.astype('<u2').view(np.uint8).reshape(H, 10)
    out = ros_image.image_to_rgb(_image(rows.tobytes(), 'mono16', width=5, step=16))
    assert (out[..., 0] == (gray >> 8)).all()


def test_rgb_to_image_round_trip():
    msg = ros_image.rgb_to_image(RGB, sensor_msgs.Image, frame_id='cam')
    assert (msg.encoding, msg.width, msg.height, msg.step) == ('rgb8', W, H, W * 3)
    assert msg.header.frame_id == 'cam'
    assert (ros_image.image_to_rgb(msg) == RGB).all()
    with pytest.raises(ValueError):
        ros_image.rgb_to_image(RGB[..., 0], sensor_msgs.Image)


@pytest.mark.parametrize('msg,reason', [
    (_image(b'\0' * (W * H * 4), '32FC1'), 'unsupported image encoding'),
    (_image(b'\0' * (W * H * 6), 'rgb16'), 'unsupported image encoding'),
    (_image(b'\0' * (W * H * 3 - 1), 'rgb8'), 'too short'),
    (_image(b'', 'rgb8', width=0, height=0), 'zero-size'),
    (_image(b'\0' * 10, 'bgr8', width=W, height=0), 'zero-size'),
    (_image(b'\0' * (W * H * 3), 'rgb8', step=W * 3 - 1), 'step'),
    (_image(b'\0' * (W * H * 3), 'bgra8', step=W * 3, channels=3), 'step'),
    (_image(b'\0' * 16, 'rgb8', width=100000, height=100000), 'absurd'),
    (_image(b'\0' * 16, 'mono8', width=20000, height=1), 'absurd'),
    (_image(b'\0' * (W * H * 3), 'rgb8', step=10 ** 9, height=1), 'absurd'),
    (_image(b'\0' * (3 * 2 * 4), 'yuv422', width=3, height=4, step=6), 'even width'),
], ids=lambda v: v.replace(' ', '_') if isinstance(v, str) else '')
def test_bad_images_are_rejected_with_a_reason(msg, reason):
    with pytest.raises(ImageConversionError, match=reason):
        ros_image.image_to_rgb(msg)
    with pytest.raises(ImageConversionError):
        ros_image.check_image(msg)


def test_unknown_encoding_names_the_supported_ones():
    with pytest.raises(ImageConversionError) as err:
        ros_image.check_image(_image(b'\0' * 8, 'hsv8', width=1, height=1))
    assert "'hsv8'" in str(err.value) and 'bayer_rggb8' in str(err.value)
    assert '\n' not in str(err.value)


def test_compressed_images_are_sized_from_their_header_before_decoding():
    with pytest.raises(ImageConversionError, match='8192x8192 is absurd'):
        ros_image.check_compressed(_compressed(png_bomb(8192, 8192), 'png'))
    bomb = _compressed(png_bomb(16000, 16000), 'png')      # Pillow's own bomb limit too
    assert len(bomb.data) < 1_000_000
    with pytest.raises(ImageConversionError, match='absurd'):
        ros_image.check_compressed(bomb)
    with pytest.raises(ImageConversionError, match='aspect ratio 300.0'):
        ros_image.check_compressed(_compressed(png_bomb(300, 1), 'png'))
    assert ros_image.compressed_size(png_header_only(64, 48), 'png') == (64, 48)


def test_the_arrival_check_matches_the_image_processor():
    from orin_llm_node.processing import image
    assert ros_image.MAX_ASPECT_RATIO == image.MAX_ASPECT_RATIO
    with pytest.raises(ImageConversionError, match='aspect ratio'):
        ros_image.check_image(_image(b'\0' * 900, 'rgb8', width=300, height=1))


@pytest.mark.parametrize('data,fmt,reason', [
    (b'', 'jpeg', 'no data'),
    (b'not an image at all', 'jpeg', 'magic'),
    (b'\xff\xd8\xff\xe0' + b'\0' * 64, 'jpeg', 'header could not be read'),
    (b'\x89PNG\r\n\x1a\n' + b'\0' * 64, 'png', 'header could not be read'),
    (png_header_only(64, 48), 'png', 'could not be decoded'),
    (b'\x89PNG\r\n\x1a\n' + b'\0' * 64, 'jpeg', 'but data is png'),
    (b'\x89PNG\r\n\x1a\n' + b'\0' * 64, '16UC1; compressedDepth png', 'depth'),
    (b'\xff\xd8\xff\xe0' + b'\0' * 64, 'tiff', 'unsupported compressed format'),
])
def test_bad_compressed_images_are_rejected(data, fmt, reason):
    with pytest.raises(ImageConversionError, match=reason):
        ros_image.compressed_to_rgb(_compressed(data, fmt))
