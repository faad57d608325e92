# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The HTTP side of orin_llm_serve: ``/v1/models``, ``/v1/chat/completions``, ``/health``.

A request is read (``chat_request``), queued on the engine's thread (``engine_worker``) and
answered as a JSON completion or as server-sent events. Errors have the OpenAI shape. A
streamed answer starts only once the engine has taken the request: a request the engine
refuses (bad input, a prompt longer than the context) is an HTTP error, not a stream. When a
client goes away, its queued request is dropped and its running answer cancelled, streamed or
not.

What the event loop never does: hold more of a body than ``max_request_bytes`` (it is read
chunk by chunk and refused with 413 once past it), parse a body (a thread does, one at a
time, so ``/health`` answers meanwhile) or decode an image (the engine's thread does). Every
request names a host this server answers for in its ``Host`` header (``allowed_hosts``: a
page under another name, as DNS rebinding makes one, is refused with 400) and every chat
request is ``application/json`` (415 otherwise: the simple requests a web page may send
without asking first are none); no CORS header is ever sent, so browsers keep other origins'
scripts from reading an answer.

Extensions a client may use: ``return_token_ids`` (vLLM's: ``prompt_token_ids`` and per
choice ``token_ids``), ``usage.prompt_tokens_details.cached_tokens`` (prefix-cache hits),
and the engine's own finish reasons beside ``stop`` and ``length`` (``kv_exhausted``,
``context_full``, ``timeout``, ``cancelled``, ``error`` with the choice's ``error``).
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
import hmac
import json
import time
import uuid

from orin_llm_node import bounded_json
from orin_llm_node.serve.chat_request import RequestError, parse_chat_request
from orin_llm_node.serve.engine_worker import Job, QueueFull

__all__ = ['create_app', 'host_name']


def create_app(worker, served_model: str, *, api_key: str | None = None,
               default_max_tokens: int = 512, max_request_bytes: int = 32 * 2**20,
               max_model_len: int | None = None,
               allowed_hosts=('127.0.0.1', 'localhost', '::1')):
    """The ASGI app serving ``worker``'s engine as ``served_model``.

    ``allowed_hosts``: the host names (no port) a request's ``Host`` header may name, ``'*'``
    among them for any; ``'ip'`` among them for any IP address (what a client that reaches a
    wildcard-bound server by address sends, and DNS rebinding never does).
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    app = FastAPI(title='orin_llm_serve', docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    # One body parsed at a time: a parse holds a body and its JSON, and the engine takes one
    # request at a time anyway.
    parser = ThreadPoolExecutor(1, thread_name_prefix='orin_llm_serve_parse')
    hosts = _HostCheck(allowed_hosts)

    def refuse(error: RequestError, headers=None):
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    def guard(app_):
        # Pure ASGI (a BaseHTTPMiddleware would sit between the routes and their receive).
        async def guarded(scope, receive, send):
            if scope['type'] == 'http':
                error = hosts.refusal(_header(scope, b'host'))
                if error is None and api_key is not None:
                    given = _header(scope, b'authorization') or ''
                    if not hmac.compare_digest(given.encode(), f'Bearer {api_key}'.encode()):
                        error = RequestError(401, 'missing or wrong API key (Authorization: '
                                                  'Bearer ...)', kind='authentication_error')
                if error is not None:
                    await refuse(error)(scope, receive, send)
                    return
            await app_(scope, receive, send)
        return guarded

    app.add_middleware(guard)

    @app.get('/health')
    async def health():
        return {'status': 'ok', 'model': served_model, 'busy': worker.running is not None,
                'queue_depth': worker.queue_depth()}

    @app.get('/v1/models')
    async def models():
        return {'object': 'list', 'data': [{
            'id': served_model, 'object': 'model', 'created': created,
            'owned_by': 'orin_llm_node', 'max_model_len': max_model_len}]}

    def parse(raw: bytes):  # on the parser's thread
        try:
            body = bounded_json.loads(raw.decode('utf-8'))
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(400, f'the request body is not valid JSON: {exc}') from None
        return parse_chat_request(body, served_model, default_max_tokens)

    @app.post('/v1/chat/completions')
    async def chat_completions(request: Request):
        loop = asyncio.get_running_loop()
        try:
            _check_json(request.headers.get('content-type'))
            raw = await _read_body(request, max_request_bytes)
            if raw is None:
                return Response(status_code=204)  # the client went away while sending: to nobody
            chat = await loop.run_in_executor(parser, parse, raw)
        except RequestError as exc:
            return refuse(exc)
        del raw
        events: asyncio.Queue = asyncio.Queue()

        def emit(event):  # on the engine's thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:
                pass  # the loop is gone (server stopping): nobody to tell

        job = Job(chat, emit)
        try:
            worker.submit(job)
        except QueueFull as exc:
            return refuse(RequestError(429, str(exc), kind='rate_limit_exceeded'),
                          headers={'Retry-After': '1'})
        answer = _Answer(chat, served_model)
        # Until a response starts, nothing else reads this request's messages: a client that
        # leaves is seen here (its job dropped or cancelled), streamed or not.
        watch = asyncio.ensure_future(_until_disconnect(request.receive))
        watch.add_done_callback(lambda t: t.cancelled() or events.put_nowait(_GONE))
        try:
            first = last = await events.get()
            while not chat.stream and last[0] == 'delta':
                answer.add(last[1])
                last = await events.get()
        except asyncio.CancelledError:  # the server stopping
            job.cancel()
            raise
        finally:
            watch.cancel()
        if last is _GONE:
            job.cancel()
            return Response(status_code=204)  # to nobody
        error = answer.refusal(first)
        if error is not None:
            return refuse(error)
        if not chat.stream:
            error = answer.refusal(last)
            if error is not None:
                return refuse(error)
            answer.add(last[1])
            return answer.completion()

        async def sse():
            # Every event already waiting goes out in one write: when the engine outpaces the
            # loop, a write per token would cost more than the token.
            event, out = first, [answer.sse(answer.head())]
            try:
                while True:
                    if event is _GONE:  # seen by the watch just before the stream began
                        return
                    if event[0] in ('invalid', 'failed'):
                        out.append(answer.sse({'error': {'message': event[1],
                                                         'type': 'server_error', 'code': 500}}))
                        break
                    out.append(answer.sse(answer.chunk(event[1])))
                    if event[0] == 'result':
                        if chat.include_usage:
                            out.append(answer.sse(answer.usage_chunk()))
                        break
                    if events.empty():
                        yield ''.join(out)
                        out = []
                        event = await events.get()
                    else:
                        event = events.get_nowait()
                out.append('data: [DONE]\n\n')
                yield ''.join(out)
            finally:
                job.cancel()  # a no-op once answered; the client went away otherwise

        return StreamingResponse(sse(), media_type='text/event-stream')

    return app


#: What the event queue of a request gets when its client goes away before the answer.
_GONE = ('gone', None)


async def _until_disconnect(receive) -> None:
    # Returns when the client has gone away (once the body is read, that is all that comes).
    while (await receive())['type'] != 'http.disconnect':
        pass


def _header(scope, name: bytes) -> str | None:
    # The first value of header ``name`` (lower case) of an ASGI request.
    for key, value in scope['headers']:
        if key == name:
            return value.decode('latin-1')
    return None


async def _read_body(request, limit: int) -> bytes | None:
    """The body, read chunk by chunk: 413 as soon as it passes ``limit`` (None: client gone)."""
    declared = request.headers.get('content-length', '')
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f'request body of {declared} bytes is larger than {limit}')
    chunks, size = [], 0
    while True:
        message = await request.receive()
        if message['type'] == 'http.disconnect':
            return None
        chunk = message.get('body', b'')
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f'request body is larger than {limit} bytes')
        chunks.append(chunk)
        if not message.get('more_body', False):
            return b''.join(chunks)


def _check_json(content_type: str | None) -> None:
    # A web page may send text/plain, form data or no type to any address without a CORS
    # preflight; application/json needs one, which this server never grants.
    kind = (content_type or '').split(';', 1)[0].strip().lower()
    if kind != 'application/json':
        raise RequestError(415, f'the request body must be application/json, not '
                                f'{content_type or "untyped"}')


def host_name(host: str | None) -> str | None:
    """The name in a ``Host`` header, lower case, without port or final dot (None: none)."""
    if not host:
        return None
    host = host.strip().lower()
    if host.startswith('['):            # [::1]:8000
        name = host[1:].split(']', 1)[0]
    else:
        name = host.rsplit(':', 1)[0] if host.count(':') == 1 else host
    return name.rstrip('.')


class _HostCheck:
    # The Host header a request must carry: one of the allowed names, or any IP address when
    # 'ip' is allowed ('*': anything).

    def __init__(self, allowed):
        self.any = '*' in allowed
        self.ip = 'ip' in allowed
        self.names = {host_name(h) for h in allowed} - {'*', 'ip'}

    def refusal(self, host: str | None) -> RequestError | None:
        if self.any:
            return None
        name = host_name(host)
        if name is None:
            return RequestError(400, 'the request has no Host header')
        if name in self.names or (self.ip and _is_ip(name)):
            return None
        return RequestError(400, f'Host {name!r} is not one this server answers for (it '
                                 f'answers for {", ".join(sorted(self.names))}; orin_llm_serve '
                                 '--allowed-hosts adds names)')


def _is_ip(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class _Answer:
    """One answer's response bodies: the completion, or the stream's chunks."""

    def __init__(self, chat, model: str):
        self.chat, self.model = chat, model
        self.id = f'chatcmpl-{uuid.uuid4().hex}'
        self.created = int(time.time())
        self.text: list[str] = []
        self.sent_ids = 0   # token ids already sent (streaming)
        self.result = None

    def refusal(self, event) -> RequestError | None:
        """The HTTP error of an event that ends the request before its answer, if it is one."""
        kind, value = event
        if kind == 'invalid':
            return RequestError(400, value)
        if kind == 'failed':
            return RequestError(500, value, kind='server_error')
        result = value.result
        if kind == 'result' and result.error and not result.token_ids:
            # Refused before it ran (the context or the KV pool), or failed at once.
            return RequestError(400, f'{result.finish_reason}: {result.error}')
        return None

    def add(self, event) -> None:
        """Take one step's text (and the result, on the last)."""
        self.text.append(event.delta)
        if event.result is not None:
            self.result = event.result

    def _choice_extras(self, result) -> dict:
        extras = {}
        if result is not None and result.error:
            extras['error'] = result.error
        return extras

    def _usage(self) -> dict:
        r = self.result
        return {'prompt_tokens': len(r.prompt_token_ids), 'completion_tokens': len(r.token_ids),
                'total_tokens': len(r.prompt_token_ids) + len(r.token_ids),
                'prompt_tokens_details': {'cached_tokens': r.cached_tokens}}

    def completion(self) -> dict:
        """The whole answer as one ``chat.completion``."""
        r = self.result
        choice = {'index': 0, 'message': {'role': 'assistant', 'content': ''.join(self.text)},
                  'finish_reason': r.finish_reason, 'logprobs': None, **self._choice_extras(r)}
        body = {'id': self.id, 'object': 'chat.completion', 'created': self.created,
                'model': self.model, 'choices': [choice], 'usage': self._usage()}
        if self.chat.return_token_ids:
            choice['token_ids'] = list(r.token_ids)
            body['prompt_token_ids'] = list(r.prompt_token_ids)
        return body

    def _chunk(self, choices, **extra) -> dict:
        return {'id': self.id, 'object': 'chat.completion.chunk', 'created': self.created,
                'model': self.model, 'choices': choices, **extra}

    def head(self) -> dict:
        """The first chunk: the assistant's role."""
        choice = {'index': 0, 'delta': {'role': 'assistant', 'content': ''},
                  'finish_reason': None}
        return self._chunk([choice])

    def chunk(self, event) -> dict:
        """The chunk of one engine step; the last carries the finish reason.

        With ``return_token_ids`` the last also carries the prompt's token ids (known once
        the engine has built the prompt).
        """
        result = event.result
        choice = {'index': 0, 'delta': {'content': event.delta},
                  'finish_reason': None if result is None else result.finish_reason,
                  **self._choice_extras(result)}
        extra = {}
        if self.chat.return_token_ids:
            if result is None:
                ids = [] if event.token_id is None else [event.token_id]
            else:
                ids = list(result.token_ids[self.sent_ids:])
                extra['prompt_token_ids'] = list(result.prompt_token_ids)
            self.sent_ids += len(ids)
            choice['token_ids'] = ids
        if result is not None:
            self.result = result
        return self._chunk([choice], **extra)

    def usage_chunk(self) -> dict:
        """The chunk after the last one when ``stream_options.include_usage`` is set."""
        return self._chunk([], usage=self._usage())

    @staticmethod
    def sse(payload: dict) -> str:
        """One server-sent event."""
        return f'data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n'
