# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's side of the session's :class:`~orin_llm_node.ros.replies.Replies` port.

:class:`NodeReplies` owns what the node says: its publishers (contract.py's topics), its facts
(:class:`~orin_llm_node.ros.diagnostics.NodeFacts`), the ``/diagnostics`` monitor and the rate
limit on refusals.  The session, the executor's callbacks and the camera intake all speak
through it, from any thread.  What it publishes is valid Unicode (valid_text.py: an answer or a
reason from a server may hold a lone surrogate), and a publication that fails anyway is logged,
never raised to its caller.
"""

import logging
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import rclpy
from std_msgs.msg import Bool, String

from orin_llm_node.jetson_power import read_power_state
from orin_llm_node.refusals import REASON_CHARS, RefusalLimiter, clip
from orin_llm_node.ros import contract
from orin_llm_node.ros.detections_topic import DetectionsTopic
from orin_llm_node.ros.diagnostics import DiagnosticsMonitor, NodeFacts
from orin_llm_node.valid_text import valid_text


class NodeReplies:
    """Publishers, facts and diagnostics of ``node``; ``frame_rejected`` goes to ``intake``.

    ``params``: the node's start-up parameter values (the diagnostics period and the pool's
    warning level).
    """

    def __init__(self, node, params):
        self._node = node
        self.logger = node.get_logger()
        self.node_facts = NodeFacts(state='unconfigured')
        self.monitor = DiagnosticsMonitor(
            period_s=params['diagnostics_period_s'], warn_fraction=params['pool_warn_fraction'],
            node_name=node.get_name(), power_reader=read_power_state)
        # The monitor's windows and hardware_id change under this lock only (session thread,
        # executor timers and transitions).
        self._diag_lock = threading.Lock()
        self.refusals = RefusalLimiter()
        self.intake = None              # set by the node: it forgets frames that failed
        self._closed = threading.Event()
        self._pubs = {topic.name: node.create_publisher(kind, topic.name, topic.qos())
                      for kind, topic in ((String, contract.RESPONSE), (String, contract.STREAM),
                                          (String, contract.INFO), (String, contract.ERROR),
                                          (Bool, contract.READY),
                                          (DiagnosticArray, contract.DIAGNOSTICS))}
        self._detections = DetectionsTopic(node)

    def closing(self):
        """The node is going away: a publication that fails is no longer worth a log line."""
        self._closed.set()

    def _publish(self, topic, msg):
        pub = self._pubs[topic.name]
        try:
            pub.publish(msg)
        except Exception as exc:  # noqa: BLE001 - shutting down: the context may be gone
            if not self._closed.is_set() and rclpy.ok(context=self._node.context):
                self.logger.error(f'publishing on {pub.topic_name} failed: {exc}')

    # ---- the Replies port ------------------------------------------------------------------

    def stream(self, delta):
        """A text delta on ``response/stream``."""
        self._publish(contract.STREAM, String(data=valid_text(delta)))

    def answer(self, text):
        """A whole answer on ``response``."""
        self._publish(contract.RESPONSE, String(data=valid_text(text)))

    def info(self, info):
        """One ``response/info`` (an :class:`~orin_llm_node.ros.contract.AnswerInfo`)."""
        self._publish(contract.INFO, String(data=info.to_json()))

    def detections(self, per_camera):
        """A detect request's boxes on ``detections`` (where vision_msgs is installed)."""
        self._detections.publish(per_camera)

    def error(self, text):
        """Why something was refused, on ``error`` and in the log."""
        text = valid_text(text)        # a server's reason may hold a lone surrogate
        self.logger.warning(text)
        self._publish(contract.ERROR, String(data=text))

    def count(self, **counts):
        """Add to the node's counters (NodeFacts)."""
        self.node_facts.add(**counts)

    def facts(self, **values):
        """Set facts (NodeFacts)."""
        self.node_facts.update(**values)

    def diagnostics(self, pool_stats=None, queue_depth=None, force=False, only_if_due=False,
                    backend_stats=None):
        """Publish /diagnostics if due (or ``force``); the seconds until the next is due.

        ``pool_stats`` (a local engine's) or ``backend_stats`` (a server's) come from the
        session only (the engine's thread).
        """
        now = time.monotonic()
        if only_if_due and self.monitor.seconds_until_due(now) > 0:
            return self.monitor.seconds_until_due(now)
        if queue_depth is not None:
            self.node_facts.update(queue_depth=queue_depth)
        with self._diag_lock:
            statuses = self.monitor.update(now, pool_stats, self.node_facts, force=force,
                                           backend_stats=backend_stats)
            due_in = self.monitor.seconds_until_due(now)
        if statuses:
            msg = DiagnosticArray()
            msg.header.stamp = self._node.get_clock().now().to_msg()
            msg.status = statuses
            self._publish(contract.DIAGNOSTICS, msg)
        return due_in

    def frame_rejected(self, view, exc):
        """A kept frame the session could not decode: forgotten, and said on ``error``."""
        # Not paired with the next prompt either, which says why.
        self.intake.forget(view.image, clip(exc, REASON_CHARS))
        topic = view.name + ('/compressed' if view.image.compressed else '')
        self.refuse_image(topic, exc, '; the prompt is answered without it')

    # ---- the node's own --------------------------------------------------------------------

    def ready(self, flag):
        """The latched ``ready``."""
        self._publish(contract.READY, Bool(data=flag))

    def engine_loaded(self, facts):
        """Report a loaded engine's :class:`~orin_llm_node.ros.session.EngineFacts`."""
        self.node_facts.update(**facts.diagnostics())
        with self._diag_lock:
            self.monitor.hardware_id = facts.device

    def refuse_image(self, topic, exc, consequence=''):
        """Count an unusable image (``exc``: an ImageConversionError) and say why on ``error``.

        At most once a second per topic and kind of fault; the others are only counted.
        """
        self.node_facts.add(errors=1, rejected_images=1)
        said, held_back = self.refusals.admit(topic, exc.kind, time.monotonic())
        if not said:
            self.node_facts.add(unsaid_errors=1)
            return
        more = f' ({held_back} more like it not repeated)' if held_back else ''
        self.error(f'image on {topic} rejected: {clip(exc, REASON_CHARS)}{consequence}{more}')


class RosLogHandler(logging.Handler):
    """Forwards the engine's Python ``logging`` records (warnings and up) to the ROS logger."""

    def __init__(self, ros_logger):
        super().__init__(logging.WARNING)
        self.ros_logger = ros_logger

    def emit(self, record):
        """Say ``record`` on the ROS logger (a warning, or an error from ERROR up)."""
        try:
            text = f'{record.name}: {record.getMessage()}'
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            else:
                self.ros_logger.warning(text)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)
