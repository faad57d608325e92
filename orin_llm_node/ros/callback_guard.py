# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""No exception in a subscription, service, timer or set-parameters callback ends the node.

rclpy re-raises a callback's exception out of ``spin_once``, and the process ends with every
queued prompt lost: one message the code did not foresee is enough.  :class:`GuardedCallbacks`
is a mixin for the node class: every callback registered through its ``create_subscription``,
``create_service``, ``create_timer`` and ``add_on_set_parameters_callback`` (the node's own,
its camera intake's, rclpy's parameter services and ``/clock``) runs inside :func:`guarded`.
An exception there is counted in diagnostics (``callback_faults``), said on ``error`` at most
once a second per callback and kind of exception (``refusals.RefusalLimiter``; the others are
counted as ``unsaid_errors``) and logged with its traceback, and the callback returns what
"failed" means to its caller: nothing for a subscription or timer, a service response with
``success: false`` where it has one, a refused parameter change.  ``KeyboardInterrupt`` and
``SystemExit`` still end the process.
"""

import functools
import time
import traceback

from rcl_interfaces.msg import SetParametersResult

from orin_llm_node.refusals import REASON_CHARS, clip


def guarded(node, where, callback, failed=lambda exc, *args: None):
    """``callback`` for ``node``, reporting an exception instead of raising it.

    ``where``: the callback's name in the report (topic, service, ``timer``); ``failed(exc,
    *args)``: the callback's return value after an exception.  ``node`` provides ``replies``
    (node_replies.NodeReplies: its counters, rate limit and ``error``) and ``get_logger``.
    The wrapper keeps ``callback``'s signature: rclpy inspects it (a subscription callback
    that takes two arguments also gets the message info).
    """
    @functools.wraps(callback)
    def run(*args):
        try:
            return callback(*args)
        except Exception as exc:  # noqa: BLE001 - the node serves on; said and counted
            _report(node, where, exc)
            return failed(exc, *args)
    return run


def _report(node, where, exc):
    node.replies.count(callback_faults=1)
    kind = type(exc).__name__
    said, held_back = node.replies.refusals.admit(f'callback {where}', kind, time.monotonic())
    if not said:
        node.replies.count(unsaid_errors=1)
        return
    more = f' ({held_back} more like it not repeated)' if held_back else ''
    node.get_logger().error(f'{where} callback failed:\n{traceback.format_exc()}')
    node.replies.error(f'internal error in the {where} callback, the node serves on: {kind}: '
                       f'{clip(exc, REASON_CHARS)}{more}')


def _failed_response(exc, request, response):
    # A service's reply after an exception: success false with the reason, where it has them.
    if hasattr(response, 'success'):
        response.success = False
    if hasattr(response, 'message'):
        response.message = f'internal error: {type(exc).__name__}: {clip(exc, REASON_CHARS)}'
    return response


def _refused_change(exc, params):
    return SetParametersResult(successful=False, reason=f'internal error while checking the '
                               f'change: {type(exc).__name__}: {clip(exc, REASON_CHARS)}')


class GuardedCallbacks:
    """Mixin (before the rclpy node class): every callback registered runs in :func:`guarded`.

    The instance needs the attributes :func:`guarded` names once callbacks can run (after its
    ``__init__``); rclpy's own registrations during ``Node.__init__`` are guarded too.  What
    rclpy keeps is the wrapper: ``remove_on_set_parameters_callback`` would not find the
    callback given (the node never removes one).
    """

    def create_subscription(self, msg_type, topic, callback, *args, **kwargs):
        """``Node.create_subscription`` with ``callback`` guarded."""
        return super().create_subscription(msg_type, topic, guarded(self, topic, callback),
                                           *args, **kwargs)

    def create_service(self, srv_type, srv_name, callback, *args, **kwargs):
        """``Node.create_service`` with ``callback`` guarded (a fault: ``success: false``)."""
        return super().create_service(
            srv_type, srv_name, guarded(self, srv_name, callback, _failed_response),
            *args, **kwargs)

    def create_timer(self, timer_period_sec, callback, *args, **kwargs):
        """``Node.create_timer`` with ``callback`` guarded."""
        if callback is not None:
            callback = guarded(self, 'timer', callback)
        return super().create_timer(timer_period_sec, callback, *args, **kwargs)

    def add_on_set_parameters_callback(self, callback):
        """``Node.add_on_set_parameters_callback``, ``callback`` guarded (a fault: refused)."""
        return super().add_on_set_parameters_callback(
            guarded(self, 'set_parameters', callback, _refused_change))
