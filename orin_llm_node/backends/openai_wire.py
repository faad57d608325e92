# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI chat-completions wire format, both ways: request bodies, SSE lines, error texts.

Pure functions over plain values (no HTTP, no threads): the backend builds its requests with
them, and ``orin_llm_serve`` reads the same shapes.  What a server sends is read within bounds
(:data:`MAX_LINE_BYTES` per stream line) and its text made valid Unicode (valid_text.py).
"""

import base64
import io
import json
import re

import numpy as np
from PIL import Image

from orin_llm_node.valid_text import valid_text

__all__ = ['MAX_LINE_BYTES', 'REASON_CHARS', 'LineTooLong', 'body_fields', 'bounded_lines',
           'error_text', 'image_data_url', 'one_line', 'sse_payload', 'user_content']

#: The longest reason a failure carries (one line, whatever the server sent).
REASON_CHARS = 240
#: The longest server-sent-event line read (bytes). One line is one JSON chunk: a few hundred
#: bytes of text, or a long prompt's token ids (``return_token_ids``: 256k tokens in ~2 MB).
MAX_LINE_BYTES = 4 * 2**20

_LINE_END = re.compile(rb'\r\n|\r|\n')


class LineTooLong(ValueError):
    """A server sent a stream line longer than :data:`MAX_LINE_BYTES`."""


def one_line(text, limit: int = REASON_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters.

    Valid Unicode: a server's lone surrogate is U+FFFD (it could not be published).
    """
    flat = valid_text(' '.join(str(text).split()))
    return flat if len(flat) <= limit else flat[:limit - 3] + '...'


def bounded_lines(chunks, limit: int = MAX_LINE_BYTES):
    """The lines (str, invalid UTF-8 replaced) of a stream of byte ``chunks``.

    Line ends as server-sent events have them (CRLF, LF or CR). :class:`LineTooLong` as soon
    as ``limit`` bytes arrived without a line end, so a line that never ends costs no more.
    """
    buf = bytearray()
    for chunk in chunks:
        searched = max(len(buf) - 1, 0)     # a CR kept at the end may be half of a CRLF
        buf += chunk
        start = 0
        for end in _LINE_END.finditer(buf, searched):
            if end.group() == b'\r' and end.end() == len(buf):
                break                       # wait for the next chunk: CR or CRLF?
            yield buf[start:end.start()].decode('utf-8', 'replace')
            start = end.end()
        del buf[:start]
        if len(buf) > limit:
            raise LineTooLong(f'the server sent a stream line longer than {limit} bytes')
    if buf:
        yield buf.decode('utf-8', 'replace')


def image_data_url(rgb: np.ndarray) -> str:
    """A ``data:image/png;base64,...`` URL of an RGB uint8 image (PNG: lossless)."""
    buf = io.BytesIO()
    # compress_level 1: a camera frame at model size encodes in milliseconds; the bytes on
    # the wire matter less than the robot's CPU.
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format='PNG', compress_level=1)
    return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode('ascii')


def user_content(parts) -> list[dict]:
    """The ``content`` list of a user message from parts: text, or data URLs of images."""
    content = []
    for kind, value in parts:
        if kind == 'text':
            content.append({'type': 'text', 'text': value})
        else:
            content.append({'type': 'image_url', 'image_url': {'url': value}})
    return content


def body_fields(sampling) -> dict:
    """The request fields of ``SamplingParams``: sampling values and ``response_format``.

    Values at their API defaults that only some servers know (``top_k``, ``ignore_eos``) are
    left out, so a plain OpenAI-compatible server is not refused them. A regex answer uses
    vLLM's ``structured_outputs`` (the OpenAI API has no regex format).
    """
    body = {'max_tokens': sampling.max_tokens, 'temperature': float(sampling.temperature),
            'top_p': float(sampling.top_p)}
    if sampling.seed is not None:
        body['seed'] = sampling.seed
    if sampling.top_k:
        body['top_k'] = sampling.top_k
    if sampling.ignore_eos:
        body['ignore_eos'] = True
    fmt = sampling.response_format
    if fmt is not None:
        if fmt['type'] == 'json_object':
            body['response_format'] = {'type': 'json_object'}
        elif fmt['type'] == 'json_schema':
            body['response_format'] = {'type': 'json_schema', 'json_schema': {
                'name': 'answer', 'schema': fmt['schema'], 'strict': True}}
        else:
            body['structured_outputs'] = {'regex': fmt['pattern']}
    return body


def sse_payload(line: str):
    """The ``data`` of one server-sent-event line: a dict, ``'[DONE]'``, or None (no data).

    ``ValueError`` for a data line that is not JSON. ``NaN`` / ``Infinity`` (not JSON, but
    Python's parser takes them) are read as null: no count the server sent can be one.
    """
    if not line.startswith('data:'):
        return None              # comments (':'), event names, ids, blank separators
    data = line[5:].strip()
    if data == '[DONE]':
        return data
    try:
        value = json.loads(data, parse_constant=lambda name: None)
    except ValueError:
        raise ValueError(f'the server sent a stream line that is not JSON: '
                         f'{one_line(data, 80)!r}') from None
    if not isinstance(value, dict):
        raise ValueError('the server sent a stream line that is not a JSON object')
    return value


def error_text(status: int, body: str) -> str:
    """One line saying what an HTTP error answer said (the OpenAI error shape, or its text)."""
    message = body
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if isinstance(value, dict):
        err = value.get('error', value.get('detail', value.get('message')))
        if isinstance(err, dict):
            err = err.get('message', err)
        if err is not None:
            message = err if isinstance(err, str) else json.dumps(err)
    message = one_line(message, 160) or '(no message)'
    return f'server answered HTTP {status}: {message}'
