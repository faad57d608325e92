# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The session: one thread that owns the engine; it loads, answers and frees, nothing else does.

It knows the node only through the :class:`~orin_llm_node.ros.replies.Replies` port and its
settings (a callable giving the parameter values as they are now), so it runs in-process with
a recorder in place of the node (test/test_session.py).  Hand-off with the executor, one owner
per piece of state: the queue, the reset flag, the ``busy``/``cancel`` flags and the pending
load/unload command live here under one condition variable; the engine and the conversation are
touched by the session's thread only (the engine's thread-safe calls -- ``cancel()`` and the
checks of :meth:`Session.check_loaded` -- excepted).  Loading returns an :class:`EngineFacts`
record: what the node reports about the engine; nothing outside reads the engine itself.
"""

from collections import deque
from dataclasses import dataclass
import threading
import time
import traceback

from orin_llm_node import parameters
from orin_llm_node.refusals import REASON_CHARS, preview
from orin_llm_node.ros import (
    backend_loading,
    detections,
    model_loading,
    native_heap,
    tool_requests,
)
from orin_llm_node.ros.cameras import camera_prompt
from orin_llm_node.ros.cameras.camera_report import camera_report
from orin_llm_node.ros.cameras.frame_ring import FrameSizer
from orin_llm_node.ros.contract import AnswerInfo
from orin_llm_node.ros.request_envelope import sampling_overrides
from orin_llm_node.valid_text import valid_text


class LoadFailed(Exception):
    """The engine could not be loaded; ``str(err)`` is the reason on one line."""


@dataclass(frozen=True)
class EngineFacts:
    """What a loaded engine is, as the node reports it (diagnostics, video frame sizes)."""

    device: str
    dtype: str
    weight_format: str
    weight_bytes: int
    cuda_graph: bool                # graphs really in use (not only asked for)
    attention_backend: str
    backend_fallback_reason: str
    frame_sizer: FrameSizer         # sizes the frames kept for video as the model sees them

    @classmethod
    def of(cls, engine):
        """The facts of a loaded ``engine``."""
        return cls(device=str(engine.device), dtype=str(engine.dtype).replace('torch.', ''),
                   weight_format=engine.weight_format, weight_bytes=engine.weight_bytes,
                   cuda_graph=bool(engine.uses_cuda_graph),
                   attention_backend=engine.attention_backend,
                   backend_fallback_reason=engine.backend_fallback_reason or '',
                   frame_sizer=FrameSizer.of(engine.prompts))

    @classmethod
    def remote(cls, backend):
        """The facts of a server's backend: none of the engine's, its image sizing."""
        return cls(device='', dtype='', weight_format='', weight_bytes=0, cuda_graph=False,
                   attention_backend='', backend_fallback_reason='',
                   frame_sizer=FrameSizer(backend.image_processor))

    def diagnostics(self):
        """The facts the ``generation`` status reports (NodeFacts field names)."""
        return {name: getattr(self, name) for name in (
            'device', 'dtype', 'weight_format', 'weight_bytes', 'cuda_graph',
            'attention_backend', 'backend_fallback_reason')}


class Session:
    """Prompts in, answers out through ``replies``; see the module docstring for who owns what.

    ``settings()``: the parameter values now (start-up values and run-time ones as last set);
    ``should_stop()``: true once the process is stopping (a signal): loading and warm-up stop
    at their next step, and nobody waits for them.
    """

    def __init__(self, replies, settings, should_stop=lambda: False):
        self.replies = replies
        self.settings = settings
        self.should_stop = should_stop
        self._engine = None
        self._local = True              # the engine is the local one (not a server's backend)
        self._conv = None
        self._conv_system_prompt = None
        self._cond = threading.Condition()
        self._queue = deque()
        self._reset = False
        self._busy = False
        self._current = None            # the request being answered (its id: cancel one)
        self._cancel_pending = False
        self._command = None
        self._command_done = threading.Event()
        self._command_result = None
        self._diagnostics_due_in = 0.5
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name='orin_llm_session', daemon=True)

    # ---- called from other threads ---------------------------------------------------------

    def start(self):
        """Start the session's thread."""
        self.thread.start()

    def submit(self, request, capacity):
        """Queue ``request``; returns the oldest request dropped to make room, or None."""
        with self._cond:
            dropped = self._queue.popleft() if len(self._queue) >= capacity else None
            self._queue.append(request)
            self._cond.notify_all()
            return dropped

    def offer(self, request, capacity):
        """Queue ``request`` if fewer than ``capacity`` wait (nothing dropped); True if queued.

        Its listener hears its place first, before this thread can take it and say more.
        """
        with self._cond:
            if len(self._queue) >= capacity:
                return False
            if request.listener is not None:
                request.listener.queued(len(self._queue))
            self._queue.append(request)
            self._cond.notify_all()
            return True

    def queue_depth(self):
        """Prompts waiting."""
        with self._cond:
            return len(self._queue)

    def drain(self):
        """Take every queued request out (deactivate) and cancel the one in progress."""
        with self._cond:
            queued, self._queue = list(self._queue), deque()
        self.cancel()
        return queued

    def request_reset(self):
        """Forget the conversation before the next prompt."""
        with self._cond:
            self._reset = True
            self._cond.notify_all()

    def withdraw(self, request_id):
        """Take the queued request ``request_id`` out of the queue; it, or None if not queued."""
        with self._cond:
            found = [r for r in self._queue if r.request_id == request_id]
            if not found:
                return None
            self._queue.remove(found[0])
            waiting = list(self._queue)
        _tell_positions(waiting)
        return found[0]

    def cancel(self, request_id=None):
        """Stop the generation in progress (only if it answers ``request_id``, when given).

        True if there was one to stop.
        """
        with self._cond:
            if request_id is not None and (self._current is None
                                           or self._current.request_id != request_id):
                return False
            if self._busy and self._engine is not None:
                # The engine clears its flag when a turn starts, so the session repeats the
                # cancel after it has begun (_cancel_pending) in case we came too early.
                self._cancel_pending = True
                self._engine.cancel()       # the one thread-safe engine call
                return True
        return False

    def load(self):
        """Load and warm up the engine on the session's thread and wait for it.

        Returns its :class:`EngineFacts`, or None when the process is stopping (nobody waits
        for a load then); raises :class:`LoadFailed` with the reason.
        """
        ok, result = self._call('load')
        if ok:
            return result
        if result is None:
            return None
        raise LoadFailed(result)

    def unload(self):
        """Free the engine (weights, KV pool, graphs) and wait; False if stopping first."""
        return self._call('unload')[0]

    def check_loaded(self, values, names):
        """``ParameterError`` naming the first of ``names`` the loaded engine cannot run with.

        Safe from any thread (the engine's checks read only its template, tokenizer and
        vocabulary); nothing is checked before a load.
        """
        engine = self._engine
        if engine is not None and self._local:    # a server judges them as it answers
            parameters.check_loaded(engine, values, names)

    def stop(self, timeout_s):
        """Stop the thread (cancelling a generation); True if it has stopped."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self.cancel()
        if self.thread.is_alive():
            self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def _call(self, command):
        # (ok, result): ``result`` is the command's (facts, or a failure's reason), None when
        # stopping.
        self._command_done.clear()
        with self._cond:
            self._command = command
            self._cond.notify_all()
        while not self._command_done.wait(0.1):
            if self._stopping():
                return False, None
        if self._stopping():
            return False, None
        return self._command_result

    def _stopping(self):
        # should_stop is main's signal flag, set before teardown reaches stop().
        return self._stop.is_set() or self.should_stop()

    # ---- the session's thread --------------------------------------------------------------

    def _run(self):
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # noqa: BLE001 - nothing may end the thread that answers
                # A failure while reporting a failure (a reply that cannot be sent): said in
                # the log, and the thread takes the next request.
                self.replies.count(errors=1)
                self._log_fault('the session thread caught an exception and carries on')

    def _step(self):
        # One pass of the session's loop: a command, a reset, or one request answered.
        request = None
        with self._cond:
            if not (self._queue or self._reset or self._command or self._stop.is_set()):
                wait = self._diagnostics_due_in if self._engine is not None else 0.5
                self._cond.wait(timeout=max(wait, 0.01))
            command, self._command = self._command, None
            reset, self._reset = self._reset, False
            if (self._queue and self._engine is not None and not reset and not command
                    and not self._stop.is_set()):
                request = self._current = self._queue.popleft()
                self._busy = True
                self._cancel_pending = False
            waiting = list(self._queue) if request is not None else []
        if self._stop.is_set():
            return
        _tell_positions(waiting)
        if command is not None:
            self._command_result = self._run_command(command)
            self._command_done.set()
            return
        try:
            if reset:
                self._drop_conversation('reset service')
            if request is not None:
                self._answer(request)
        except ValueError as exc:   # the engine's verdict on the input (nothing changed)
            self.replies.count(errors=1)
            self._report_failure(request, f'prompt rejected: {preview(exc, REASON_CHARS)}')
        except Exception as exc:  # noqa: BLE001 - bad input must never kill the node
            self.replies.count(errors=1)
            reason = preview(exc, REASON_CHARS) or type(exc).__name__
            self._report_failure(request, f'request failed: {reason}')
            self.replies.logger.debug(valid_text(traceback.format_exc()))
        finally:
            with self._cond:
                self._busy = False
                self._current = None
        if request is not None and any(v.image is not None for v in request.views):
            native_heap.trim()      # the frame decoded at full size for this prompt
        self._diagnostics()

    def _log_fault(self, what):
        try:
            self.replies.logger.error(f'{what}:\n{valid_text(traceback.format_exc())}')
        except Exception:  # noqa: BLE001, S110 - a logger that fails too: nothing left to tell
            pass

    def _diagnostics(self, force=False, only_if_due=False):
        if self._engine is not None:
            stats = self._engine.stats()     # a local engine's pool, or a server's stats
            self._diagnostics_due_in = self.replies.diagnostics(
                stats if self._local else None, self.queue_depth(), force, only_if_due,
                backend_stats=None if self._local else stats)

    def _run_command(self, command):
        if command == 'unload':
            self._drop_conversation()
            self._engine.close()        # weights, KV pool, graphs and fused ops given back now
            self._engine = None
            model_loading.release_memory()
            return True, None
        from orin_llm_node.models import LoadInterrupted
        values = self.settings()
        try:
            engine = backend_loading.load(values, self.replies.logger,
                                          should_stop=self._stopping)
        except LoadInterrupted as exc:
            return False, str(exc)
        except Exception as exc:  # noqa: BLE001 - any load failure is one fatal line
            return False, ' '.join(str(exc).split()) or type(exc).__name__
        self._engine, self._local = engine, backend_loading.is_local(values)
        return True, EngineFacts.of(engine) if self._local else EngineFacts.remote(engine)

    def _report_failure(self, request, text):
        # Every part on its own: one that fails (a listener whose goal is gone) must not keep
        # the others from their reply.
        text = valid_text(text)
        if request is None:
            self.replies.error(text)
            return
        info = AnswerInfo.failed(request, text, camera_report(request))
        tells = [lambda: self.replies.error(f'{text} (request {request.request_id})'),
                 lambda: self.replies.info(info)]
        if request.listener is not None:
            tells.append(lambda: request.listener.finished(info, None))
        for tell in tells:
            try:
                tell()
            except Exception:  # noqa: BLE001 - said in the log, the others still go out
                self._log_fault(f'a reply to request {request.request_id} failed')

    def _drop_conversation(self, why=None):
        if self._conv is not None and self._engine is not None:
            self._engine.reset(self._conv)
            if why:
                self.replies.logger.info(f'conversation reset ({why})')
        self._conv = None

    def _conversation(self, system_prompt):
        # A new one when the system prompt changed since it began.
        if self._conv is not None and system_prompt != self._conv_system_prompt:
            self._drop_conversation('system_prompt changed')
        if self._conv is None:
            self._conv = self._engine.new_conversation(system_prompt=system_prompt)
            self._conv_system_prompt = system_prompt
        return self._conv

    def _turn(self, conv, text, images, sampling, listener=None, **extra):
        # One streamed turn: deltas out (to the topics, and to the request's listener: an ask
        # goal), its stages to the listener, a cancel that came early repeated, diagnostics due.
        result = None

        def on_stage(name):
            if listener is not None:
                listener.stage(name)
            if self._cancel_pending:
                self._engine.cancel()   # came before the turn began (its start cleared it)

        for event in self._engine.chat_stream(conv, text, images=images, sampling=sampling,
                                              on_stage=on_stage, **extra):
            if event.delta:
                self.replies.stream(event.delta)
            if listener is not None:
                listener.delta(event.delta, event.token_id is not None)
            if event.result is not None:
                result = event.result
            if self._cancel_pending:
                self._engine.cancel()
            self._diagnostics(only_if_due=True)
        return result

    def _answer(self, request):
        from orin_llm_node.engine import FinishReason
        replies = self.replies
        replies.count(requests=1)
        used = camera_prompt.decode(request, replies.frame_rejected)
        stamps = [v.image.stamp_ns for v, _ in used if v.image is not None]
        if stamps:
            replies.facts(last_image_stamp=max(stamps) / 1e9)
        text, images, videos = camera_prompt.content(request, used)
        if not request.text:            # tool results alone: no message (and no frames)
            text = None
        # Run-time parameters may have changed since the last prompt; an envelope's keys
        # override them for its own answer.
        values = self.settings()
        envelope = request.envelope or {}
        sampling = tool_requests.request_sampling(parameters.sampling_params(values), envelope,
                                                  sampling_overrides(envelope))
        if envelope.get('conversation') == 'new':
            self._drop_conversation('prompt/json asked for a new conversation')
        t0 = time.monotonic()
        listener = request.listener
        per_camera = found = None
        if sampling.detect is not None:     # one turn per camera, outside the conversation
            result, found, per_camera = detections.detect_turns(
                self._engine, values['system_prompt'] or None, request, used, sampling,
                lambda *args: self._turn(*args, listener=listener))
        else:
            conv = self._conversation(values['system_prompt'] or None)
            # videos only when there is one: the keyword is the video-capable engine's.
            extra = {'videos': videos} if videos else {}
            if 'tool_results' in envelope:
                extra['tool_results'] = tool_requests.engine_results(
                    envelope['tool_results'], conv.pending_tool_calls())
            try:
                result = self._turn(conv, text, images, sampling, listener, **extra)
            finally:
                if values['conversation_mode'] == 'single':
                    self._drop_conversation()   # every prompt alone; its blocks stay as cache
        elapsed = time.monotonic() - t0
        if self._stopping():
            return                      # shutting down (Ctrl-C): nobody to tell
        finish = result.finish_reason
        # A server's result leaves unknown what it does not report (None): said as n/a.
        replies.facts(last_finish_reason=finish, last_ttft_ms=_ms(result.ttft_s),
                      last_vision_ms=_ms(result.vision_s),
                      last_decode_tok_s=result.decode_tok_s)
        info = AnswerInfo.answered(request, result, camera_report(request),
                                   self._engine.weight_format, found,
                                   backend=values['backend'],
                                   model=getattr(result, 'model', None))
        replies.info(info)
        if per_camera:
            replies.detections(per_camera)
        if listener is not None:
            listener.finished(info, result)
        what = camera_prompt.summary(request, used)
        if result.error:
            # Refused before it ran (the context or the pool), or failed while it ran ('error':
            # the turn left no trace in the conversation).
            replies.count(errors=1)
            verdict = 'failed' if finish == FinishReason.ERROR else 'rejected'
            replies.error(f'prompt {what} {verdict} ({finish}, request '
                          f'{request.request_id}): {result.error}')
            return
        replies.answer(result.text)
        count = '?' if result.token_ids is None else len(result.token_ids)
        cached = '?' if result.cached_tokens is None else result.cached_tokens
        summary = (
            f'{what} -> {count} tokens in {elapsed:.2f} s (finish={finish}, '
            f'ttft {1000 * result.ttft_s:.0f} ms, {cached} cached prompt tokens'
            + (f', {result.dropped_turns} old turn(s) dropped' if result.dropped_turns else '')
            + ')')
        # rclpy loggers insist on one severity per call site: two calls, not one variable.
        if finish in FinishReason.LIMITS:
            replies.logger.warning(summary)
        else:
            replies.logger.info(summary)


def _tell_positions(waiting):
    # Each queued request with a listener hears how many are ahead of it (outside the lock:
    # a listener publishes).
    for ahead, request in enumerate(waiting):
        if request.listener is not None:
            request.listener.queued(ahead)


def _ms(seconds):
    return None if seconds is None else 1000.0 * seconds
