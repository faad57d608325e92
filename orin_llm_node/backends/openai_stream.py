# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""One streamed chat-completions request, run on a thread of its own.

Why a thread: a blocking read on a socket cannot be given a deadline from outside, and
``cancel()`` and ``timeout_s`` must end an answer on time whatever the server does. The
caller waits on a queue with its own deadline and polls its cancel flag; ``close()`` shuts
the response, which also tells the server the answer is no longer wanted (it stops
generating). The thread retries what can be retried (no connection, 429, 5xx, all before any
answer arrived) within the caller's deadline, and ends with exactly one final event. Each
stream line is read within ``openai_wire.MAX_LINE_BYTES``.
"""

import queue
import threading
import time

from orin_llm_node.backends.openai_wire import (
    LineTooLong,
    bounded_lines,
    error_text,
    one_line,
    sse_payload,
)

__all__ = ['RETRY_STATUSES', 'StreamExchange']

#: Statuses that say "not now" rather than "never": the request may be sent again.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

#: How much of an error answer's body is read for its message.
_ERROR_BODY_BYTES = 4096


class StreamExchange:
    """Send ``body`` to ``url`` (``stream: true``) and deliver what comes back as events.

    Events (``next_event``): ``('chunk', dict)`` for every JSON chunk, then one final
    ``('done', None)`` or ``('error', reason)``; ``reason`` is one line. ``retries`` counts
    the requests sent again; ``answered``: whether the server answered at all.
    """

    def __init__(self, client, url: str, headers: dict, body: dict, retries: int,
                 backoff_s: float, deadline: float):
        self._client, self._url, self._headers, self._body = client, url, headers, body
        self._retries, self._backoff_s, self._deadline = retries, backoff_s, deadline
        self._events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response = None
        self.retries = 0
        self.answered = False  # the server answered (any HTTP status) at least once
        self._thread = threading.Thread(target=self._run, name='openai_stream', daemon=True)

    def start(self) -> 'StreamExchange':
        """Send the request (on the exchange's thread)."""
        self._thread.start()
        return self

    def next_event(self, timeout: float):
        """The next event, or None when none came within ``timeout`` seconds."""
        try:
            return self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop: shut the response (the server sees the client go); no event follows."""
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing a broken stream may fail; it is closed
                pass

    # ---- the exchange's thread -------------------------------------------------------------

    def _run(self):
        import httpx
        attempt = 0
        while True:
            try:
                reason, again = self._attempt(httpx)
            except Exception as exc:  # noqa: BLE001 - every failure is one final event
                reason, again = f'request failed: {one_line(exc) or type(exc).__name__}', False
            if reason is None or self._stop.is_set():
                return
            wait = self._backoff_s * 2 ** attempt
            if not again or attempt >= self._retries or time.monotonic() + wait >= self._deadline:
                self._events.put(('error', reason))
                return
            attempt += 1
            self.retries += 1
            if self._stop.wait(wait):
                return

    def _attempt(self, httpx):
        """Run one request: (None, _) when it ended with an event, else (reason, retryable)."""
        started = False  # whether any answer chunk has been delivered
        try:
            with self._client.stream('POST', self._url, json=self._body,
                                     headers=self._headers) as response:
                with self._lock:
                    self._response = response
                self.answered = True
                if self._stop.is_set():
                    return None, False
                if response.status_code != 200:
                    body = b''
                    for piece in response.iter_bytes():
                        body += piece
                        if len(body) >= _ERROR_BODY_BYTES:
                            break
                    text = body[:_ERROR_BODY_BYTES].decode('utf-8', 'replace')
                    return (error_text(response.status_code, text),
                            response.status_code in RETRY_STATUSES)
                # Lines bounded in size: a line that never ends is an error, not all memory.
                for line in bounded_lines(response.iter_bytes()):
                    if self._stop.is_set():
                        return None, False
                    payload = sse_payload(line)
                    if payload is None:
                        continue
                    if payload == '[DONE]':
                        self._events.put(('done', None))
                        return None, False
                    if 'error' in payload:
                        err = payload['error']
                        message = err.get('message', err) if isinstance(err, dict) else err
                        self._events.put(('error', f'server failed mid-answer: '
                                                   f'{one_line(message, 160)}'))
                        return None, False
                    started = True
                    self._events.put(('chunk', payload))
        except LineTooLong as exc:
            return str(exc), False
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return f'server unreachable: {one_line(exc) or type(exc).__name__}', True
        except httpx.TimeoutException:
            return ('server silent for longer than read_timeout_s '
                    + ('mid-answer' if started else 'before the first answer chunk')), False
        except httpx.HTTPError as exc:
            if self._stop.is_set():
                return None, False
            what = one_line(exc) or type(exc).__name__
            if started:
                return f'the answer stream broke mid-answer: {what}', False
            # Connected, but the connection went before an answer: a server going down.
            return f'server closed the connection before answering: {what}', True
        if self._stop.is_set():
            return None, False
        return ('the answer stream ended before it was complete (no [DONE]: the server '
                'went away mid-answer)'), False
