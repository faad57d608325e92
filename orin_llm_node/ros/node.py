# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 node ``orin_llm``: its publishers, services, lifecycle and prompt intake.

Threading: callbacks run on the executor and only check headers, remember the newest image
(:mod:`~orin_llm_node.ros.cameras.intake`) and queue prompts; **one session thread owns the
engine** (:mod:`~orin_llm_node.ros.session`: loading, warm-up, graph capture, answers), which
speaks through the node's :class:`~orin_llm_node.ros.node_replies.NodeReplies`.
docs/architecture.md draws the whole picture.
"""

import logging
import threading
import time

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNodeMixin, TransitionCallbackReturn
from rclpy.node import Node
from std_msgs.msg import String
from std_srvs.srv import Trigger

from orin_llm_node import parameters
from orin_llm_node.ros import contract, node_parameters
from orin_llm_node.ros.ask_server import AskServer
from orin_llm_node.ros.callback_guard import GuardedCallbacks
from orin_llm_node.ros.cameras.intake import ImageIntake
from orin_llm_node.ros.node_replies import NodeReplies, RosLogHandler
from orin_llm_node.ros.prompts import PromptIntake
from orin_llm_node.ros.session import LoadFailed, Session

NODE_NAME = 'orin_llm'


class OrinLLMNode(GuardedCallbacks, LifecycleNodeMixin, Node):
    """Qwen3-VL node: see the README for its topics, services and parameters.

    A managed (lifecycle) node: ``configure`` loads the weights, warms up and captures graphs
    (on the session's thread), ``activate`` opens the image subscriptions and the services,
    ``deactivate`` cancels the answer in flight and refuses the queued prompts, ``cleanup``
    frees the engine, ``shutdown`` ends the process.  The prompt subscription lives as long as
    the node, so that every prompt gets one ``response/info`` in every state: answered while
    active, refused with the state as the reason otherwise.
    Unless ``managed``, :meth:`start` runs configure and activate at once (the plain node).
    No callback it registers can end the process (callback_guard.py).

    Spun by a multi-threaded executor (main.py), its callbacks in groups that never wait for
    each other: the lifecycle services (reentrant: ``get_state`` answers while ``configure``
    loads a model), prompts and their services, cameras, the diagnostics timer; rclpy's
    parameter services keep the node's default group to themselves.  ``command_line``: the
    process's arguments, whose ``-p`` overrides are checked on their own
    (:func:`~orin_llm_node.ros.node_parameters.declare`).
    """

    def __init__(self, managed=False, stop_requested=None, command_line=(), **kwargs):
        # What rclpy's LifecycleNode does, with the lifecycle services in a group of their
        # own (its constructor does not pass the group on, in Humble as in Kilted).
        self._lifecycle_group = ReentrantCallbackGroup()
        Node.__init__(self, NODE_NAME, **kwargs)
        LifecycleNodeMixin.__init__(self, callback_group=self._lifecycle_group)
        self._prompt_group = MutuallyExclusiveCallbackGroup()   # prompts, reset, cancel
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self.managed = managed
        # Set by main's signal handler: loading and warm-up stop at their next step.
        self.stop_requested = threading.Event() if stop_requested is None else stop_requested
        self.params = node_parameters.declare(self, command_line, kwargs)
        self.exit_code = 0
        self.dds_profile = None         # the Fast DDS profile main() applied, if any
        self.finished = threading.Event()
        self.replies = NodeReplies(self, self.params)
        self.engine_facts = None        # the loaded engine's EngineFacts, configure to cleanup
        self._load_started = self._last_load_log = time.monotonic()
        self.intake = ImageIntake(self, MutuallyExclusiveCallbackGroup())
        self.replies.intake = self.intake
        self.session = Session(self.replies, self.settings, self.stop_requested.is_set)
        self._open_services = []        # from activate to deactivate
        self.prompts = PromptIntake(self)
        self.ask = AskServer(self)      # the ask action, beside the prompt topics
        for topic, callback in ((contract.PROMPT, self.prompts.on_prompt),
                                (contract.PROMPT_JSON, self.prompts.on_prompt_json)):
            self.create_subscription(String, topic.name, callback, topic.qos(),
                                     callback_group=self._prompt_group)
        self.add_on_set_parameters_callback(lambda params: node_parameters.on_set(self, params))
        self.create_timer(self.params['diagnostics_period_s'], self._on_idle_timer,
                          callback_group=self._timer_group)
        self.create_timer(1.0, self.intake.check_camera,
                          callback_group=self.intake.callback_group)
        self._autostart_timer = None    # the plain node's configure + activate, once
        self._autostart_lock = threading.Lock()
        self.replies.ready(False)
        self._log_handler = RosLogHandler(self.get_logger())
        node_parameters.check_camera_topics(self, self.params['image_topics'],
                                            self._activation_services())

    def _activation_services(self):
        """The services activation opens: name -> callback."""
        return {contract.RESET: self._on_reset, contract.CANCEL: self._on_cancel}

    def runtime(self, name):
        """The current value of a run-time parameter."""
        return self.get_parameter(name).value

    def settings(self):
        """Every parameter's value now: the start-up values, the run-time ones as last set."""
        return {**self.params,
                **{name: self.runtime(name) for name in parameters.RUNTIME_PARAMETERS}}

    def state(self):
        """The node's state: unconfigured, loading, inactive, active, failed or finalized."""
        return self.replies.node_facts.snapshot().state

    def _on_idle_timer(self):
        # Without an engine the session publishes no diagnostics: say what state we are in.
        if self.engine_facts is not None:
            return
        now = time.monotonic()
        if self.state() == 'loading':
            elapsed = now - self._load_started
            self.replies.facts(detail=f'loading model ({elapsed:.0f} s)')
            if now - self._last_load_log >= 10.0:
                self._last_load_log = now
                self.get_logger().info(f'still loading the model ({elapsed:.0f} s)...')
        self.replies.diagnostics()

    # ---- services (executor) ------------------------------------------------------------

    def _on_reset(self, request, response):
        del request
        cancelled = self.session.cancel()
        self.session.request_reset()
        response.success = True
        response.message = 'conversation reset' + (
            ' (generation in progress cancelled)' if cancelled else '')
        return response

    def _on_cancel(self, request, response):
        del request
        response.success = self.session.cancel()
        response.message = ('generation cancelled' if response.success
                            else 'no generation in progress')
        return response

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self):
        """Start the session's thread; the plain node also configures and activates itself.

        The plain node's transitions run from a one-shot timer in the lifecycle group, on the
        executor like those a manager asks for, so that loading never holds up a callback.
        """
        logging.getLogger('orin_llm_node').addHandler(self._log_handler)
        self.session.start()
        if not self.managed:
            self._autostart_timer = self.create_timer(0.01, self._autostart,
                                                      callback_group=self._lifecycle_group)

    def _autostart(self):
        with self._autostart_lock:      # reentrant group: a second tick may already run
            timer, self._autostart_timer = self._autostart_timer, None
        if timer is None:
            return
        timer.cancel()
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def stop(self, timeout_s):
        """Stop the session (cancelling a generation); True if it has stopped."""
        self.finished.set()
        self.replies.closing()
        stopped = self.session.stop(timeout_s)
        logging.getLogger('orin_llm_node').removeHandler(self._log_handler)
        return stopped

    def on_configure(self, state):
        """Load the weights, warm up and capture graphs."""
        self._load_started = self._last_load_log = time.monotonic()
        self.replies.facts(state='loading', detail='loading model')
        self.replies.diagnostics(force=True)
        try:
            facts = self.session.load()
        except LoadFailed as exc:
            facts = None
            if not self._stopping():
                return self._failed(f'failed to load the model: {exc}', 'unconfigured')
        if facts is None:               # a signal: the process is ending
            return TransitionCallbackReturn.FAILURE
        self.engine_facts = facts
        self.replies.engine_loaded(facts)
        self.replies.facts(state='inactive', detail='')
        self.replies.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def _stopping(self):
        return self.finished.is_set() or self.stop_requested.is_set()

    def _failed(self, text, state):
        """A transition failed: the plain node ends (FATAL, exit code 1), a managed one says why.

        ``state``: where a managed node stays (the plain node's state is ``failed``).
        """
        if not self.managed:
            self.get_logger().fatal(text)
            self.replies.facts(state='failed', detail=text)
            self.exit_code = 1
            self.replies.diagnostics(force=True)
            rclpy.try_shutdown(context=self.context)
            return TransitionCallbackReturn.FAILURE
        self.get_logger().error(text)
        self.replies.facts(state=state, detail=text)
        self.replies.error(text)
        self.replies.diagnostics(force=True)
        return TransitionCallbackReturn.FAILURE

    def _close_inputs(self):
        self.intake.unsubscribe()
        for srv in self._open_services:
            self.destroy_service(srv)
        self._open_services = []

    def on_activate(self, state):
        """Open the image subscriptions and the services; ``ready`` turns true."""
        try:
            self.intake.subscribe(self.params['image_qos'], self.engine_facts.frame_sizer)
            for name, callback in self._activation_services().items():
                self._open_services.append(self.create_service(
                    Trigger, name, callback, qos_profile=contract.request_qos(),
                    callback_group=self._prompt_group))
        except Exception as exc:  # noqa: BLE001 - rclpy's lifecycle would swallow it unsaid
            self._close_inputs()
            return self._failed(f'failed to activate: {exc}', 'inactive')
        self.replies.facts(state='active', detail='')
        self.replies.ready(True)
        self.get_logger().info('ready: publish a prompt on '
                               f'{self.resolve_topic_name(contract.PROMPT.name)}')
        self.replies.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state):
        """Stop taking prompts: cancel the answer in flight, refuse the queued ones."""
        self.replies.facts(state='inactive')
        self.replies.ready(False)
        self._close_inputs()
        self.ask.stop_all('node deactivated')
        for request in self.session.drain():
            self.prompts.refuse_queued(request, 'node deactivated')
        self.replies.error('deactivated: prompts are refused until the node is activated')
        self.replies.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state):
        """Free the engine (weights, KV pool, graphs)."""
        self.session.unload()
        self.engine_facts = None
        self.replies.facts(state='unconfigured', detail='')
        self.replies.diagnostics(force=True)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state):
        """From any state: stop answering; main() then stops the session and exits 0."""
        self.replies.facts(state='finalized')
        self.replies.ready(False)
        self.ask.stop_all('node shutting down')
        self.session.cancel()
        self.finished.set()
        self.replies.closing()
        return TransitionCallbackReturn.SUCCESS
