# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A chat-completions server that says exactly what a test scripts, on 127.0.0.1 (stdlib only).

orin_llm_serve only sends what a well-behaved server sends; the backend must also survive
servers that do not: lone surrogates in any string, a line that never ends, megabytes in one
chunk, more tokens than asked for, NaN in ``usage``, two choices, text after the finish, a
``GET /models`` that drips or never ends.  :class:`FakeServer` speaks just enough HTTP/1.1 and
server-sent events for the backend's client (httpx): every answer ends by closing the
connection.  ``models`` and ``reply`` are what the next request gets; ``requests`` records the
chat request bodies received (parsed JSON).
"""

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import threading
import time

MODEL = 'fake-model'


def chunk(content=None, finish=None, index=0, token_ids=None):
    """One chat.completion.chunk as a dict (``content`` None: a delta without text)."""
    delta = {} if content is None else {'content': content}
    choice = {'index': index, 'delta': delta, 'finish_reason': finish}
    if token_ids is not None:
        choice['token_ids'] = token_ids
    return {'object': 'chat.completion.chunk', 'model': MODEL, 'choices': [choice]}


def sse(*chunks, done=True):
    """The bytes of a stream of ``chunks`` (dicts, or raw JSON text), then ``[DONE]``.

    ``json.dumps`` writes a lone surrogate as its JSON escape, as a server would.
    """
    lines = [f'data: {c if isinstance(c, str) else json.dumps(c)}\n\n' for c in chunks]
    if done:
        lines.append('data: [DONE]\n\n')
    return ''.join(lines).encode('ascii')


def answer(*texts, usage=None, finish='stop'):
    """A whole streamed answer: one chunk per text, the finish, the usage, ``[DONE]``."""
    chunks = [chunk(t) for t in texts] + [chunk(finish=finish)]
    usage = usage or {'prompt_tokens': 10, 'completion_tokens': len(texts),
                      'total_tokens': 10 + len(texts)}
    chunks.append(usage if isinstance(usage, str) else
                  {'object': 'chat.completion.chunk', 'model': MODEL, 'choices': [],
                   'usage': usage})
    return 200, [sse(*chunks)]


class FakeServer:
    """The scripted server; ``with FakeServer() as srv:`` starts and stops it.

    ``reply``: ``(status, pieces)`` for the next chat request, or a callable of the request
    body returning it; ``pieces`` is an iterable of bytes written (and flushed) in turn.
    ``models``: the same for ``GET /models``.  ``written``: pieces written of the last reply
    before the client went away or the reply ended.
    """

    def __init__(self):
        self.reply = answer('Hello.')
        self.models = (200, [json.dumps({'object': 'list', 'data': [
            {'id': MODEL, 'object': 'model'}]}).encode()])
        self.requests = []
        self.written = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args):
                pass

            def do_GET(self):       # noqa: N802 - http.server's name
                if self.path.rstrip('/').endswith('/models'):
                    self._send(server.models, 'application/json')
                else:
                    self._send((404, [b'{"error": {"message": "not found"}}']),
                               'application/json')

            def do_POST(self):      # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
                server.requests.append(body)
                reply = server.reply(body) if callable(server.reply) else server.reply
                self._send(reply, 'text/event-stream')

            def _send(self, reply, kind):
                status, pieces = reply
                self.send_response(status)
                self.send_header('Content-Type', kind if status == 200 else 'application/json')
                self.send_header('Connection', 'close')
                self.end_headers()
                server.written = 0
                try:
                    for piece in pieces:
                        self.wfile.write(piece)
                        self.wfile.flush()
                        server.written += 1
                except (BrokenPipeError, ConnectionResetError):
                    pass                # the client went away: what a test may check
                self.close_connection = True

        self._httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self):
        """The API root (``base_url``)."""
        return f'http://127.0.0.1:{self._httpd.server_address[1]}/v1'

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()


def drip(piece=b' ', every_s=0.5):
    """Pieces of an answer that never ends: ``piece`` every ``every_s`` seconds."""
    while True:
        time.sleep(every_s)
        yield piece


def flood(piece=b'x' * 65536):
    """Pieces of an answer that never ends, as fast as the client reads."""
    while True:
        yield piece


def paced(pieces, every_s=0.001):
    """``pieces`` one every ``every_s`` seconds (a server generating as it writes)."""
    for piece in pieces:
        time.sleep(every_s)
        yield piece
