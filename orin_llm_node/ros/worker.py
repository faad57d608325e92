# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one thread that owns the engine: it loads, answers and frees; nothing else touches it.

Hand-off with the executor, one owner per piece of state: the queue, the reset flag, the
``busy``/``cancel`` flags and the pending load/unload command live here under one condition
variable; the engine and the conversation are touched by this thread only (``cancel()``, the
engine's one thread-safe call, excepted); the generation facts go through the thread-safe
:class:`~orin_llm_node.ros.diagnostics.GenerationInfo`.  Results go out through the node's
publishing methods.
"""

from collections import deque
import dataclasses
from fractions import Fraction
import threading
import time
import traceback

import numpy as np

from orin_llm_node.ros import model_loading, parameters, ros_image
from orin_llm_node.ros.camera_report import camera_report
from orin_llm_node.ros.contract import AnswerInfo
from orin_llm_node.ros.frame_ring import FrameSizer
from orin_llm_node.ros.refusals import REASON_CHARS, clip, preview
from orin_llm_node.ros.request_envelope import sampling_overrides


class Worker:
    """Queue of prompts in, answers out; see the module docstring for who owns what."""

    def __init__(self, node):
        self.node = node
        self.engine = None
        self._conv = None
        self._conv_system_prompt = None
        self._cond = threading.Condition()
        self._queue = deque()
        self._reset = False
        self._busy = False
        self._cancel_pending = False
        self._command = None
        self._command_done = threading.Event()
        self._command_ok = False
        self.load_error = ''
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name='orin_llm_worker', daemon=True)

    # ---- called from other threads ---------------------------------------------------------

    def submit(self, request, capacity):
        """Queue ``request``; returns the oldest request dropped to make room, or None."""
        with self._cond:
            dropped = self._queue.popleft() if len(self._queue) >= capacity else None
            self._queue.append(request)
            self._cond.notify_all()
            return dropped

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

    def cancel(self):
        """Stop the generation in progress; True if there was one."""
        with self._cond:
            if self._busy and self.engine is not None:
                # The engine clears its flag when a turn starts, so the worker repeats the
                # cancel after it has begun (_cancel_pending) in case we came too early.
                self._cancel_pending = True
                self.engine.cancel()        # the one thread-safe engine call
                return True
        return False

    def call(self, command):
        """Run ``'load'`` or ``'unload'`` on the worker and wait; False if it failed or stops."""
        self._command_done.clear()
        with self._cond:
            self._command = command
            self._cond.notify_all()
        while not self._command_done.wait(0.1):
            if self._stopping():
                return False
        return self._command_ok and not self._stopping()

    def _stopping(self):
        # The node's flag is set by main's signal handler, before teardown reaches stop().
        return self._stop.is_set() or self.node.stop_requested.is_set()

    def stop(self, timeout_s):
        """Stop the thread (cancelling a generation); True if it has stopped."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self.cancel()
        if self.thread.is_alive():
            self.thread.join(timeout_s)
        return not self.thread.is_alive()

    # ---- the worker thread -----------------------------------------------------------------

    def _run(self):
        while not self._stop.is_set():
            request = None
            with self._cond:
                if not (self._queue or self._reset or self._command or self._stop.is_set()):
                    wait = (self.node.monitor.seconds_until_due(time.monotonic())
                            if self.engine is not None else 0.5)
                    self._cond.wait(timeout=max(wait, 0.01))
                command, self._command = self._command, None
                reset, self._reset = self._reset, False
                if (self._queue and self.engine is not None and not reset and not command
                        and not self._stop.is_set()):
                    request = self._queue.popleft()
                    self._busy = True
                    self._cancel_pending = False
            if self._stop.is_set():
                break
            if command is not None:
                self._command_ok = self._run_command(command)
                self._command_done.set()
                continue
            try:
                if reset:
                    self._drop_conversation('reset service')
                if request is not None:
                    self._answer(request)
            except ValueError as exc:   # the engine's verdict on the input (nothing changed)
                self.node.info.add(errors=1)
                self._report_failure(request, f'prompt rejected: {preview(exc, REASON_CHARS)}')
            except Exception as exc:  # noqa: BLE001 - bad input must never kill the node
                self.node.info.add(errors=1)
                reason = preview(exc, REASON_CHARS) or type(exc).__name__
                self._report_failure(request, f'request failed: {reason}')
                self.node.get_logger().debug(traceback.format_exc())
            finally:
                with self._cond:
                    self._busy = False
            self._diagnostics()

    def _diagnostics(self, force=False, only_if_due=False):
        if self.engine is not None:
            self.node.diagnostics(self.engine.stats(), self.queue_depth(), force, only_if_due)

    def _run_command(self, command):
        if command == 'unload':
            self._drop_conversation()
            self.engine = None
            model_loading.release_memory()
            return True
        from orin_llm_node.models import LoadInterrupted
        try:
            engine = model_loading.load_engine(self.node.params, self.node.get_logger(),
                                               should_stop=self._stopping)
            parameters.check_loaded(engine, {name: self.node.runtime(name)
                                             for name in parameters.LOADED_CHECKS})
        except LoadInterrupted as exc:
            self.load_error = str(exc)
            return False
        except Exception as exc:  # noqa: BLE001 - any load failure is one fatal line
            self.load_error = ' '.join(str(exc).split()) or type(exc).__name__
            return False
        # cuda_graph: reported only when the engine says graphs are really in use.
        self.node.info.update(device=str(engine.device),
                              dtype=str(engine.dtype).replace('torch.', ''),
                              weight_format=engine.weight_format,
                              weight_bytes=engine.weight_bytes,
                              cuda_graph=bool(engine.uses_cuda_graph),
                              attention_backend=engine.attention_backend,
                              backend_fallback_reason=engine.backend_fallback_reason or '')
        self.node.monitor.hardware_id = str(engine.device)
        self.engine = engine
        self._diagnostics(force=True)
        return True

    def _report_failure(self, request, text):
        if request is None:
            self.node.publish_error(text)
            return
        self.node.publish_error(f'{text} (request {request.request_id})')
        self.node.publish_info(AnswerInfo.failed(request, text, camera_report(request)))

    def _drop_conversation(self, why=None):
        if self._conv is not None and self.engine is not None:
            self.engine.reset(self._conv)
            if why:
                self.node.get_logger().info(f'conversation reset ({why})')
        self._conv = None

    def _conversation(self):
        system_prompt = self.node.runtime('system_prompt') or None
        if self._conv is not None and system_prompt != self._conv_system_prompt:
            self._drop_conversation('system_prompt changed')
        if self._conv is None:
            self._conv = self.engine.new_conversation(system_prompt=system_prompt)
            self._conv_system_prompt = system_prompt
        return self._conv

    def _sampling(self, request):
        # Run-time parameters may have changed since the last prompt; an envelope's keys
        # override them for its own answer.
        values = dict(self.node.params)
        values.update({name: self.node.runtime(name) for name in parameters.RUNTIME_PARAMETERS})
        return dataclasses.replace(parameters.sampling_params(values),
                                   **sampling_overrides(request.envelope or {}))

    def frame_processor(self):
        """What sizes the frames kept for video (the engine's processors), once loaded."""
        return None if self.engine is None else FrameSizer.of(self.engine.prompts)

    def _decode(self, request):
        """[(view, RGB array or VideoClip)] of the cameras that give the prompt something.

        A frame that cannot be decoded leaves its camera out (the reason goes to the view).
        """
        used = []
        for view in request.views:
            if view.clip:
                from orin_llm_node.processing import VideoClip
                # Exact stamps: which frames the clip keeps never depends on the clock's origin.
                used.append((view, VideoClip([f.rgb for f in view.clip],
                                             [Fraction(f.stamp_ns, 10**9) for f in view.clip])))
                continue
            if view.frame is not None:          # one frame in a clip's window: an image
                used.append((view, view.frame.rgb))
                continue
            if view.image is None:
                continue
            try:
                used.append((view, view.image.rgb()))
            except ros_image.ImageConversionError as exc:
                # Not paired with the next prompt either, which says why.
                self.node.intake.forget(view.image, clip(exc, REASON_CHARS))
                self.node.refuse_image(view.name + ('/compressed' if view.image.compressed
                                                    else ''), exc,
                                       '; the prompt is answered without it')
                view.image, view.missing = None, f'image rejected: {clip(exc, REASON_CHARS)}'
        return used

    @staticmethod
    def _content(request, used):
        """The engine's (text, images, videos) for ``used``.

        One camera: the text as it is, with its frame or clip (exactly the prompt of the
        single-camera node).  Several: one text of parts, each frame or clip introduced by its
        camera's name in the listed order, then the question.
        """
        if len(request.views) == 1:
            images = [x for _, x in used if isinstance(x, np.ndarray)]
            videos = [x for _, x in used if not isinstance(x, np.ndarray)]
            return request.text, images, videos
        parts = []
        if len(used) > 1 and not request.synchronised:
            parts.append('(The frames below are the newest of each camera, not taken at the '
                         'same time.)\n')
        for view, x in used:
            parts += [f'{view.name}: ', x, '\n']
        return parts + [request.text], [], []

    def _answer(self, request):
        from orin_llm_node.engine import FinishReason
        node = self.node
        node.info.add(requests=1)
        used = self._decode(request)
        stamps = [v.image.stamp_ns for v, _ in used if v.image is not None]
        if stamps:
            node.info.update(last_image_stamp=max(stamps) / 1e9)
        text, images, videos = self._content(request, used)
        sampling = self._sampling(request)
        if (request.envelope or {}).get('conversation') == 'new':
            self._drop_conversation('prompt/json asked for a new conversation')
        conv = self._conversation()
        t0 = time.monotonic()
        result = None
        # videos only when there is one: the keyword is the video-capable engine's.
        extra = {'videos': videos} if videos else {}
        try:
            for event in self.engine.chat_stream(conv, text, images=images, sampling=sampling,
                                                 **extra):
                if event.delta:
                    node.publish_stream(event.delta)
                if event.result is not None:
                    result = event.result
                if self._cancel_pending:
                    self.engine.cancel()
                self._diagnostics(only_if_due=True)
        finally:
            if node.params['conversation_mode'] == 'single':
                self._drop_conversation()   # every prompt alone; its blocks stay as cache
        elapsed = time.monotonic() - t0
        if self._stop.is_set() or not node.context.ok():
            return                      # shutting down (Ctrl-C): nobody to tell
        finish = result.finish_reason
        node.info.update(last_finish_reason=finish, last_ttft_ms=1000.0 * result.ttft_s,
                         last_vision_ms=1000.0 * result.vision_s,
                         last_decode_tok_s=result.decode_tok_s)
        node.publish_info(AnswerInfo.answered(request, result, camera_report(request),
                                              self.engine.weight_format))
        what = f"'{preview(request.text)}'" + ''.join(
            f' + {x.shape[1]}x{x.shape[0]} image' if isinstance(x, np.ndarray)
            else f' + {len(x.frames)}-frame clip' for _, x in used)
        if result.error:
            # Refused before it ran (the context or the pool), or failed while it ran ('error':
            # the turn left no trace in the conversation).
            node.info.add(errors=1)
            verdict = 'failed' if finish == FinishReason.ERROR else 'rejected'
            node.publish_error(f'prompt {what} {verdict} ({finish}, request '
                               f'{request.request_id}): {result.error}')
            return
        node.publish_response(result.text)
        summary = (
            f'{what} -> {len(result.token_ids)} tokens in {elapsed:.2f} s (finish={finish}, '
            f'ttft {1000 * result.ttft_s:.0f} ms, {result.cached_tokens} cached prompt tokens'
            + (f', {result.dropped_turns} old turn(s) dropped' if result.dropped_turns else '')
            + ')')
        # rclpy loggers insist on one severity per call site: two calls, not one variable.
        if finish in FinishReason.LIMITS:
            node.get_logger().warning(summary)
        else:
            node.get_logger().info(summary)
