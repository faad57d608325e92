# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat --action``: the question as one goal of the node's ``ask`` action.

The answer's text is printed on stdout as its feedback brings it; each change of stage (and of
the queue position) is one line on stderr, then the finish reason.  Ctrl-C cancels the goal
(that answer only) and waits briefly for the node to confirm.  Exit status as ``orin_llm_chat``:
0 answered, 1 no node / refused / failed / timeout, 130 cancelled.
"""

import json
import sys
import time

from action_msgs.msg import GoalStatus
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor

from orin_llm_node.action import Ask
from orin_llm_node.ros import contract

Feedback = Ask.Feedback
STAGE_NAMES = {Feedback.STAGE_QUEUED: 'queued', Feedback.STAGE_ENCODING_IMAGES:
               'encoding images', Feedback.STAGE_PREFILL: 'prefill',
               Feedback.STAGE_DECODING: 'decoding'}
# How long Ctrl-C waits for the node to confirm the cancel and send the result.
CANCEL_WAIT_S = 10.0


class _Printer:
    """Feedback to the terminal: stage lines on stderr, text on stdout."""

    def __init__(self):
        self.seen = None
        self.text = ''

    def __call__(self, msg):
        fb = msg.feedback
        now = (fb.stage, fb.queue_position if fb.stage == Feedback.STAGE_QUEUED else 0)
        if now != self.seen:
            self.seen = now
            extra = (f' ({fb.queue_position} ahead)' if fb.stage == Feedback.STAGE_QUEUED
                     else f' (first token after {fb.ttft_ms:.0f} ms)'
                     if fb.stage == Feedback.STAGE_DECODING else '')
            print(f'[{STAGE_NAMES.get(fb.stage, fb.stage)}{extra}]', file=sys.stderr,
                  flush=True)
        if fb.text_delta:
            self.text += fb.text_delta
            sys.stdout.write(fb.text_delta)
            sys.stdout.flush()


def _spin_until(executor, future, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not future.done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    return future.done()


def converse(opts, image, response_format):
    """Ask ``opts.prompt`` as one goal (``image``: a CompressedImage or None); exit status."""
    node = rclpy.create_node('orin_llm_chat_action')
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    client = ActionClient(node, Ask, f"{opts.namespace.rstrip('/')}/{contract.ASK}")
    try:
        return _ask(executor, client, opts, image, response_format)
    finally:
        client.destroy()
        executor.shutdown()
        node.destroy_node()


def _ask(executor, client, opts, image, response_format):
    if not client.wait_for_server(timeout_sec=opts.timeout):
        print(f'orin_llm_chat: no ask action under {opts.namespace} after {opts.timeout:g} s'
              ' (is the node running? same ROS_DOMAIN_ID?)', file=sys.stderr)
        return 1
    goal = Ask.Goal(prompt=' '.join(opts.prompt),
                    compressed_images=[] if image is None else [image],
                    response_format='' if response_format is None
                    else json.dumps(response_format))
    printer = _Printer()
    sent = client.send_goal_async(goal, feedback_callback=printer)
    if not _spin_until(executor, sent, opts.timeout) or not sent.result().accepted:
        print('orin_llm_chat: the goal was not accepted', file=sys.stderr)
        return 1
    handle = sent.result()
    result = handle.get_result_async()
    try:
        answered = _spin_until(executor, result, opts.timeout)
    except KeyboardInterrupt:
        cancel = handle.cancel_goal_async()
        _spin_until(executor, cancel, CANCEL_WAIT_S)
        _spin_until(executor, result, CANCEL_WAIT_S)
        print('\n(cancelled)', file=sys.stderr)
        return 130
    if not answered:
        print(f'\norin_llm_chat: no answer after {opts.timeout:g} s', file=sys.stderr)
        return 1
    return _report(result.result(), printer)


def _report(response, printer):
    answer = response.result
    if response.status != GoalStatus.STATUS_SUCCEEDED:
        print(f'orin_llm_chat: goal {_status_name(response.status)} '
              f'({answer.finish_reason}): {answer.error}', file=sys.stderr)
        return 130 if response.status == GoalStatus.STATUS_CANCELED else 1
    # Feedback is best effort next to the result: print what it did not bring.
    rest = answer.text[len(printer.text):] if answer.text.startswith(printer.text) else (
        '\n' + answer.text)
    print(rest)
    info = json.loads(answer.info)
    print(f"[request {info['request_id']}: finish_reason={answer.finish_reason}, "
          f"{info.get('generated_tokens')} tokens, ttft {info.get('ttft_ms')} ms]",
          file=sys.stderr)
    return 0


def _status_name(status):
    return {GoalStatus.STATUS_ABORTED: 'aborted', GoalStatus.STATUS_CANCELED: 'cancelled'}.get(
        status, f'ended with status {status}')
