# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ``ask`` action server (``orin_llm_node/action/Ask``): one goal per question.

Every goal is accepted, then checked like a ``prompt/json`` envelope (the goal's fields become
one, read by the same ``parse_envelope``), paired with its own images or the node's cameras,
and queued in the session's one queue with the topics' prompts, in arrival order; or aborted
at once with the reason (node not active, queue full, malformed goal).  Accept-then-abort,
because an action's goal response carries no reason.  A goal's request answers on the topics
as a prompt's does (``response/info`` etc.) *and* to the goal: its feedback and its result
(goal_feedback.py).  Cancel stops that goal only: withdrawn from the queue, or its answer
stopped (``finish_reason`` ``cancelled``).  Deactivation and a vanished client abort.

Threads: the server's callbacks run in a reentrant group of their own.  The goal callback
checks and queues (so goals keep their order of arrival); ``execute`` is a coroutine that
waits for its goal's outcome without holding an executor thread (goals may wait in the queue
for minutes).
"""

import json
import threading
import time
import traceback

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.task import Future

from orin_llm_node.action import Ask
from orin_llm_node.refusals import REASON_CHARS, clip, preview
from orin_llm_node.ros import contract
from orin_llm_node.ros.goal_feedback import GoalFeedback
from orin_llm_node.ros.goal_request import GoalRefused, goal_request
from orin_llm_node.valid_text import valid_text, valid_value

# A client that left is noticed within this many checks (one a second): discovery may lag a
# new client's subscriptions by a moment, so one check alone would abort a healthy goal.
VANISHED_AFTER_CHECKS = 3
# The longest a goal's end waits for rclpy to apply its accepted cancel (microseconds, as a
# rule: the cancel callback is returning on another executor thread).
CANCEL_STATE_WAIT_S = 2.0


class AskServer:
    """The ask action of ``node`` (its state, parameters, cameras, prompt ids and session)."""

    def __init__(self, node):
        self._node = node
        self._lock = threading.Lock()
        # id(goal message) -> (goal, request id, GoalFeedback): the goal callback queues the
        # request, and rclpy hands the same message object on as the goal handle's request.
        self._goals = {}
        self._clientless_checks = 0
        group = ReentrantCallbackGroup()
        requests = contract.request_qos()   # no goal, cancel or result request lost in DDS
        self.server = ActionServer(
            node, Ask, contract.ASK, self._execute, callback_group=group,
            goal_callback=self._take, cancel_callback=self._cancel,
            goal_service_qos_profile=requests, result_service_qos_profile=requests,
            cancel_service_qos_profile=requests)
        node.create_timer(1.0, self._check_clients, callback_group=group)

    def stop_all(self, reason):
        """Abort every goal with ``reason`` once its request ends.

        Deactivate and shutdown call it, then drain the queue and cancel the answer in flight.
        """
        with self._lock:
            for _, _, listener in self._goals.values():
                listener.stop_reason = reason

    def _take(self, goal):
        """Goal callback: the request id, the checks and the queue, before the goal response.

        Goals and prompts are queued in the order they arrive: a client that waits for one
        goal's acceptance before it sends the next finds them queued in that order.  Always
        accepted (the response has no room for a reason); a refusal ends the goal at once.
        """
        node = self._node
        request_id = node.prompts.next_request_id()
        listener = GoalFeedback(log=node.get_logger().warning)
        with self._lock:
            self._goals[id(goal)] = (goal, request_id, listener)
        try:
            request = goal_request(node, request_id, goal, listener)
            capacity = node.params['queue_size']
            if not node.session.offer(request, capacity):
                raise GoalRefused(f'queue full (queue_size {capacity}): the goal is refused '
                                  '(a prompt would drop the oldest)')
        except Exception as exc:  # noqa: BLE001 - every goal gets its end, the node serves on
            if not isinstance(exc, GoalRefused):
                node.get_logger().error(f'ask goal failed: {traceback.format_exc()}')
                exc = GoalRefused(f'goal failed: {preview(exc, REASON_CHARS)}')
            reason = clip(str(exc), REASON_CHARS)
            node.prompts.refuse(request_id, goal.prompt, reason, goal.tag or None, exc.cameras)
            listener.refused(reason, exc.cameras)
            return GoalResponse.ACCEPT
        node.replies.facts(queue_depth=node.session.queue_depth())
        return GoalResponse.ACCEPT

    async def _execute(self, handle):
        goal = handle.request
        with self._lock:
            _, request_id, listener = self._goals[id(goal)]
        done = Future(executor=self._node.executor)
        # A done callback makes set_result (from the session's thread) wake the executor,
        # which then resumes this coroutine.
        done.add_done_callback(lambda future: None)
        try:
            if listener.attach(handle.publish_feedback, lambda: done.set_result(True)):
                await done
        finally:
            with self._lock:
                self._goals.pop(id(goal), None)
        try:
            return self._result(handle, request_id, listener)
        except Exception as exc:  # noqa: BLE001 - every goal gets a result it can be sent
            self._node.get_logger().error(f'ask goal {request_id}: its result failed: '
                                          f'{valid_text(traceback.format_exc())}')
            if handle.is_active:
                handle.abort()
            return Ask.Result(finish_reason='error',
                              error=valid_text(f'internal error: {preview(exc, REASON_CHARS)}'))

    def _result(self, handle, request_id, listener):
        info, result = listener.outcome
        cancelled = _cancel_applied(handle, listener)
        if isinstance(info, str):       # never answered: refused, dropped, drained, withdrawn
            reason = listener.stop_reason or info
            (handle.canceled if cancelled else handle.abort)()
            return _sendable(Ask.Result(
                finish_reason='cancelled' if cancelled else 'refused',
                error='' if cancelled else reason,
                info=_refused_info(request_id, handle.request, reason, result)))
        out = Ask.Result(text=info.text or '', finish_reason=info.finish_reason,
                         error=info.error or '', info=info.to_json(),
                         tool_calls=json.dumps(valid_value(info.tool_calls)),
                         # In each camera frame's pixels, as response/info has them.
                         detections=json.dumps(valid_value(info.detections or [])))
        if info.valid:
            out.json = json.dumps(info.parsed, ensure_ascii=False)
        if cancelled and info.finish_reason == 'cancelled':
            handle.canceled()
        elif listener.stop_reason:
            out.error = out.error or listener.stop_reason
            handle.abort()
        elif info.error:
            handle.abort()
        else:
            handle.succeed()
        return _sendable(out)

    def _cancel(self, handle):
        with self._lock:
            entry = self._goals.get(id(handle.request))
        if entry is not None:
            entry[2].cancel_requested = True
            self._stop(*entry[1:])
        return CancelResponse.ACCEPT

    def _stop(self, request_id, listener):
        """Withdraw the goal's request from the queue, or stop its answer."""
        withdrawn = self._node.session.withdraw(request_id)
        if withdrawn is None:
            self._node.session.cancel(request_id)
            return
        reason = listener.stop_reason or 'cancelled by its client while queued'
        self._node.prompts.refuse(request_id, withdrawn.text, reason,
                                  (withdrawn.envelope or {}).get('tag'))
        listener.refused(reason)

    def _check_clients(self):
        # rclpy tells no goal's client apart: a goal is orphaned when no ask client is left
        # (every action client subscribes to the feedback and status topics).
        with self._lock:
            goals = list(self._goals.values())
        node = self._node
        topic = node.resolve_topic_name(contract.ASK)
        clients = (node.count_subscribers(f'{topic}/_action/feedback')
                   + node.count_subscribers(f'{topic}/_action/status'))
        self._clientless_checks = 0 if clients or not goals else self._clientless_checks + 1
        if self._clientless_checks < VANISHED_AFTER_CHECKS:
            return
        for _, request_id, listener in goals:
            listener.stop_reason = 'its client vanished'
            self._stop(request_id, listener)


def _cancel_applied(handle, listener):
    """Whether the goal's client cancelled it (its handle is then ``CANCELING``).

    The cancel callback stops the request before rclpy moves the goal to ``CANCELING`` (when
    the callback returns): the outcome can be here first, so wait that moment out.
    """
    if not listener.cancel_requested:
        return handle.is_cancel_requested
    deadline = time.monotonic() + CANCEL_STATE_WAIT_S
    while not handle.is_cancel_requested and time.monotonic() < deadline:
        time.sleep(0.001)
    return handle.is_cancel_requested


def _sendable(result):
    # Every text field valid Unicode (a server's or a model's text may hold a lone surrogate):
    # rclpy could not send the result, and its exception would end the executor's spin.
    for name in ('text', 'json', 'tool_calls', 'detections', 'finish_reason', 'error', 'info'):
        setattr(result, name, valid_text(getattr(result, name)))
    return result


def _refused_info(request_id, goal, reason, cameras=None):
    # The response/info record the topics got for a goal never answered.
    return contract.AnswerInfo.refused(request_id, goal.prompt, reason, goal.tag or None,
                                       cameras).to_json()

