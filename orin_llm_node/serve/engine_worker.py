# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one thread that owns the engine behind orin_llm_serve: a bounded queue, served in order.

The engine is single-threaded, so requests wait in a FIFO of ``max_queue`` and run one at a
time; a request beyond that is refused at once (HTTP 429). Each job reports through a
callback called on this thread: ``('delta', StreamEvent)`` for each step, then one of
``('result', StreamEvent)`` (the last, with the ``ChatResult``), ``('invalid', reason)``
(the engine refused the input: 400) or ``('failed', reason)`` (500). ``Job.cancel()`` (a
client that went away) skips a queued job or cancels the running one.

Conversations map onto the prefix cache: the last ``max_conversations`` conversations are
kept by the messages they hold (their answers included). A request whose earlier messages
are one of them continues it (its KV, the exact tokens of its answers); any other starts a
conversation with its history written in as the template renders it (``history.replay``),
whose blocks still hit the prefix cache wherever the tokens are the same as before.
"""

from collections import OrderedDict
import queue
import threading

from orin_llm_node.serve.chat_request import decoded
from orin_llm_node.serve.history import TokenFloor, check_fits, replay

__all__ = ['EngineWorker', 'Job', 'QueueFull']


class QueueFull(Exception):
    """Every place in the queue is taken."""


class Job:
    """One request on its way through the queue; ``emit`` is called on the worker thread."""

    def __init__(self, request, emit):
        self.request, self.emit = request, emit
        self._cancelled = threading.Event()
        self._worker = None

    def cancel(self) -> None:
        """Skip the job if it waits; end its answer if it runs (any thread)."""
        self._cancelled.set()
        worker = self._worker
        if worker is not None and worker.running is self:
            worker.engine.cancel()

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` was called."""
        return self._cancelled.is_set()


class EngineWorker:
    """Owns ``engine`` on one thread; see the module docstring."""

    def __init__(self, engine, max_queue: int = 8, max_conversations: int = 16):
        self.engine = engine
        self._floor = TokenFloor(engine.tokenizer)
        self.running: Job | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._kept: OrderedDict[tuple, object] = OrderedDict()
        self._max_conversations = max_conversations
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='orin_llm_serve_engine',
                                        daemon=True)

    def start(self) -> 'EngineWorker':
        """Start the thread."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the answer in progress and the thread."""
        self._stop.set()
        running = self.running
        if running is not None:
            running.cancel()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def submit(self, job: Job) -> None:
        """Queue ``job`` (``QueueFull`` when every place is taken)."""
        job._worker = self
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f'server busy: {self._queue.maxsize} requests are waiting') from None

    def queue_depth(self) -> int:
        """Requests waiting (the running one not included)."""
        return self._queue.qsize()

    def _run(self):
        while not self._stop.is_set():
            job = self._queue.get()
            if job is None or self._stop.is_set():
                return
            if job.cancelled:
                continue
            self.running = job
            try:
                self._answer(job)
            except ValueError as exc:       # the engine's verdict on the input: nothing ran
                job.emit(('invalid', str(exc)))
            except Exception as exc:  # noqa: BLE001 - one request's failure ends only it
                job.emit(('failed', f'{type(exc).__name__}: {exc}'))
            finally:
                self.running = None

    def _conversation(self, request):
        conv = self._kept.pop(request.history_key, None)
        if conv is not None:
            return conv
        conv = self.engine.new_conversation(system_prompt=request.system)
        room = (self.engine.config.max_model_len - len(conv.token_ids)
                - self._floor.of(request.parts))
        replay(self.engine, conv, request.exchanges, self._floor, room)
        return conv

    def _answer(self, job):
        request = job.request
        # Before a text of 30 MB is rendered and tokenized, to be refused then.
        check_fits(self._floor, request.parts, self.engine.config.max_model_len)
        parts = decoded(request.parts)
        conv = self._conversation(request)
        final = None
        try:
            for event in self.engine.chat_stream(conv, parts, [], request.sampling):
                if job.cancelled:
                    self.engine.cancel()
                if event.result is None:
                    job.emit(('delta', event))
                final = event
        except BaseException:
            self._keep(request.history_key, conv)    # the engine changed nothing
            raise
        result = final.result
        # Kept under the messages it now holds, so that the client's next turn continues it;
        # a failed or refused turn left no trace: it holds what it held before.
        self._keep((*request.key, ('assistant', result.text)) if result.error is None
                   else request.history_key, conv)
        job.emit(('result', final))

    def _keep(self, key, conv):
        self._kept[key] = conv
        while len(self._kept) > self._max_conversations:
            self.engine.reset(self._kept.popitem(last=False)[1])
