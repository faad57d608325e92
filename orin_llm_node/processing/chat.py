# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Chat rendering with the checkpoint's own template, tokenization and image pad expansion.

The template is rendered the way transformers' ``apply_chat_template`` does it: a sandboxed
jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a
``tojson`` that does not HTML-escape, ``raise_exception``, ``strftime_now``, and the tokenizer's
named special tokens (``eos_token``, ...) as template variables. Tokenization uses the
``tokenizers`` library directly on ``tokenizer.json``; no token id is hard-coded, every id is
looked up from the checkpoint.

Message text is tokenized as text (``Tokenizer.encode_parts``): an added token's string (such as
``<|im_start|>``) typed by a user gives the ids of its characters, never the control token;
only the template's own text yields control tokens. transformers' ``apply_chat_template``
parses them in message text too; on text without such strings both give the same ids.
"""

from collections.abc import Sequence
from datetime import datetime
import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
import numpy as np
import tokenizers

__all__ = ['ChatTemplate', 'Tokenizer', 'expand_image_pads', 'user_message']

# Named special tokens transformers hands to every chat template (SPECIAL_TOKENS_ATTRIBUTES).
_NAMED_SPECIAL_TOKENS = (
    'bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token',
)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding='utf-8'))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ValueError(f'{path} is not valid JSON: {exc}') from None


def _token_content(value) -> str | None:
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get('content')
    return value if isinstance(value, str) else None


def _plain(value):
    # Like transformers' _plain_template_data: the template sees plain JSON-like data only;
    # anything else (an image array in a content block) becomes an inert placeholder.
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return f'<{type(value).__name__}>'


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=['jinja2.ext.loopcontrols']
    )
    env.filters['tojson'] = _tojson
    env.globals['raise_exception'] = _raise_exception
    env.globals['strftime_now'] = _strftime_now
    return env.from_string(template)


def user_message(text: str, num_images: int = 0) -> dict:
    """Return an HF-style user message: ``num_images`` image items, then the text."""
    content = [{'type': 'image'} for _ in range(num_images)]
    content.append({'type': 'text', 'text': text})
    return {'role': 'user', 'content': content}


class ChatTemplate:
    """A checkpoint's jinja chat template, rendered like ``apply_chat_template``."""

    def __init__(self, template: str, special_tokens: dict[str, str] | None = None):
        self.template = template
        self.special_tokens = dict(special_tokens or {})
        self._compiled = _compile(template)

    @classmethod
    def from_pretrained(cls, model_dir) -> 'ChatTemplate':
        """
        Load the template the way transformers' tokenizer does.

        ``chat_template.jinja`` wins over ``tokenizer_config.json``'s ``chat_template`` (a string
        or a list of named templates, of which ``default`` is used); a processor-style
        ``chat_template.json`` is the last resort. Named special tokens come from
        ``tokenizer_config.json`` (and ``special_tokens_map.json``).
        """
        root = Path(model_dir)
        tok_cfg = _read_json(root / 'tokenizer_config.json') or {}
        template = None
        jinja_file = root / 'chat_template.jinja'
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding='utf-8')
        if template is None:
            template = tok_cfg.get('chat_template')
            if isinstance(template, list):
                named = {t.get('name'): t.get('template') for t in template}
                template = named.get('default')
        if template is None:
            template = (_read_json(root / 'chat_template.json') or {}).get('chat_template')
        if not isinstance(template, str):
            raise ValueError(f'no chat template found in {model_dir}')
        special = {}
        legacy_map = _read_json(root / 'special_tokens_map.json') or {}
        for name in _NAMED_SPECIAL_TOKENS:
            content = _token_content(tok_cfg.get(name)) or _token_content(legacy_map.get(name))
            if content is not None:
                special[name] = content
        return cls(template, special)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               tools: Sequence[dict] | None = None, **template_kwargs) -> str:
        """
        Render HF-style messages to the prompt text.

        ``messages``: dicts with ``role`` (system / user / assistant / tool) and ``content`` (a
        string, or a list of ``{"type": "image"}`` and ``{"type": "text", "text": ...}``
        items). Keys whose value is ``None`` are dropped, as transformers does. ``tools``: the
        function definitions the template's ``tools`` branch renders (OpenAI shapes, as
        ``apply_chat_template(..., tools=...)`` takes them). Extra keyword arguments are
        template variables (they override the special tokens of the same name). A template
        error (its ``raise_exception``) raises ``ValueError``.
        """
        if not messages:
            raise ValueError('cannot render an empty conversation')
        chat = []
        for message in messages:
            if not isinstance(message, dict):
                raise TypeError(f'chat messages must be dicts, got {message!r}')
            chat.append(_plain({k: v for k, v in message.items() if v is not None}))
        variables = {**self.special_tokens, **_plain(template_kwargs)}
        try:
            return self._compiled.render(
                messages=chat, tools=_plain(list(tools)) if tools else None, documents=None,
                add_generation_prompt=add_generation_prompt, **variables,
            )
        except jinja2.TemplateError as exc:  # the template's raise_exception, a bad value
            raise ValueError(f'the chat template cannot render this conversation: {exc}'
                             ) from None


def expand_image_pads(
    ids: Sequence[int], tokens_per_image: Sequence[int], image_pad_id: int
) -> list[int]:
    """
    Replace the k-th ``image_pad_id`` in ``ids`` with ``tokens_per_image[k]`` copies of it.

    Raises ``ValueError`` when the number of pads differs from ``len(tokens_per_image)``.
    """
    out: list[int] = []
    k = 0
    for tok in ids:
        if tok == image_pad_id:
            if k >= len(tokens_per_image):
                raise ValueError(
                    f'prompt has more image pads than images ({len(tokens_per_image)})'
                )
            out.extend([image_pad_id] * int(tokens_per_image[k]))
            k += 1
        else:
            out.append(int(tok))
    if k != len(tokens_per_image):
        raise ValueError(f'prompt has {k} image pad(s) but {len(tokens_per_image)} image(s)')
    return out


class Tokenizer:
    """
    ``tokenizers.Tokenizer`` from a checkpoint's ``tokenizer.json``, plus the Qwen-VL special ids.

    ``image_pad_id``, ``video_pad_id``, ``vision_start_id``, ``vision_end_id``, ``im_start_id``
    and ``im_end_id`` are looked up by their token strings (and checked against ``config.json``'s
    ``image_token_id`` & co. when present); ``eos_ids`` are ``generation_config.json``'s
    ``eos_token_id`` (int or list) followed by ``tokenizer_config.json``'s ``eos_token``.
    """

    IMAGE_PAD = '<|image_pad|>'
    VIDEO_PAD = '<|video_pad|>'
    VISION_START = '<|vision_start|>'
    VISION_END = '<|vision_end|>'
    IM_START = '<|im_start|>'
    IM_END = '<|im_end|>'

    # config.json key -> token string it must name.
    _CONFIG_IDS = {
        'image_token_id': IMAGE_PAD,
        'video_token_id': VIDEO_PAD,
        'vision_start_token_id': VISION_START,
        'vision_end_token_id': VISION_END,
    }

    def __init__(self, tokenizer: tokenizers.Tokenizer, eos_ids: Sequence[int] = (),
                 config_ids: dict[str, int] | None = None):
        self._tok = tokenizer
        for key, token in self._CONFIG_IDS.items():
            expected = (config_ids or {}).get(key)
            if expected is not None and tokenizer.token_to_id(token) != expected:
                raise ValueError(
                    f'config {key}={expected} but the tokenizer has {token} as '
                    f'{tokenizer.token_to_id(token)}'
                )
        self.image_pad_id = self.token_id(self.IMAGE_PAD)
        self.vision_start_id = self.token_id(self.VISION_START)
        self.vision_end_id = self.token_id(self.VISION_END)
        self.im_start_id = self.token_id(self.IM_START)
        self.im_end_id = self.token_id(self.IM_END)
        self.video_pad_id = tokenizer.token_to_id(self.VIDEO_PAD)
        # Every added token (control tokens and the rest), and a copy of the tokenizer that
        # knows none of them: what message text is tokenized with (encode_parts).
        added = tokenizer.get_added_tokens_decoder()
        self.added_ids = frozenset(added)
        self._added = {tok.content: i for i, tok in added.items()}
        self.added_texts = frozenset(self._added)
        plain = json.loads(tokenizer.to_str())
        plain['added_tokens'] = []
        self._text_tok = tokenizers.Tokenizer.from_str(json.dumps(plain))
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
        if not self.eos_ids:
            self.eos_ids = (self.im_end_id,)

    @classmethod
    def from_pretrained(cls, model_dir) -> 'Tokenizer':
        """Load ``tokenizer.json`` and the eos ids of a checkpoint directory."""
        root = Path(model_dir)
        path = root / 'tokenizer.json'
        if not path.is_file():
            raise ValueError(f'no tokenizer.json in {model_dir}')
        tok = tokenizers.Tokenizer.from_file(str(path))
        eos: list[int] = []
        gen_eos = (_read_json(root / 'generation_config.json') or {}).get('eos_token_id')
        if isinstance(gen_eos, int):
            eos.append(gen_eos)
        elif isinstance(gen_eos, list):
            eos.extend(int(i) for i in gen_eos)
        tok_cfg = _read_json(root / 'tokenizer_config.json') or {}
        eos_token = _token_content(tok_cfg.get('eos_token'))
        if eos_token is not None and tok.token_to_id(eos_token) is not None:
            eos.append(tok.token_to_id(eos_token))
        config = _read_json(root / 'config.json') or {}
        config_ids = {k: config[k] for k in cls._CONFIG_IDS if isinstance(config.get(k), int)}
        return cls(tok, eos, config_ids)

    @property
    def vocab_size(self) -> int:
        """Number of tokens, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Return the id of ``token``; ``ValueError`` when the vocabulary lacks it."""
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f'tokenizer has no token {token!r}')
        return tid

    def added_token_id(self, token: str) -> int | None:
        """The id of the added token ``token`` (e.g. ``<tool_call>``); None when there is none."""
        return self._added.get(token)

    def encode(self, text: str) -> list[int]:
        """Tokenize ``text``; special tokens written in it are recognised, no BOS is added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Tokenize ``text`` as text: added-token strings in it are not recognised."""
        return self._text_tok.encode(text, add_special_tokens=False).ids if text else []

    def encode_parts(self, parts: Sequence[tuple[str, bool]]) -> list[int]:
        """Tokenize a rendered prompt given as ``(text, trusted)`` pieces, in order.

        Added tokens are recognised in trusted pieces (the chat template's own text) only;
        untrusted pieces (message text) are plain text. The text between two recognised tokens
        is tokenized as one run, as ``tokenizers`` does it, so the ids equal ``encode`` of the
        joined text whenever the untrusted pieces hold no added-token string.
        """
        ids: list[int] = []
        run: list[str] = []
        for text, trusted in parts:
            if not trusted:
                run.append(text)
                continue
            pos = 0
            enc = self._tok.encode(text, add_special_tokens=False)
            for tid, (start, end) in zip(enc.ids, enc.offsets, strict=True):
                if tid in self.added_ids:
                    run.append(text[pos:start])
                    ids.extend(self.encode_text(''.join(run)))
                    ids.append(tid)
                    run, pos = [], end
            run.append(text[pos:])
        ids.extend(self.encode_text(''.join(run)))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into text."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def expand_image_pads(self, ids: Sequence[int], tokens_per_image: Sequence[int]) -> list[int]:
        """Replace the k-th image pad with ``tokens_per_image[k]`` copies (see the function)."""
        return expand_image_pads(ids, tokens_per_image, self.image_pad_id)
