# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The engine's single-thread guard: a second caller gets a clear error, never a wrong answer.

The engine keeps per-turn state (the open turn, the runner's static buffers, the KV books) that
two interleaved calls would corrupt silently. Every call but ``cancel()`` holds the guard for
its whole run; a ``chat_stream`` generator holds it from its first step until it ends, is
closed or is garbage-collected, so a stream abandoned mid-way keeps the engine taken.
"""

from contextlib import contextmanager
import threading

__all__ = ['SingleThreadGuard']


class SingleThreadGuard:
    """Lets one engine call run at a time; another entry raises ``RuntimeError``.

    ``hold(what)`` takes the guard for a mutating call (``chat_stream``, ``reset``, ...): it
    raises if any call holds it, on another thread or on this one (a stream left open).
    ``peek(what)`` is for read-only calls (``stats``): allowed on the thread that holds the
    guard (the node reads stats between the steps of its own stream), refused on any other.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._holder: tuple[int, str, str] | None = None  # (thread id, thread name, call)
        self.closed = False  # set by close(): the engine gave back what it held

    def close(self) -> None:
        """Refuse every later call (the engine was closed)."""
        self.closed = True

    def peek_closed(self, what: str) -> None:
        """``RuntimeError`` if the engine was closed (for calls any thread may make)."""
        if self.closed:
            raise RuntimeError(f'LLMEngine.{what}() called after close()')

    def _refuse(self, what: str) -> None:
        self.peek_closed(what)
        ident, name, doing = self._holder
        me = threading.current_thread()
        if ident == me.ident:
            raise RuntimeError(
                f'LLMEngine.{what}() called while {doing}() is still running on this thread '
                '(a chat_stream generator not run to its end: finish it or close() it first)')
        raise RuntimeError(
            f'LLMEngine is single-threaded: {what}() called on thread {me.name!r} while '
            f'{doing}() is running on thread {name!r}; call the engine from one thread '
            '(cancel() is the one call other threads may make)')

    @contextmanager
    def hold(self, what: str):
        """Hold the guard for the ``with`` body; ``RuntimeError`` if anything holds it."""
        me = threading.current_thread()
        with self._lock:
            if self._holder is not None or self.closed:
                self._refuse(what)
            self._holder = (me.ident, me.name, what)
        try:
            yield
        finally:
            with self._lock:
                self._holder = None

    def peek(self, what: str) -> None:
        """``RuntimeError`` if a call holds the guard on another thread."""
        with self._lock:
            if self.closed or (self._holder is not None
                               and self._holder[0] != threading.get_ident()):
                self._refuse(what)
