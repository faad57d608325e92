# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""One ask goal's side of its request: the feedback it is sent and the outcome it waits for.

:class:`GoalFeedback` is the request's listener (``Request.listener``): the session tells it
the queue position, the engine's stages, the text deltas and the end, on the session's thread;
the intake tells it when the request is dropped or drained unanswered.  It turns that into
``Ask.Feedback`` messages -- a change of stage at once, text deltas coalesced to at most one
message per :data:`MIN_INTERVAL_S` (a goal's client on a slow link must not get one message
per token) -- and keeps the outcome for the action server (ask_server.py), which waits for it.
No rclpy here: ``publish`` and ``wake`` are the server's.
"""

import threading
import time

from orin_llm_node.action import Ask
from orin_llm_node.valid_text import valid_text

Feedback = Ask.Feedback

# At most ~20 text feedback messages a second; a stage change is never held back.
MIN_INTERVAL_S = 0.05

STAGES = {'encoding_images': Feedback.STAGE_ENCODING_IMAGES,
          'prefill': Feedback.STAGE_PREFILL, 'decoding': Feedback.STAGE_DECODING}
# Each stage constant's name, sent beside it (``stage_name``): a number alone says little in
# ``ros2 action send_goal --feedback``.
STAGE_NAMES = {Feedback.STAGE_QUEUED: 'queued', **{v: k for k, v in STAGES.items()}}


class GoalFeedback:
    """The listener of one goal's request (see camera_views.Request.listener).

    Made when the goal arrives (its request is queued before the goal handle exists);
    :meth:`attach` gives it the handle's ``publish`` and the server's ``wake``, and sends what
    was said before.  ``outcome``: None until the end, then ``(info, result)`` (answered or
    failed: the ``AnswerInfo`` and the engine's result or None) or ``(reason, cameras)``
    (refused, dropped, drained or withdrawn unanswered: a str, and the camera report if any).
    ``log(text)``: told when a message could not be sent (it is dropped, nothing raises).
    """

    def __init__(self, clock=time.monotonic, log=lambda text: None):
        self._log = log                 # told why a message could not be sent
        self._publish = None            # until attached: messages wait in the backlog
        self._backlog = []
        self._wake = None
        self._clock = clock
        self._lock = threading.Lock()
        self._t0 = clock()
        self._last_sent = None
        self._msg = Feedback(stage=Feedback.STAGE_QUEUED)
        self._pending = ''              # text decoded since the last message
        self.outcome = None
        self.stop_reason = ''           # set by the server: why it stopped the goal itself
        self.cancel_requested = False   # set by the server: its client asked to cancel it

    def attach(self, publish, wake):
        """Send through ``publish`` from now on; ``wake()`` once the outcome is there.

        Returns False when the outcome is already there (nothing to wait for).
        """
        with self._lock:
            self._publish, self._wake = publish, wake
            for msg in self._backlog:
                self._deliver(msg)
            self._backlog = []
            return self.outcome is None

    def queued(self, ahead):
        """``ahead`` requests are before this one in the queue."""
        with self._lock:
            if self.outcome is None and self._msg.stage == Feedback.STAGE_QUEUED and (
                    self._last_sent is None or ahead != self._msg.queue_position):
                self._msg.queue_position = ahead
                self._send()

    def stage(self, name):
        """The engine entered stage ``name`` (``engine.Stage``): said at once."""
        with self._lock:
            self._msg.stage = STAGES[name]
            self._msg.queue_position = 0
            if self._msg.stage == Feedback.STAGE_DECODING:
                self._msg.ttft_ms = 1000.0 * (self._clock() - self._t0)
            self._send()

    def delta(self, text, token):
        """Text decoded (``token``: it came with a new token); sent when due."""
        with self._lock:
            self._pending += text
            self._msg.tokens += int(token)
            if self._last_sent is None or self._clock() - self._last_sent >= MIN_INTERVAL_S:
                self._send()

    def finished(self, info, result):
        """The request was answered or failed: ``info`` (AnswerInfo), the engine's result."""
        # A server may not return token ids (RemoteResult.token_ids None): no count then.
        ids = None if result is None else result.token_ids
        self._end((info, result), None if ids is None else len(ids))

    def refused(self, reason, cameras=None):
        """The request is not answered (refused, dropped, drained, withdrawn): why."""
        self._end((reason, cameras))

    def _end(self, outcome, tokens=None):
        with self._lock:
            if self.outcome is not None:
                return
            # The last message: the text held back (the client's deltas add up to the whole
            # text) and the count with the stop token, which brings no delta of its own.
            if tokens is not None and tokens != self._msg.tokens:
                self._msg.tokens = tokens
                self._send()
            elif self._pending:
                self._send()
            self.outcome = outcome
            wake = self._wake
        if wake is not None:
            try:
                wake()
            except Exception as exc:  # noqa: BLE001 - the session thread must carry on
                self._log(f'ask goal: its end could not be handed to the server: {exc!r}')

    def _send(self):
        # Under the lock: one message with the text held so far.
        msg = self._msg
        out = Feedback(stage=msg.stage, stage_name=STAGE_NAMES[msg.stage],
                       text_delta=valid_text(self._pending), tokens=msg.tokens,
                       ttft_ms=msg.ttft_ms, queue_position=msg.queue_position)
        if self._publish is None:
            self._backlog.append(out)
        else:
            self._deliver(out)
        self._pending = ''
        self._last_sent = self._clock()

    def _deliver(self, msg):
        try:
            self._publish(msg)
        except Exception as exc:  # noqa: BLE001 - a lost feedback message, never a lost thread
            self._log(f'ask goal: a feedback message could not be sent: {exc!r}')
