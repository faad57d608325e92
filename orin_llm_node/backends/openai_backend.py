# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-API backend: ``LLMEngine``'s conversation interface on a chat-completions server.

Each conversation keeps its own history (system prompt, user messages with their images as
PNG data URLs at the model's size -- see ``_user_message`` -- and answers) and sends it whole
with every prompt, streamed back over SSE: a server with a prefix cache (vLLM,
orin_llm_serve) reuses the KV of what it has seen. Single-threaded like the engine: one
caller; ``cancel()`` (and ``stats()``) from any thread.

Every server failure -- unreachable, silent, HTTP 4xx/5xx, a stream that breaks or ends
early, a restart -- ends the answer with ``finish_reason="error"`` and a one-line ``error``,
within ``timeout_s`` or ``request_timeout_s``; the failed turn leaves no trace in the history.
"""

from dataclasses import dataclass
import itertools
import json
import math
import threading
import time
import weakref

import numpy as np

from orin_llm_node.backends.backend_stats import BackendStats, StatsBook
from orin_llm_node.backends.openai_config import INSTALL_HINT, BackendUnavailable, OpenAIConfig
from orin_llm_node.backends.openai_stream import StreamExchange
from orin_llm_node.backends.openai_wire import (
    body_fields,
    error_text,
    image_data_url,
    one_line,
    user_content,
)
from orin_llm_node.engine import ChatResult, FinishReason, SamplingParams, Stage, StreamEvent
from orin_llm_node.engine.structured import parse_answer
from orin_llm_node.engine.thread_guard import SingleThreadGuard
from orin_llm_node.engine.turn import check_text
from orin_llm_node.processing import ImageProcessor
from orin_llm_node.valid_text import valid_text, valid_value

__all__ = ['OpenAIBackend', 'RemoteConversation', 'RemoteResult']

_ids = itertools.count()

#: How often a waiting answer looks at ``cancel()`` (seconds).
_POLL_S = 0.05

#: The largest ``GET /models`` answer read (bytes): a list of a few models is a kilobyte.
MODELS_MAX_BYTES = 2**20
#: The most characters an answer holds per token it may have (``max_tokens``): a real token
#: is a few characters; a server sending megabytes in one chunk is cut there.
MAX_TOKEN_CHARS = 256
#: The longest model name kept from a server's chunks.
MODEL_CHARS = 256

#: The finish reasons a server may give that mean what ours mean (orin_llm_serve passes the
#: engine's own through; OpenAI and vLLM give stop and length).
_KNOWN_FINISH = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.KV_EXHAUSTED,
                           FinishReason.CONTEXT_FULL, FinishReason.CANCELLED,
                           FinishReason.TIMEOUT})


@dataclass
class RemoteResult(ChatResult):
    """A ``ChatResult`` from a server. What the server does not say is None, never guessed.

    ``token_ids`` / ``prompt_token_ids``: None unless the server returns token ids
    (``OpenAIConfig.return_token_ids``); ``cached_tokens``: None unless the server reports
    them (``usage.prompt_tokens_details``); ``prompt_tokens`` / ``completion_tokens``: the
    server's ``usage`` (None without it); ``ttft_s``: to the first answer chunk as the client
    saw it; ``decode_tok_s``: None without a token count; ``vision_s``: None (the server
    does not say); ``model``: the model name the server answered with.
    """

    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class RemoteConversation:
    """One conversation's history as the server is sent it (made by ``new_conversation``)."""

    def __init__(self, system_prompt: str | None):
        self.id = next(_ids)
        self.system_prompt = system_prompt
        # (user message, assistant message, the user message's images at model size)
        self._turns: list[tuple[dict, dict, list[np.ndarray]]] = []

    @property
    def num_turns(self) -> int:
        """Answered user turns in the history."""
        return len(self._turns)

    def messages(self) -> list[dict]:
        """The history as chat-completions messages (system prompt first, when set)."""
        head = [] if self.system_prompt is None else [
            {'role': 'system', 'content': self.system_prompt}]
        return head + [m for user, answer, _ in self._turns for m in (user, answer)]

    def images(self) -> list[np.ndarray]:
        """The images of the history at the size the model sees them, in order."""
        return [img for _, _, imgs in self._turns for img in imgs]

    def add_turn(self, user: dict, answer: str, images: list[np.ndarray]) -> None:
        """Append an answered turn."""
        self._turns.append((user, {'role': 'assistant', 'content': answer}, images))

    def reset(self) -> None:
        """Back to the system prompt only."""
        self._turns.clear()


class OpenAIBackend:
    """Conversations answered by an OpenAI-compatible server; see the module docstring.

    The engine facts a node reports that a server does not give (``device``, ``dtype``,
    ``weight_format``, ...) are None.
    """

    backend = 'openai'
    device = dtype = weight_format = weight_bytes = None
    uses_cuda_graph = attention_backend = backend_fallback_reason = None

    def __init__(self, config: OpenAIConfig):
        """Prepare the client (no request yet: ``check`` asks the server).

        ``BackendUnavailable`` without httpx; ``ValueError`` when ``api_key_env`` names an
        unset variable or ``processor_path`` has no ``preprocessor_config.json``.
        """
        try:
            import httpx
        except ImportError:
            raise BackendUnavailable(f'backend openai needs httpx, which is not installed: '
                                     f'{INSTALL_HINT}') from None
        self.config = config
        key = config.api_key()
        self._headers = {'Authorization': f'Bearer {key}'} if key else {}
        processor = (ImageProcessor.from_pretrained(config.processor_path)
                     if config.processor_path else ImageProcessor())
        self.image_processor = processor.capped(max_pixels=config.image_max_pixels,
                                                min_pixels=config.image_min_pixels)
        # trust_env=False: no proxy from the environment between a robot and its server.
        self._client = httpx.Client(trust_env=False, timeout=httpx.Timeout(
            connect=config.connect_timeout_s, read=config.read_timeout_s,
            write=config.read_timeout_s, pool=config.connect_timeout_s))
        self._cancel = threading.Event()
        self._guard = SingleThreadGuard()
        # Every live conversation (for reset()); a weak map, so dropping one frees it.
        self._conversations: weakref.WeakValueDictionary[int, RemoteConversation] = (
            weakref.WeakValueDictionary())
        self._book = StatsBook(BackendStats(self.backend, config.base_url, config.model))

    @property
    def model(self) -> str:
        """The model name the server is asked for."""
        return self.config.model

    @property
    def server_model(self) -> str | None:
        """The model name the server last answered with (None before it answered)."""
        return self._book.snapshot().server_model

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def check(self) -> list[str]:
        """Ask the server which models it serves; ``BackendUnavailable`` unless ours is one.

        Refused in one line: a server that does not answer within the connect and read
        timeouts, or whose whole answer takes longer than both together (a server dripping
        bytes), an answer over :data:`MODELS_MAX_BYTES`, an HTTP error (a wrong key: 401), an
        answer that is not a model list, a list without ``model``. Returns the served model
        names.
        """
        import httpx
        url = f'{self.config.api_root}/models'
        within = self.config.connect_timeout_s + self.config.read_timeout_s
        try:
            status, text = _bounded_get(self._client, url, self._headers, within)
        except httpx.HTTPError as exc:
            self._book.contact(False)
            raise BackendUnavailable(f'server {self.config.base_url} did not answer: '
                                     f'{one_line(exc) or type(exc).__name__}') from None
        except _Unanswered as exc:
            self._book.contact(exc.reached)
            raise BackendUnavailable(f'server {self.config.base_url} {exc}') from None
        self._book.contact(True)
        if status != 200:
            raise BackendUnavailable(f'server {self.config.base_url}: {error_text(status, text)}')
        try:
            names = [m['id'] for m in json.loads(text, parse_constant=lambda name: None)['data']]
            if not all(isinstance(name, str) for name in names):
                raise TypeError
            names = [valid_text(name) for name in names]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise BackendUnavailable(f'server {self.config.base_url} answered GET /models '
                                     'with something that is not a model list') from None
        if self.config.model not in names:
            raise BackendUnavailable(
                f'server {self.config.base_url} does not serve model {self.config.model!r} '
                f'(it serves {one_line(", ".join(map(repr, names)), 160) or "none"})')
        self._book.contact(True, self.config.model)
        return names

    def stats(self) -> BackendStats:
        """What the backend has seen of its server (any thread)."""
        return self._book.snapshot()

    def new_conversation(self, system_prompt: str | None = None) -> RemoteConversation:
        """Start a conversation (``ValueError`` for a system prompt that is not text)."""
        if system_prompt is not None:
            check_text('system prompt', system_prompt)
        conv = RemoteConversation(system_prompt)
        self._conversations[conv.id] = conv
        return conv

    def reset(self, conv: RemoteConversation | None = None) -> None:
        """Forget ``conv``'s history (every conversation's when None); keeps its system prompt."""
        with self._guard.hold('reset'):
            for c in list(self._conversations.values()) if conv is None else [conv]:
                c.reset()

    def cancel(self) -> None:
        """End the answer in progress now (thread-safe); its text so far is kept."""
        self._cancel.set()

    def chat(self, conv: RemoteConversation, text, images=None,
             sampling: SamplingParams | None = None, *, videos=None,
             tool_results=None) -> RemoteResult:
        """Answer a user message in ``conv``: ``chat_stream`` run to its end."""
        result = None
        for event in self.chat_stream(conv, text, images, sampling, videos=videos,
                                      tool_results=tool_results):
            result = event.result
        return result

    def chat_stream(self, conv: RemoteConversation, text, images=None,
                    sampling: SamplingParams | None = None, *, videos=None, tool_results=None,
                    on_stage=None):
        """Like ``LLMEngine.chat_stream``: ``StreamEvent``s, the last with a ``RemoteResult``.

        The message is ``images`` then ``text`` (a str, or a list of str and image parts in
        order). Bad input raises ``ValueError`` before anything is sent; video clips are
        refused (the chat-completions API has no portable way to carry a clip's frame times),
        and so are ``tools``, ``detect`` and ``tool_results`` (not sent to a server yet: only
        the local engine holds calls and boxes to their grammar).
        ``on_stage``: as the engine's, with the stages a client can tell apart: ``prefill``
        once the request is sent (the server's image encoding included), ``decoding`` at the
        first streamed text.
        """
        if tool_results is not None or (sampling is not None and (
                sampling.tools or sampling.detect is not None)):
            raise ValueError('backend openai sends no tools, tool results or detect requests '
                             'to the server (yet): the local engine (backend local) answers '
                             'them')
        with self._guard.hold('chat_stream'):
            yield from self._chat_stream(conv, text, images, sampling, videos,
                                         on_stage or (lambda stage: None))

    # ---- internals -------------------------------------------------------------------------

    def _user_message(self, text, images, videos):
        if videos:
            raise ValueError('backend openai sends no video clips (the chat-completions API '
                             'has no portable way to carry their frame times)')
        if isinstance(images, np.ndarray):
            raise ValueError('images must be a list of H x W x 3 uint8 arrays, got one bare '
                             'array (pass [image])')
        items = [*(images or []), *(text if isinstance(text, (list, tuple)) else [text])]
        parts, sent = [], []
        for item in items:
            if isinstance(item, str):
                check_text('text', item)
                parts.append(('text', item))
            elif isinstance(item, np.ndarray):
                resized = self.image_processor.resize(item)   # ValueError for a bad array
                sent.append(resized)
                # The server resizes what it gets with the same rule: the model-size image
                # when that rule leaves it as it is, else (a checkpoint whose pixel bounds
                # meet, like the demo's) the frame itself, so both sides see the same pixels.
                fixed = self.image_processor.target_size(*resized.shape[:2]) == resized.shape[:2]
                parts.append(('image', image_data_url(resized if fixed else item)))
            else:
                raise ValueError(f'message content must be text or an image (H x W x 3 uint8 '
                                 f'array), got {type(item).__name__}')
        return {'role': 'user', 'content': user_content(parts)}, sent

    def _chat_stream(self, conv, text, images, sampling, videos, on_stage):
        t0 = time.monotonic()
        self._cancel.clear()
        sampling = sampling or SamplingParams()
        sampling.validate()
        user, sent = self._user_message(text, images, videos)
        body = {'model': self.config.model, 'messages': [*conv.messages(), user],
                'stream': True, 'stream_options': {'include_usage': True},
                **body_fields(sampling)}
        if self.config.return_token_ids:
            body['return_token_ids'] = True
        turn = _Turn(t0, prompt_images=[*conv.images(), *sent], max_tokens=sampling.max_tokens)
        backend_deadline = t0 + self.config.request_timeout_s
        answer_deadline = math.inf if sampling.timeout_s is None else t0 + sampling.timeout_s
        exchange = StreamExchange(self._client, f'{self.config.api_root}/chat/completions',
                                  self._headers, body, self.config.retries,
                                  self.config.retry_backoff_s,
                                  min(backend_deadline, answer_deadline)).start()
        on_stage(Stage.PREFILL)
        decoding = False
        try:
            while turn.finish is None:
                now = time.monotonic()
                if self._cancel.is_set():
                    turn.finish = FinishReason.CANCELLED
                elif now >= answer_deadline:
                    turn.finish = FinishReason.TIMEOUT
                elif now >= backend_deadline:
                    turn.fail(f'no complete answer within request_timeout_s '
                              f'({self.config.request_timeout_s:g} s)')
                else:
                    event = exchange.next_event(min(_POLL_S, backend_deadline - now,
                                                    answer_deadline - now))
                    for step in self._on_event(turn, event) if event is not None else ():
                        if not decoding:
                            decoding = True
                            on_stage(Stage.DECODING)
                        yield step
        except GeneratorExit:  # the caller closed the stream: a cancelled answer, kept
            turn.finish = FinishReason.CANCELLED
            self._close_turn(conv, user, sent, turn, sampling, exchange)
            raise
        finally:
            exchange.close()
        self._close_turn(conv, user, sent, turn, sampling, exchange)
        yield StreamEvent('', result=turn.result)

    def _on_event(self, turn, event):
        # What a server sends is taken within bounds and made valid: the first choice only,
        # nothing after its finish_reason, at most max_tokens tokens and MAX_TOKEN_CHARS
        # characters per token asked for (a server that ignores max_tokens is cut there:
        # finish_reason length), every string valid Unicode.
        kind, payload = event
        if kind == 'error':
            turn.fail(payload)
            return
        if kind == 'done':
            if turn.server_finish is None:
                turn.fail('the server ended the stream without a finish_reason')
            else:
                turn.finish = turn.server_finish
            return
        turn.reached = True
        model = payload.get('model')
        if isinstance(model, str) and model.strip():
            turn.model = one_line(model, MODEL_CHARS)
        prompt_ids = _token_ids(payload.get('prompt_token_ids'))
        if prompt_ids is not None:
            turn.prompt_ids = prompt_ids
        usage = payload.get('usage')
        if isinstance(usage, dict):
            turn.usage = usage
        choice = _first_choice(payload.get('choices'))
        if choice is None or turn.server_finish is not None:
            return                      # another choice's, or text after the answer's end
        delta = choice.get('delta')
        content = delta.get('content') if isinstance(delta, dict) else None
        text = valid_text(content) if isinstance(content, str) else ''
        ids = _token_ids(choice.get('token_ids'))
        tokens = len(ids) if ids is not None else int(bool(text))
        if turn.tokens + tokens > turn.max_tokens:
            turn.finish = FinishReason.LENGTH       # the server went past max_tokens
            return
        room = turn.max_tokens * MAX_TOKEN_CHARS - turn.chars
        if len(text) > room:
            text, turn.finish = text[:room], FinishReason.LENGTH
        turn.tokens += tokens
        turn.chars += len(text)
        if ids is None:
            turn.all_ids = turn.all_ids and not text    # text without its token ids
        else:
            turn.token_ids.extend(ids)
        if text or ids:
            now = time.monotonic()
            turn.t_first = turn.t_first or now
            turn.t_last = now
        reason = choice.get('finish_reason')
        if reason is not None and turn.finish is None:
            known = isinstance(reason, str) and reason in _KNOWN_FINISH
            turn.server_finish = reason if known else ''
            if not known:
                turn.fail(f'the server ended the answer with finish_reason {reason!r}'
                          + (f': {one_line(choice["error"], 160)}'
                             if choice.get('error') else ''))
        if text:
            turn.text.append(text)
            yield StreamEvent(text, ids[0] if ids and len(ids) == 1 else None)

    def _close_turn(self, conv, user, sent, turn, sampling, exchange):
        text = ''.join(turn.text)
        valid = parsed = None
        fmt = sampling.response_format
        if fmt is not None and turn.finish != FinishReason.ERROR:
            valid = turn.finish == FinishReason.STOP
            try:
                # Its strings valid: a JSON escape such as "\\ud83d" parses to a lone surrogate.
                parsed = valid_value(parse_answer(fmt, text)) if valid else None
            except ValueError as exc:
                turn.fail(f"the server's answer is not valid JSON: {one_line(exc, 120)}")
                valid = False
        # A count is a count (NaN, a negative number, a string: unknown), never a failed answer.
        usage = turn.usage or {}
        details = usage.get('prompt_tokens_details')
        details = details if isinstance(details, dict) else {}
        completion = _count(usage.get('completion_tokens'))
        ids = (turn.token_ids if self.config.return_token_ids and turn.all_ids and turn.reached
               else None)
        count = completion if completion is not None else (len(ids) if ids is not None
                                                           else None)
        span = turn.t_last - turn.t_first if turn.t_first else 0.0
        tok_s = (count - 1) / span if count is not None and count > 1 and span > 0 else None
        error = turn.error
        turn.result = RemoteResult(
            text=text, token_ids=ids if error is None else None,
            prompt_token_ids=turn.prompt_ids, prompt_images=turn.prompt_images,
            finish_reason=turn.finish, cached_tokens=_count(details.get('cached_tokens')),
            ttft_s=(turn.t_first - turn.t0) if turn.t_first else 0.0, decode_tok_s=tok_s,
            vision_s=None, error=error, valid=valid, parsed=parsed, model=turn.model,
            prompt_tokens=_count(usage.get('prompt_tokens')), completion_tokens=completion)
        if exchange.answered or error is not None:  # a cancel before any answer says nothing
            self._book.contact(exchange.answered, turn.model)
        if error is not None:
            self._book.failed(error, exchange.retries)
            return
        conv.add_turn(user, text, sent)
        self._book.answered(turn.result.ttft_s if turn.t_first else None, tok_s,
                            exchange.retries)


class _Turn:
    """Bookkeeping of the answer in progress."""

    def __init__(self, t0: float, prompt_images: list[np.ndarray], max_tokens: int):
        self.t0, self.prompt_images, self.max_tokens = t0, prompt_images, max_tokens
        self.t_first = self.t_last = 0.0
        self.text: list[str] = []
        self.chars = 0  # characters of text so far
        self.tokens = 0  # tokens so far: their ids, else one per chunk with text
        self.token_ids: list[int] = []
        self.all_ids = True  # every chunk carried its token ids
        self.prompt_ids: list[int] | None = None
        self.usage: dict | None = None
        self.model: str | None = None
        self.reached = False  # the server sent at least one chunk
        self.server_finish: str | None = None  # '' for a reason we do not know
        self.finish: str | None = None
        self.error: str | None = None
        self.result: RemoteResult | None = None

    def fail(self, reason: str) -> None:
        """End the answer as failed with ``reason`` (the first failure wins)."""
        if self.error is None:
            self.finish, self.error = FinishReason.ERROR, one_line(reason)


def _first_choice(choices):
    # The answer's choice: index 0 (one without an index counts as 0; the first such wins).
    if not isinstance(choices, list):
        return None
    return next((c for c in choices if isinstance(c, dict) and c.get('index', 0) == 0), None)


def _token_ids(value):
    # A list of token ids, or None for anything else (a server's garbage is no count).
    if isinstance(value, list) and all(_count(v) is not None for v in value):
        return list(value)
    return None


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


class _Unanswered(Exception):
    # No usable answer to a bounded GET; str(err): what the server did (after its URL).

    def __init__(self, text, reached):
        super().__init__(text)
        self.reached = reached


def _bounded_get(client, url, headers, within_s):
    # (status, text) of GET url, the whole answer within within_s seconds and MODELS_MAX_BYTES;
    # _Unanswered if not, an httpx.HTTPError if unreachable.  On a thread of its own: a socket
    # read cannot be given a deadline from outside, and a server may send one byte per read
    # timeout for ever.  Past the deadline the response is closed under it (its read ends).
    got, lock, response = {}, threading.Lock(), []

    def fetch():
        try:
            with client.stream('GET', url, headers=headers) as answer:
                with lock:
                    response.append(answer)
                body = bytearray()
                for piece in answer.iter_bytes():
                    body += piece
                    if len(body) > MODELS_MAX_BYTES:
                        got['error'] = _Unanswered(
                            f'answered GET /models with more than {MODELS_MAX_BYTES} bytes: '
                            'not a model list', True)
                        return
                got['answer'] = (answer.status_code, body.decode('utf-8', 'replace'))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            got['error'] = exc

    thread = threading.Thread(target=fetch, name='openai_models', daemon=True)
    thread.start()
    thread.join(within_s)
    if thread.is_alive():
        with lock:
            for answer in response:
                answer.close()
        raise _Unanswered(f'did not answer GET /models within {within_s:g} s (connect + read '
                          'timeouts)', bool(response))
    if 'error' in got:
        raise got['error']
    return got['answer']
