# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A chat-completions request body read into what the engine takes, or refused with why.

What is taken: ``messages`` as an optional system message, then user/assistant turns ending
with a user message (text parts and ``image_url`` parts with ``data:`` URLs -- the server
never fetches a URL); ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
``top_p``, ``seed``, ``response_format`` (``text``, ``json_object``, ``json_schema``), the
vLLM extensions ``top_k``, ``ignore_eos``, ``structured_outputs.regex`` and
``return_token_ids``; ``stream`` with ``stream_options.include_usage``. Anything that would
change the answer and is not supported (``tools``, ``stop``, ``n`` > 1, penalties,
``logprobs``) is refused, never ignored; other keys (``user``, ``metadata``, ...) are.

Images are read here only as far as their headers (format and size: within
``MAX_IMAGE_PIXELS`` each and ``MAX_REQUEST_PIXELS`` together) and decoded by whoever runs the
request (:func:`decoded`): a request waiting in the queue holds its images compressed, and an
image of an earlier turn the server still holds is never decoded at all.
"""

import base64
import binascii
from dataclasses import dataclass
import hashlib
import io

import numpy as np
from PIL import Image

from orin_llm_node.engine import SamplingParams

__all__ = ['ChatRequest', 'EncodedImage', 'RequestError', 'decoded', 'parse_chat_request']

#: The largest decoded image taken (pixels): far above any camera, far below a memory bomb.
MAX_IMAGE_PIXELS = 40_000_000
#: The most pixels of all the images of one request together (earlier turns included): 192 MB
#: of RGB at most, however many images a body of 32 MiB holds (a solid PNG of 40 Mpx is a few
#: hundred kB).
MAX_REQUEST_PIXELS = 64_000_000


class RequestError(Exception):
    """A request refused: the HTTP ``status`` and an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = 'invalid_request_error'):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        """The OpenAI error object."""
        return {'error': {'message': self.message, 'type': self.kind, 'param': self.param,
                          'code': self.status}}


@dataclass
class ChatRequest:
    """One request as the engine takes it.

    ``exchanges``: the earlier turns as (user message parts, assistant answer); ``parts``:
    the new user message (str and ``EncodedImage``, in order: :func:`decoded` gives the
    engine's str and RGB uint8 arrays). ``history_key`` names every
    message before the new one and ``key`` every message (images by a hash of their URL):
    the server finds the conversation to continue by them.
    """

    system: str | None
    exchanges: list[tuple[list, str]]
    parts: list
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    history_key: tuple
    key: tuple


@dataclass(frozen=True)
class EncodedImage:
    """An image of a request as it came (compressed), its size read from its header."""

    data: bytes
    width: int
    height: int
    where: str

    def decode(self) -> np.ndarray:
        """The RGB uint8 array (``ValueError`` when the data past the header is broken)."""
        try:
            with Image.open(io.BytesIO(self.data)) as img:
                return np.array(img.convert('RGB'))
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ValueError(f'{self.where}: the image cannot be decoded ({exc})') from None


def decoded(parts) -> list:
    """``parts`` with each ``EncodedImage`` decoded (the engine's str and RGB arrays)."""
    return [p.decode() if isinstance(p, EncodedImage) else p for p in parts]


#: Keys that would change the answer if honoured (refused unless at their "not used" value).
_UNSUPPORTED = ('tools', 'functions', 'tool_choice', 'stop', 'n', 'best_of', 'logprobs',
                'top_logprobs', 'logit_bias', 'frequency_penalty', 'presence_penalty')


def _unused(key: str, value) -> bool:
    # Whether ``value`` of an unsupported key asks for nothing (clients send the defaults).
    if value is None:
        return True
    if key in ('n', 'best_of'):
        return value == 1 and not isinstance(value, bool)
    if key == 'tool_choice':
        return value in ('none', 'auto')  # no tools are taken, so none are chosen
    if key in ('frequency_penalty', 'presence_penalty', 'top_logprobs'):
        return value == 0 and not isinstance(value, bool)
    return not value


def parse_chat_request(body, served_model: str, default_max_tokens: int) -> ChatRequest:
    """Read ``body`` (the parsed JSON); ``RequestError`` naming the first thing refused."""
    if not isinstance(body, dict):
        raise RequestError(400, 'the request body must be a JSON object')
    if body.get('model') != served_model:
        raise RequestError(404, f'The model {body.get("model")!r} does not exist (this server '
                                f'serves {served_model!r})', 'model', 'not_found_error')
    for key in _UNSUPPORTED:
        if not _unused(key, body.get(key)):
            raise RequestError(400, f'{key} is not supported by orin_llm_serve', key)
    system, exchanges, parts, keys = _messages(body.get('messages'), _PixelBudget())
    stream = _flag(body, 'stream')
    options = body.get('stream_options') or {}
    if not isinstance(options, dict):
        raise RequestError(400, 'stream_options must be an object', 'stream_options')
    return ChatRequest(
        system=system, exchanges=exchanges, parts=parts, sampling=_sampling(body,
                                                                            default_max_tokens),
        stream=stream, include_usage=stream and _flag(options, 'include_usage'),
        return_token_ids=_flag(body, 'return_token_ids'), history_key=tuple(keys[:-1]),
        key=tuple(keys))


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(400, f'{key} must be true or false', key)
    return value


def _sampling(body: dict, default_max_tokens: int) -> SamplingParams:
    max_tokens = body.get('max_completion_tokens', body.get('max_tokens'))
    values = {'max_tokens': default_max_tokens if max_tokens is None else max_tokens}
    for key in ('temperature', 'top_p', 'seed'):
        if body.get(key) is not None:
            values[key] = body[key]
    if body.get('top_k') is not None:
        values['top_k'] = 0 if body['top_k'] == -1 else body['top_k']  # vLLM: -1 = off
    if body.get('ignore_eos') is not None:
        values['ignore_eos'] = _flag(body, 'ignore_eos')
    values['response_format'] = _response_format(body)
    for key in ('temperature', 'top_p'):
        if key in values and (isinstance(values[key], bool)
                              or not isinstance(values[key], (int, float))):
            raise RequestError(400, f'{key} must be a number', key)
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


def _response_format(body: dict):
    fmt = body.get('response_format')
    regex = (body.get('structured_outputs') or {}).get('regex')
    if regex is not None:
        if fmt not in (None, {'type': 'text'}):
            raise RequestError(400, 'give response_format or structured_outputs, not both',
                               'structured_outputs')
        return {'type': 'regex', 'pattern': regex}
    if fmt is None:
        return None
    kind = fmt.get('type') if isinstance(fmt, dict) else None
    if kind == 'text':
        return None
    if kind == 'json_object':
        return {'type': 'json_object'}
    if kind == 'json_schema':
        spec = fmt.get('json_schema')
        if not isinstance(spec, dict) or not isinstance(spec.get('schema'), dict):
            raise RequestError(400, 'response_format.json_schema.schema must be a JSON Schema '
                                    'object', 'response_format')
        return {'type': 'json_schema', 'schema': spec['schema']}
    raise RequestError(400, 'response_format.type must be text, json_object or json_schema',
                       'response_format')


class _PixelBudget:
    # The pixels a request's images may still take (MAX_REQUEST_PIXELS in all).

    def __init__(self):
        self.left = MAX_REQUEST_PIXELS

    def take(self, image: EncodedImage) -> EncodedImage:
        pixels = image.width * image.height
        if pixels > self.left:
            raise RequestError(400, f'{image.where}: the images of the request hold more than '
                                    f'{MAX_REQUEST_PIXELS} pixels together', 'messages')
        self.left -= pixels
        return image


def _messages(messages, pixels: _PixelBudget):
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, 'messages must be a non-empty list', 'messages')
    system, keys = None, []
    if isinstance(messages[0], dict) and messages[0].get('role') in ('system', 'developer'):
        system = _text_only(messages[0].get('content'), 'messages[0]')
        keys.append(('system', system))
        messages = messages[1:]
    turns = []
    for i, message in enumerate(messages):
        where = f'messages[{i + (system is not None)}]'
        want = 'user' if i % 2 == 0 else 'assistant'
        role = message.get('role') if isinstance(message, dict) else None
        if role != want:
            raise RequestError(400, f'{where}: expected a {want} message, got role {role!r} '
                                    '(orin_llm_serve takes an optional system message, then '
                                    'user and assistant turns, ending with a user message)',
                               'messages')
        if role == 'assistant' and message.get('tool_calls'):
            raise RequestError(400, f'{where}: tool calls are not supported by orin_llm_serve',
                               'messages')
        if role == 'user':
            parts, key = _user_parts(message.get('content'), where, pixels)
            turns.append(parts)
            keys.append(('user', key))
        else:
            answer = _text_only(message.get('content'), where)
            turns.append(answer)
            keys.append(('assistant', answer))
    if len(turns) % 2 == 0:
        raise RequestError(400, 'the last message must be a user message', 'messages')
    exchanges = list(zip(turns[:-1:2], turns[1::2], strict=True))
    return system, exchanges, turns[-1], keys


def _text_only(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get('type') == 'text'
                                         and isinstance(p.get('text'), str) for p in content):
        return ''.join(p['text'] for p in content)
    raise RequestError(400, f'{where}: content must be text', 'messages')


def _user_parts(content, where: str, pixels: _PixelBudget):
    if isinstance(content, str):
        return [content], (('text', content),)
    if not isinstance(content, list) or not content:
        raise RequestError(400, f'{where}: content must be a string or a non-empty list of '
                                'parts', 'messages')
    parts, key = [], []
    for j, part in enumerate(content):
        kind = part.get('type') if isinstance(part, dict) else None
        if kind == 'text' and isinstance(part.get('text'), str):
            parts.append(part['text'])
            key.append(('text', part['text']))
        elif kind == 'image_url':
            url = (part.get('image_url') or {}).get('url') if isinstance(
                part.get('image_url'), dict) else part.get('image_url')
            parts.append(pixels.take(read_image(url, f'{where}.content[{j}]')))
            key.append(('image', hashlib.sha256(url.encode()).hexdigest()))
        else:
            raise RequestError(400, f'{where}.content[{j}]: part type {kind!r} is not supported '
                                    '(text and image_url are)', 'messages')
    return parts, tuple(key)


def read_image(url, where: str) -> EncodedImage:
    """The image of a ``data:image/...;base64,`` URL, its header read (``RequestError``)."""
    if not isinstance(url, str) or not url.startswith('data:image/') or ';base64,' not in url:
        raise RequestError(400, f'{where}: images must be data:image/...;base64 URLs (this '
                                'server fetches nothing)', 'messages')
    try:
        raw = base64.b64decode(url.split(';base64,', 1)[1], validate=True)
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise RequestError(400, f'{where}: the image cannot be decoded ({exc})',
                           'messages') from None
    if width * height > MAX_IMAGE_PIXELS:
        raise RequestError(400, f'{where}: image of {width}x{height} pixels is larger than '
                                f'{MAX_IMAGE_PIXELS} pixels', 'messages')
    return EncodedImage(raw, width, height, where)
