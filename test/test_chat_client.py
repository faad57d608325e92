# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat`` refuses every image file it cannot send whole with one line, no traceback.

The real command (a subprocess) with files that are empty, truncated (PNG and JPEG), not an
image, a directory, missing or unreadable: exit status 1 or 2, one line on stderr naming the file,
and it never gets as far as looking for a node.  Whole files are converted as before.
"""

import os
from pathlib import Path
import subprocess
import sys

import cv2
import numpy as np
import pytest

pytest.importorskip('rclpy')

from orin_llm_node.cli.chat_client import image_message  # noqa: E402

pytestmark = pytest.mark.ros


def _encoded(ext):
    rgb = np.zeros((48, 64, 3), np.uint8)
    rgb[10:30, 20:50] = (0, 0, 255)
    ok, data = cv2.imencode(ext, rgb)
    assert ok
    return data.tobytes()


def _unreadable(tmp_path):
    """A file this process cannot read.

    Root reads any mode-000 file, but not a write-only /proc/sys entry.
    """
    if os.geteuid() != 0:
        path = tmp_path / 'secret.png'
        path.write_bytes(_encoded('.png'))
        path.chmod(0)
        return path
    path = Path('/proc/sys/vm/compact_memory')
    try:
        path.read_bytes()
    except PermissionError:
        return path
    except OSError:
        pass
    pytest.skip('no file here that this (root) process cannot read')


@pytest.mark.parametrize('case', ['empty', 'truncated png', 'truncated jpeg', 'not an image',
                                  'directory', 'missing', 'no permission'])
def test_an_unreadable_image_file_is_one_line_and_no_traceback(tmp_path, case):
    path = tmp_path / 'image.png'
    if case == 'empty':
        path.write_bytes(b'')
    elif case == 'truncated png':
        data = _encoded('.png')
        path.write_bytes(data[:len(data) // 2])
    elif case == 'truncated jpeg':
        data = _encoded('.jpg')
        path = tmp_path / 'image.jpg'
        path.write_bytes(data[:len(data) // 2])
    elif case == 'not an image':
        path = tmp_path / 'notes.txt'
        path.write_text('not an image at all\n')
    elif case == 'directory':
        path = tmp_path / 'folder'
        path.mkdir()
    elif case == 'no permission':
        path = _unreadable(tmp_path)
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1')
    # --timeout 1: were the file accepted, the client would say instead that no node is ready.
    out = subprocess.run([sys.executable, '-m', 'orin_llm_node.cli.chat', '-n',
                          '/chat_client_files', '--timeout', '1', '--image', str(path), 'Hi?'],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode in (1, 2), out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in out.stderr, out.stderr
    assert str(path) in lines[0] and 'no ready node' not in lines[0], lines[0]
    assert out.stdout == ''


@pytest.mark.parametrize('ext,fmt', [('.png', 'png'), ('.jpg', 'jpeg'), ('.bmp', 'png')])
def test_a_whole_image_file_is_sent(tmp_path, ext, fmt):
    path = tmp_path / f'image{ext}'
    path.write_bytes(_encoded(ext))
    msg = image_message(path)
    assert msg.format == fmt and len(msg.data) > 0
    if ext != '.bmp':
        assert bytes(msg.data) == path.read_bytes()      # JPEG/PNG as they are


@pytest.mark.parametrize('case', ['nested too deep', 'not JSON', 'not an object', 'too long',
                                  'missing'])
def test_a_schema_file_the_node_could_not_take_is_one_line_and_exit_2(tmp_path, case):
    path = tmp_path / 'schema.json'
    if case == 'nested too deep':      # 985 levels: parsed by json.loads in a shallow stack
        path.write_text('{"type": "array", "items": ' * 985 + '{}' + '}' * 985)
    elif case == 'not JSON':
        path.write_text('{not json')
    elif case == 'not an object':
        path.write_text('[1, 2]')
    elif case == 'too long':
        path.write_text('{"enum": ["' + 'x' * 100_000 + '"]}')
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOCALHOST_ONLY='1')
    out = subprocess.run([sys.executable, '-m', 'orin_llm_node.cli.chat', '-n',
                          '/chat_client_schema', '--timeout', '1', '--schema', str(path), 'Hi?'],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in out.stderr, out.stderr
    assert str(path) in lines[0] and 'no ready node' not in lines[0], lines[0]
    assert out.stdout == ''
