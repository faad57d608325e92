# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Pictures the tests send: a red disc, PNGs that pass the header checks and fail later."""

import struct
import zlib

import cv2
import numpy as np


def red_disc(h=64, w=64):
    """A red disc on grey, ``h`` x ``w`` RGB."""
    yy, xx = np.mgrid[:h, :w]
    rgb = np.full((h, w, 3), 128, np.uint8)
    rgb[np.hypot(yy - h / 2, xx - w / 2) <= min(h, w) / 3] = (255, 0, 0)
    return rgb


def png_header_only(width, height):
    """A PNG whose header is valid (so it passes the arrival checks) and whose pixels are gone."""
    ok, buf = cv2.imencode('.png', np.zeros((height, width, 3), np.uint8))
    assert ok
    data = buf.tobytes()
    return data[:data.index(b'IDAT') + 8]       # up to a few bytes into the pixel data


def png_bomb(width, height):
    """A real grey PNG of ``width`` x ``height`` built row by row (tiny when compressed)."""
    def chunk(kind, body):
        return (struct.pack('>I', len(body)) + kind + body
                + struct.pack('>I', zlib.crc32(kind + body) & 0xffffffff))

    packer = zlib.compressobj(9)
    row = bytes(width + 1)                       # filter byte 0 + grey pixels
    idat = b''.join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 0, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', idat)
            + chunk(b'IEND', b''))
