# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The HTTP side of orin_llm_serve: ``/v1/models``, ``/v1/chat/completions``, ``/health``.

A request is read (``chat_request``), queued on the engine's thread (``engine_worker``) and
answered as a JSON completion or as server-sent events. Errors have the OpenAI shape. A
streamed answer starts only once the engine has taken the request: a request the engine
refuses (bad input, a prompt longer than the context) is an HTTP error, not a stream. When a
client goes away, its queued request is dropped and its running answer cancelled.

Extensions a client may use: ``return_token_ids`` (vLLM's: ``prompt_token_ids`` and per
choice ``token_ids``), ``usage.prompt_tokens_details.cached_tokens`` (prefix-cache hits),
and the engine's own finish reasons beside ``stop`` and ``length`` (``kv_exhausted``,
``context_full``, ``timeout``, ``cancelled``, ``error`` with the choice's ``error``).
"""

import asyncio
import hmac
import json
import time
import uuid

from orin_llm_node import bounded_json
from orin_llm_node.serve.chat_request import RequestError, parse_chat_request
from orin_llm_node.serve.engine_worker import Job, QueueFull

__all__ = ['create_app']


def create_app(worker, served_model: str, *, api_key: str | None = None,
               default_max_tokens: int = 512, max_request_bytes: int = 32 * 2**20,
               max_model_len: int | None = None):
    """The ASGI app serving ``worker``'s engine as ``served_model``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title='orin_llm_serve', docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    def refuse(error: RequestError, headers=None):
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.middleware('http')
    async def authorise(request: Request, call_next):
        if api_key is not None:
            given = request.headers.get('authorization', '')
            if not hmac.compare_digest(given.encode(), f'Bearer {api_key}'.encode()):
                return refuse(RequestError(401, 'missing or wrong API key (Authorization: '
                                                'Bearer ...)', kind='authentication_error'))
        return await call_next(request)

    @app.get('/health')
    async def health():
        return {'status': 'ok', 'model': served_model, 'busy': worker.running is not None,
                'queue_depth': worker.queue_depth()}

    @app.get('/v1/models')
    async def models():
        return {'object': 'list', 'data': [{
            'id': served_model, 'object': 'model', 'created': created,
            'owned_by': 'orin_llm_node', 'max_model_len': max_model_len}]}

    @app.post('/v1/chat/completions')
    async def chat_completions(request: Request):
        raw = await request.body()
        try:
            if len(raw) > max_request_bytes:
                raise RequestError(413, f'request body of {len(raw)} bytes is larger than '
                                        f'{max_request_bytes}')
            try:
                body = bounded_json.loads(raw.decode('utf-8'))
            except (ValueError, UnicodeDecodeError) as exc:
                raise RequestError(400, f'the request body is not valid JSON: {exc}') from None
            chat = parse_chat_request(body, served_model, default_max_tokens)
        except RequestError as exc:
            return refuse(exc)
        loop = asyncio.get_running_loop()
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
        try:
            first = await events.get()
        except asyncio.CancelledError:
            job.cancel()
            raise
        error = answer.refusal(first)
        if error is not None:
            return refuse(error)
        if not chat.stream:
            event = first
            while event[0] == 'delta':
                answer.add(event[1])
                event = await events.get()
            error = answer.refusal(event)
            if error is not None:
                return refuse(error)
            answer.add(event[1])
            return answer.completion()

        async def sse():
            # Every event already waiting goes out in one write: when the engine outpaces the
            # loop, a write per token would cost more than the token.
            event, out = first, [answer.sse(answer.head())]
            try:
                while True:
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
