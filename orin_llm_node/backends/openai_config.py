# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the OpenAI-API backend needs to reach a server: address, model, key, timeouts, retries.

Validated once, at construction (``ValueError`` naming the first bad field). The API key itself
is never a field: ``api_key_env`` names the environment variable that holds it, so the key
never appears in a parameter file, a log line, a ``repr`` or an error message.
"""

from dataclasses import dataclass
import math
import os
from urllib.parse import urlsplit

__all__ = ['INSTALL_HINT', 'BackendUnavailable', 'OpenAIConfig']

INSTALL_HINT = 'pip install -r requirements/openai.txt (httpx)'


class BackendUnavailable(ValueError):
    """The backend cannot run: its HTTP client is not installed, or the server refuses it."""


@dataclass(frozen=True)
class OpenAIConfig:
    """One OpenAI-compatible chat-completions server and how patiently to talk to it.

    ``base_url``: the API root, e.g. ``http://gpu-box:8000/v1``. ``model``: the name the
    server serves the model under (``GET /models`` must list it). ``api_key_env``: the name
    of the environment variable holding the API key ('' = send no key).

    Timeouts: ``connect_timeout_s`` to open a connection, ``read_timeout_s`` of silence
    between two pieces of the answer (the first one included: a server slower than this is
    a failure), ``request_timeout_s`` for a whole answer. ``retries``: how many more times
    a request is sent when the server could not be reached or answered 429/5xx before any
    answer text arrived, after ``retry_backoff_s``, doubling each time. A stream that breaks
    after text arrived is never sent again (the text is already out).

    ``return_token_ids``: ask for the answer's token ids (vLLM's and orin_llm_serve's
    ``return_token_ids`` extension; a server that does not know it may refuse the request).

    Images are sent at the size the model sees them, resized here as the local engine does:
    ``processor_path`` is a directory with the checkpoint's ``preprocessor_config.json`` and
    ``video_preprocessor_config.json`` ('' = Qwen3-VL's published values);
    ``image_max_pixels`` / ``image_min_pixels`` are the node's bounds on top of them.
    """

    base_url: str
    model: str
    api_key_env: str = ''
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 60.0
    request_timeout_s: float = 300.0
    retries: int = 2
    retry_backoff_s: float = 0.5
    return_token_ids: bool = False
    processor_path: str = ''
    image_max_pixels: int | None = None
    image_min_pixels: int | None = None

    def __post_init__(self):
        parts = urlsplit(self.base_url) if isinstance(self.base_url, str) else None
        if parts is None or parts.scheme not in ('http', 'https') or not parts.hostname:
            raise ValueError(f'base_url must be an http(s) URL such as http://host:8000/v1, '
                             f'got {self.base_url!r}')
        if parts.username or parts.password:
            raise ValueError('base_url must not carry credentials: name the variable holding '
                             'the API key in api_key_env')
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError('model must name the model the server serves, got '
                             f'{self.model!r}')
        if not isinstance(self.api_key_env, str) or (
                self.api_key_env and not self.api_key_env.replace('_', 'A').isalnum()):
            raise ValueError('api_key_env must be the name of an environment variable '
                             f'(letters, digits, _), got {self.api_key_env!r}')
        for name in ('connect_timeout_s', 'read_timeout_s', 'request_timeout_s'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f'{name} must be a finite number > 0, got {value!r}')
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not (
                0 <= self.retries <= 10):
            raise ValueError(f'retries must be an integer in [0, 10], got {self.retries!r}')
        backoff = self.retry_backoff_s
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not (
                math.isfinite(backoff) and backoff >= 0):
            raise ValueError(f'retry_backoff_s must be a finite number >= 0, got {backoff!r}')
        if not isinstance(self.return_token_ids, bool):
            raise ValueError(f'return_token_ids must be a bool, got {self.return_token_ids!r}')
        for name in ('image_max_pixels', 'image_min_pixels'):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f'{name} must be None or an integer >= 1, got {value!r}')

    @property
    def api_root(self) -> str:
        """``base_url`` without a trailing slash (paths are appended to it)."""
        return self.base_url.rstrip('/')

    def api_key(self) -> str | None:
        """The key from ``api_key_env`` (None when no variable is named).

        ``ValueError`` when the named variable is unset or empty: a key that is meant to be
        sent and is missing is a configuration error, not an anonymous request.
        """
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, '')
        if not key.strip():
            raise ValueError(f'api_key_env names {self.api_key_env}, which is not set in the '
                             'environment (or empty)')
        return key.strip()
