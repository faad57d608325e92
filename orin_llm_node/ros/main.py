# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_node``: run the node until Ctrl-C, SIGTERM, a fatal error or ``shutdown``.

    orin_llm_node [--managed] --ros-args -p model_path:=/models/Qwen3-VL-2B-Instruct

``--managed`` starts a lifecycle node that waits for ``ros2 lifecycle set <node> configure``;
without it the node configures and activates itself.  Exit status: 0 after a signal or the
``shutdown`` transition (a second signal changes nothing), 1 when the model cannot be loaded
or the node cannot activate (one FATAL line), 2 for an invalid parameter (one line naming it;
camera names that are the node's own topics or services included).  After a signal the
process is gone within about a second in every state (bench/signal_exit.py measures it).
The node is spun by a multi-threaded executor (its callback groups: node.py), so its lifecycle
and parameter services, timers and prompts are served while ``configure`` loads a model.
"""

import logging
import os
import signal
import sys
import threading

# One thread per callback group of the node (lifecycle, parameters, prompts, cameras,
# diagnostics) and one spare: a configure that loads for a minute holds one of them.
EXECUTOR_THREADS = 6
# glibc malloc arenas for the whole process (the main thread's and one that every other thread
# shares): a frame decoded on any executor thread leaves its freed pages in one place.
MALLOC_ARENAS = 2


def main(args=None):
    """Entry point of the ``orin_llm_node`` executable: runs the node, then ends the process.

    The process ends with ``os._exit`` once the node is torn down and rclpy is shut down (ROS
    logging finalized with it; Python's logging and the standard streams are flushed): the
    interpreter's own finalization (torch, the DDS library's static objects) took 3-8 s on a
    busy CPU after every Ctrl-C, and nothing is left that needs it.
    """
    _hard_exit(_run(args))


def _run(args):
    # Ctrl-C and SIGTERM only set a flag, from before anything heavy is imported to the end;
    # the main thread polls it between short spins, so a signal can never land inside a DDS
    # call and teardown always starts.  Before the node has started (importing torch and
    # checking the parameters takes seconds on a busy CPU, and nothing is loaded or answered
    # yet) a signal ends the process at once: the first poll would be seconds away.
    stop = threading.Event()
    starting = threading.Event()
    starting.set()

    def on_signal(*_):
        stop.set()
        if starting.is_set():
            _hard_exit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    from orin_llm_node.ros import dds_profile, native_heap
    # Before any thread allocates (DDS, the executor's, torch's): see native_heap.py.  An
    # operator's own MALLOC_ARENA_MAX (glibc reads it at start-up) is left to stand.
    if 'MALLOC_ARENA_MAX' not in os.environ:
        native_heap.limit_arenas(MALLOC_ARENAS)
    # Before the DDS participant exists (rclpy.init): large camera frames must reach us.
    profile = dds_profile.apply()

    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions
    from rclpy.utilities import remove_ros_args

    from orin_llm_node.parameters import ParameterError
    from orin_llm_node.ros.node import NODE_NAME, OrinLLMNode

    argv = sys.argv if args is None else ['orin_llm_node', *args]
    try:
        managed = '--managed' in remove_ros_args(argv)[1:]
        rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as exc:     # rcl refuses the ROS arguments: one line, as a parameter
        rclpy.logging.get_logger(NODE_NAME).fatal(f'invalid ROS arguments: {exc}')
        return 2
    node = executor = None
    code = 0
    try:
        node = OrinLLMNode(managed=managed, stop_requested=stop, command_line=argv)
        node.dds_profile = profile
        if profile:
            node.get_logger().info(f'Fast DDS profile {profile} applied (camera frames over '
                                   'UDP; set FASTDDS_DEFAULT_PROFILES_FILE to use your own)')
        executor = MultiThreadedExecutor(num_threads=EXECUTOR_THREADS)
        executor.add_node(node)
        node.start()
        starting.clear()
        while not stop.is_set() and not node.finished.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    except (ParameterError, ParameterException) as exc:    # rclpy's: e.g. use_sim_time:=abc
        rclpy.logging.get_logger(NODE_NAME).fatal(str(exc))
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        starting.clear()
        # From here a further signal changes nothing. Ignored, not left to our handler: at
        # interpreter exit Python puts the default action back on signals it handles, and a
        # second Ctrl-C during the DDS teardown that follows would end us with -SIGINT.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        code = code or (node.exit_code if node is not None else 0)
        # Teardown is bounded: a session stuck in one long call (e.g. still loading weights) or
        # a middleware teardown that blocks must not keep the process alive after a signal.
        watchdog = threading.Timer(15.0, _hard_exit, args=(code,))
        watchdog.daemon = True
        watchdog.start()
        if node is not None:
            # Loading and warm-up stop at their next shard, tensor or warm-up step once `stop`
            # is set; one step that still runs long (an import, a huge tensor) must not hold the
            # process: nothing is being answered yet, so it ends at once after a second.
            loading = node.state() == 'loading'
            if not node.stop(timeout_s=1.0 if loading else 10.0):
                _hard_exit(code)
            code = code or node.exit_code
            if executor is not None:
                # Transitions still in a callback end within a poll of the session (0.1 s).
                executor.shutdown(timeout_sec=1.0)
            node.destroy_node()
        rclpy.try_shutdown()
        watchdog.cancel()
    return code


def _hard_exit(code):
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == '__main__':
    main()
