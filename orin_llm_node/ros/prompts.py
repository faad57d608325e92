# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What a prompt goes through before the session's queue (executor, the prompts' group).

``prompt`` and ``prompt/json`` messages get a request id, are checked (text, envelope, the
node's state, a clip's length), paired with what the cameras give them and queued; or refused
at once with the reason, on ``error`` and ``response/info``.  A full queue drops its oldest
prompt, which is refused the same way.
"""

import itertools

from orin_llm_node import parameters
from orin_llm_node.refusals import REASON_CHARS, clip, preview
from orin_llm_node.ros import tool_requests
from orin_llm_node.ros.cameras.camera_report import camera_report
from orin_llm_node.ros.cameras.camera_views import Request
from orin_llm_node.ros.contract import AnswerInfo
from orin_llm_node.ros.request_envelope import EnvelopeError, parse_envelope, stamp_ns

# Why a prompt is refused in each state but ``active`` (the state is named before it).
_NOT_READY = {
    'unconfigured': 'configure and activate it to take prompts',
    'loading': 'the model is loading; prompts are taken once ready is true',
    'inactive': 'activate it to take prompts',
    'failed': 'the model could not be loaded',
    'finalized': 'the node is shutting down',
}


def not_ready(state):
    """Why a prompt (or goal) is refused in ``state`` (anything but ``active``)."""
    return f"node is {state}: {_NOT_READY.get(state, 'it is not taking prompts')}"


class PromptIntake:
    """The prompts of ``node`` (its state, parameters, cameras, session and replies).

    Request ids are handed out in arrival order, to prompts and ask goals alike (their
    callbacks run in different groups: ``next(count)`` is atomic).
    """

    def __init__(self, node):
        self._node = node
        self._ids = itertools.count(1)

    def next_request_id(self):
        """The id of the next prompt or goal."""
        return next(self._ids)

    def refuse(self, request_id, text, reason, tag=None, cameras=None):
        """Tell the sender (on ``error`` and ``response/info``) why its prompt is not answered.

        ``cameras``: what the cameras gave it (a clip refused), as ``response/info`` says it.
        """
        reason = clip(reason, REASON_CHARS)
        self._node.replies.error(f'request {request_id}: {reason}')
        self._node.replies.info(AnswerInfo.refused(request_id, text, reason, tag, cameras))

    def refuse_queued(self, request, reason):
        """Refuse a request taken out of the queue unanswered (dropped for room, drained)."""
        self.refuse(request.request_id, request.text, reason, (request.envelope or {}).get('tag'))
        if request.listener is not None:
            request.listener.refused(clip(reason, REASON_CHARS))

    def on_prompt(self, msg):
        """A ``prompt``: checked, then queued."""
        self._enqueue(self.next_request_id(), msg.data)

    def on_prompt_json(self, msg):
        """A ``prompt/json`` request envelope (request_envelope.py): checked, then queued."""
        request_id = self.next_request_id()
        try:
            envelope = parse_envelope(msg.data, self._node.runtime('tools'))
        except EnvelopeError as exc:
            self.refuse(request_id, None, f'prompt/json refused: {exc}', exc.tag)
            return
        self._enqueue(request_id, tool_requests.request_text(envelope), envelope)

    def _enqueue(self, request_id, text, envelope=None):
        """Check a prompt, pair it with the cameras' frames (or clips) and queue it.

        ``envelope``: the checked keys of a ``prompt/json`` request; its ``video_s`` asks for
        a clip (plain prompts: the ``video_window_s`` parameter).
        """
        node, params = self._node, self._node.params
        tag = (envelope or {}).get('tag')
        if not text.strip() and 'tool_results' not in (envelope or {}):
            self.refuse(request_id, text, 'empty prompt ignored', tag)
            return
        if len(text) > parameters.MAX_PROMPT_CHARS:
            self.refuse(request_id, text[:200], f'prompt of {len(text)} characters rejected '
                        f'(limit {parameters.MAX_PROMPT_CHARS})', tag)
            return
        state = node.state()
        if state != 'active':
            self.refuse(request_id, text, not_ready(state), tag)
            return
        # detect takes each camera's newest frame as the camera sent it (its own pixels).
        video_s = (envelope or {}).get('video_s', 0.0 if 'detect' in (envelope or {})
                                       else node.runtime('video_window_s'))
        if video_s > params['video_buffer_s']:
            self.refuse(request_id, text, f'a clip of {video_s:g} s asked for, but each camera '
                        f"keeps {params['video_buffer_s']:g} s (video_buffer_s)", tag)
            return
        # image_stamp: the frame published with the prompt may not have been taken in yet
        # (its callback runs in another group): wait for it, within image_wait_s, and never
        # pair an older one.
        not_before = stamp_ns(envelope or {})
        if not_before is not None and text:
            node.intake.wait_for(not_before, node.runtime('image_wait_s'))
        now = node.get_clock().now().nanoseconds
        # Tool results alone add no message, so they take no frames (none is decoded).
        views, synchronised = node.intake.take(now, params['image_max_age_s'], video_s,
                                               not_before) if text else ([], True)
        request = Request(request_id, text, views, synchronised, video_s, envelope)
        missing = '; '.join(f'{v.name}: {v.missing}' for v in views if v.missing)
        if video_s > 0 and views and all(v.missing for v in views):
            self.refuse(request_id, text, f'a clip of the last {video_s:g} s has zero frames '
                        f'({missing})', tag, camera_report(request))
            return
        if missing:
            node.get_logger().info(f'{missing}: the prompt is answered without '
                                   + ('these cameras' if len(views) > 1 else 'an image'))
        capacity = params['queue_size']
        dropped = node.session.submit(request, capacity)
        node.replies.facts(queue_depth=node.session.queue_depth())
        if dropped is not None:
            node.replies.count(dropped_prompts=1)
            self.refuse_queued(dropped, f'queue full (queue_size {capacity}): dropped the oldest '
                               f"prompt '{preview(dropped.text)}'")
