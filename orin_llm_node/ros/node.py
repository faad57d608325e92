# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 node ``orin_llm``: its publishers, services, lifecycle and prompt intake.

Threading: callbacks run on the executor and only check headers, remember the newest image
(:mod:`~orin_llm_node.ros.intake`) and queue prompts; **one worker thread owns the engine**
(:mod:`~orin_llm_node.ros.worker`: loading, warm-up, graph capture, answers).  docs/architecture.md
draws the whole picture.
"""

import logging
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import rclpy
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from orin_llm_node.jetson_power import read_power_state
from orin_llm_node.ros import contract, node_parameters, parameters
from orin_llm_node.ros.callback_guard import GuardedCallbacks
from orin_llm_node.ros.camera_report import camera_report
from orin_llm_node.ros.camera_views import Request
from orin_llm_node.ros.contract import AnswerInfo
from orin_llm_node.ros.diagnostics import DiagnosticsMonitor, GenerationInfo
from orin_llm_node.ros.intake import ImageIntake
from orin_llm_node.ros.refusals import REASON_CHARS, RefusalLimiter, clip, preview
from orin_llm_node.ros.request_envelope import EnvelopeError, parse_envelope
from orin_llm_node.ros.worker import Worker

NODE_NAME = 'orin_llm'
# Why a prompt is refused in each state but ``ready`` (the state is named before it).
_NOT_READY = {
    'unconfigured': 'configure and activate it to take prompts',
    'loading': 'the model is loading; prompts are taken once ready is true',
    'inactive': 'activate it to take prompts',
    'failed': 'the model could not be loaded',
    'finalized': 'the node is shutting down',
}


class _RosLogHandler(logging.Handler):
    """Forwards the engine's Python ``logging`` records (warnings and up) to the ROS logger."""

    def __init__(self, ros_logger):
        super().__init__(logging.WARNING)
        self.ros_logger = ros_logger

    def emit(self, record):
        try:
            text = f'{record.name}: {record.getMessage()}'
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            else:
                self.ros_logger.warning(text)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class OrinLLMNode(GuardedCallbacks, LifecycleNode):
    """Qwen3-VL node: see the README for its topics, services and parameters.

    A managed (lifecycle) node: ``configure`` loads the weights, warms up and captures graphs
    (on the worker thread), ``activate`` opens the image subscriptions and the services,
    ``deactivate`` cancels the answer in flight and refuses the queued prompts, ``cleanup``
    frees the engine, ``shutdown`` ends the process.  The prompt subscription lives as long as
    the node, so that every prompt gets one ``response/info`` in every state: answered while
    active, refused with the state as the reason otherwise.
    Unless ``managed``, :meth:`start` runs configure and activate at once (the plain node).
    No callback it registers can end the process (callback_guard.py).  ``command_line``: the
    process's arguments, whose ``-p`` overrides are checked on their own
    (:func:`~orin_llm_node.ros.node_parameters.declare`).
    """

    def __init__(self, managed=False, stop_requested=None, command_line=(), **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.managed = managed
        # Set by main's signal handler: loading and warm-up stop at their next step.
        self.stop_requested = threading.Event() if stop_requested is None else stop_requested
        self.params = node_parameters.declare(self, command_line)
        self.exit_code = 0
        self.dds_profile = None         # the Fast DDS profile main() applied, if any
        self.finished = threading.Event()
        self.info = GenerationInfo(state='unconfigured')
        self.monitor = DiagnosticsMonitor(
            period_s=self.params['diagnostics_period_s'],
            warn_fraction=self.params['pool_warn_fraction'], node_name=self.get_name(),
            power_reader=read_power_state)
        self._diag_lock = threading.Lock()
        self.refusals = RefusalLimiter()
        self._load_started = self._last_load_log = time.monotonic()
        self._next_request_id = 1
        self.pub_response = self._publisher(String, contract.RESPONSE)
        self.pub_stream = self._publisher(String, contract.STREAM)
        self.pub_info = self._publisher(String, contract.INFO)
        self.pub_error = self._publisher(String, contract.ERROR)
        self.pub_ready = self._publisher(Bool, contract.READY)
        self.pub_diag = self._publisher(DiagnosticArray, contract.DIAGNOSTICS)
        self.intake = ImageIntake(self)
        self.worker = Worker(self)
        self._open_services = []        # from activate to deactivate
        self.create_subscription(String, contract.PROMPT.name, self._on_prompt,
                                 contract.PROMPT.qos())
        self.create_subscription(String, contract.PROMPT_JSON.name, self._on_prompt_json,
                                 contract.PROMPT_JSON.qos())
        self.add_on_set_parameters_callback(lambda params: node_parameters.on_set(self, params))
        self.create_timer(self.params['diagnostics_period_s'], self._on_idle_timer)
        self.create_timer(1.0, self.intake.check_camera)
        self.pub_ready.publish(Bool(data=False))
        self._log_handler = _RosLogHandler(self.get_logger())
        node_parameters.check_camera_topics(self, self.params['image_topics'],
                                       self._activation_services())

    def _activation_services(self):
        """The services activation opens: name -> callback."""
        return {contract.RESET: self._on_reset, contract.CANCEL: self._on_cancel}

    def _publisher(self, msg_type, topic):
        return self.create_publisher(msg_type, topic.name, topic.qos())

    def runtime(self, name):
        """The current value of a run-time parameter."""
        return self.get_parameter(name).value

    # ---- publishing (any thread) -----------------------------------------------------------

    def _publish(self, pub, msg):
        try:
            pub.publish(msg)
        except Exception as exc:  # noqa: BLE001 - shutting down: the context may be gone
            if not self.finished.is_set() and rclpy.ok(context=self.context):
                self.get_logger().error(f'publishing on {pub.topic_name} failed: {exc}')

    def publish_stream(self, delta):
        """A text delta on ``response/stream``."""
        self._publish(self.pub_stream, String(data=delta))

    def publish_response(self, text):
        """A whole answer on ``response``."""
        self._publish(self.pub_response, String(data=text))

    def publish_info(self, info):
        """One ``response/info`` (a :class:`~orin_llm_node.ros.contract.AnswerInfo`)."""
        self._publish(self.pub_info, String(data=info.to_json()))

    def publish_error(self, text):
        """Why something was refused, on ``error`` and in the log."""
        self.get_logger().warning(text)
        self._publish(self.pub_error, String(data=text))

    def refuse_image(self, topic, exc, consequence=''):
        """Count an unusable image (``exc``: an ImageConversionError) and say why on ``error``.

        At most once a second per topic and kind of fault; the others are only counted.
        """
        self.info.add(errors=1, rejected_images=1)
        said, held_back = self.refusals.admit(topic, exc.kind, time.monotonic())
        if not said:
            self.info.add(unsaid_errors=1)
            return
        more = f' ({held_back} more like it not repeated)' if held_back else ''
        self.publish_error(f'image on {topic} rejected: {clip(exc, REASON_CHARS)}{consequence}'
                           f'{more}')

    def diagnostics(self, pool_stats=None, queue_depth=None, force=False, only_if_due=False):
        """Publish /diagnostics if due (or ``force``); ``pool_stats`` only from the worker."""
        now = time.monotonic()
        if only_if_due and self.monitor.seconds_until_due(now) > 0:
            return
        if queue_depth is not None:
            self.info.update(queue_depth=queue_depth)
        with self._diag_lock:
            statuses = self.monitor.update(now, pool_stats, self.info, force=force)
        if statuses:
            msg = DiagnosticArray()
            msg.header.stamp = self.get_clock().now().to_msg()
            msg.status = statuses
            self._publish(self.pub_diag, msg)

    def _on_idle_timer(self):
        # Without an engine the worker cannot publish diagnostics: say what state we are in.
        if self.worker.engine is not None:
            return
        now = time.monotonic()
        if self.info.snapshot().state == 'loading':
            elapsed = now - self._load_started
            self.info.update(detail=f'loading model ({elapsed:.0f} s)')
            if now - self._last_load_log >= 10.0:
                self._last_load_log = now
                self.get_logger().info(f'still loading the model ({elapsed:.0f} s)...')
        self.diagnostics()

    # ---- prompts and services (executor) ---------------------------------------------------

    def _refuse(self, request_id, text, reason, tag=None, cameras=None):
        """Tell the sender (on ``error`` and ``response/info``) why its prompt is not answered.

        ``cameras``: what the cameras gave it (a clip refused), as ``response/info`` says it.
        """
        reason = clip(reason, REASON_CHARS)
        self.publish_error(f'request {request_id}: {reason}')
        self.publish_info(AnswerInfo.refused(request_id, text, reason, tag, cameras))

    def _on_prompt(self, msg):
        request_id = self._next_request_id
        self._next_request_id += 1
        self._enqueue(request_id, msg.data)

    def _on_prompt_json(self, msg):
        """A ``prompt/json`` request envelope (request_envelope.py): checked, then queued."""
        request_id = self._next_request_id
        self._next_request_id += 1
        try:
            envelope = parse_envelope(msg.data)
        except EnvelopeError as exc:
            self._refuse(request_id, None, f'prompt/json refused: {exc}', exc.tag)
            return
        self._enqueue(request_id, envelope.pop('prompt'), envelope)

    def _enqueue(self, request_id, text, envelope=None):
        """Check a prompt, pair it with the cameras' frames (or clips) and queue it.

        ``envelope``: the checked keys of a ``prompt/json`` request; its ``video_s`` asks for
        a clip (plain prompts: the ``video_window_s`` parameter).
        """
        tag = (envelope or {}).get('tag')
        if not text.strip():
            self._refuse(request_id, text, 'empty prompt ignored', tag)
            return
        if len(text) > parameters.MAX_PROMPT_CHARS:
            self._refuse(request_id, text[:200], f'prompt of {len(text)} characters rejected '
                         f'(limit {parameters.MAX_PROMPT_CHARS})', tag)
            return
        state = self.info.snapshot().state
        if state != 'ready':
            why = _NOT_READY.get(state, 'it is not taking prompts')
            self._refuse(request_id, text, f'node is {state}: {why}', tag)
            return
        video_s = (envelope or {}).get('video_s', self.runtime('video_window_s'))
        if video_s > self.params['video_buffer_s']:
            self._refuse(request_id, text, f'a clip of {video_s:g} s asked for, but each camera '
                         f"keeps {self.params['video_buffer_s']:g} s (video_buffer_s)", tag)
            return
        now = self.get_clock().now().nanoseconds
        views, synchronised = self.intake.take(now, self.params['image_max_age_s'], video_s)
        request = Request(request_id, text, views, now, synchronised, video_s, envelope)
        missing = '; '.join(f'{v.name}: {v.missing}' for v in views if v.missing)
        if video_s > 0 and all(v.missing for v in views):
            self._refuse(request_id, text, f'a clip of the last {video_s:g} s has zero frames '
                         f'({missing})', tag, camera_report(request))
            return
        if missing:
            self.get_logger().info(f'{missing}: the prompt is answered without '
                                   + ('these cameras' if len(views) > 1 else 'an image'))
        capacity = self.params['queue_size']
        dropped = self.worker.submit(request, capacity)
        self.info.update(queue_depth=self.worker.queue_depth())
        if dropped is not None:
            self.info.add(dropped_prompts=1)
            self._refuse(dropped.request_id, dropped.text,
                         f"queue full (queue_size {capacity}): dropped the oldest prompt "
                         f"'{preview(dropped.text)}'", (dropped.envelope or {}).get('tag'))

    def _on_reset(self, request, response):
        del request
        cancelled = self.worker.cancel()
        self.worker.request_reset()
        response.success = True
        response.message = 'conversation reset' + (
            ' (generation in progress cancelled)' if cancelled else '')
        return response

    def _on_cancel(self, request, response):
        del request
        response.success = self.worker.cancel()
        response.message = ('generation cancelled' if response.success
                            else 'no generation in progress')
        return response

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self):
        """Start the worker thread; the plain node also configures and activates itself."""
        logging.getLogger('orin_llm_node').addHandler(self._log_handler)
        self.worker.thread.start()
        if not self.managed:
            threading.Thread(target=self._autostart, name='orin_llm_autostart',
                             daemon=True).start()

    def _autostart(self):
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def stop(self, timeout_s):
        """Stop the worker (cancelling a generation in progress); True if it has stopped."""
        self.finished.set()
        stopped = self.worker.stop(timeout_s)
        logging.getLogger('orin_llm_node').removeHandler(self._log_handler)
        return stopped

    def on_configure(self, state):
        """Load the weights, warm up and capture graphs."""
        self._load_started = self._last_load_log = time.monotonic()
        self.info.update(state='loading', detail='loading model')
        self.diagnostics(force=True)
        if not self.worker.call('load'):
            if self.finished.is_set() or self.stop_requested.is_set():
                return TransitionCallbackReturn.FAILURE
            return self._failed(f'failed to load the model: {self.worker.load_error}',
                                'unconfigured')
        self.info.update(state='inactive', detail='')
        self.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def _failed(self, text, state):
        """A transition failed: the plain node ends (FATAL, exit code 1), a managed one says why.

        ``state``: where a managed node stays (the plain node's state is ``failed``).
        """
        if not self.managed:
            self.get_logger().fatal(text)
            self.info.update(state='failed', detail=text)
            self.exit_code = 1
            self.diagnostics(force=True)
            rclpy.try_shutdown(context=self.context)
            return TransitionCallbackReturn.FAILURE
        self.get_logger().error(text)
        self.info.update(state=state, detail=text)
        self.publish_error(text)
        self.diagnostics(force=True)
        return TransitionCallbackReturn.FAILURE

    def _close_inputs(self):
        self.intake.unsubscribe()
        for srv in self._open_services:
            self.destroy_service(srv)
        self._open_services = []

    def on_activate(self, state):
        """Open the image subscriptions and the services; ``ready`` turns true."""
        try:
            self.intake.subscribe(self.params['image_qos'], self.worker.frame_processor())
            for name, callback in self._activation_services().items():
                self._open_services.append(self.create_service(Trigger, name, callback))
        except Exception as exc:  # noqa: BLE001 - rclpy's lifecycle would swallow it unsaid
            self._close_inputs()
            return self._failed(f'failed to activate: {exc}', 'inactive')
        self.info.update(state='ready', detail='')
        self._publish(self.pub_ready, Bool(data=True))
        self.get_logger().info('ready: publish a prompt on '
                               f"{self.resolve_topic_name('prompt')}")
        self.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state):
        """Stop taking prompts: cancel the answer in flight, refuse the queued ones."""
        self.info.update(state='inactive')
        self._publish(self.pub_ready, Bool(data=False))
        self._close_inputs()
        for request in self.worker.drain():
            self._refuse(request.request_id, request.text, 'node deactivated',
                         (request.envelope or {}).get('tag'))
        self.publish_error('deactivated: prompts are refused until the node is activated')
        self.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state):
        """Free the engine (weights, KV pool, graphs)."""
        self.worker.call('unload')
        self.info.update(state='unconfigured', detail='')
        self.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state):
        """From any state: stop answering; main() then stops the worker and exits 0."""
        self.info.update(state='finalized')
        self._publish(self.pub_ready, Bool(data=False))
        self.worker.cancel()
        self.finished.set()
        return TransitionCallbackReturn.SUCCESS
