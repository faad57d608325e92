# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The long-lived processes a test starts (servers, nodes), ended with the run however it ends.

:func:`spawn` starts each in a process group of its own (a Ctrl-C in the terminal reaches
pytest alone, whose fixtures then stop them in order) and records it. A finalizer ends every
recorded process still running: at interpreter exit, and on SIGTERM or SIGHUP of the pytest
process (a CI job killed, a terminal closed), which end Python at once without running a
fixture's finalizer. :func:`install` (conftest.py) sets it up; the signal is then raised again
with its default action, so pytest still dies of it.
"""

import atexit
import os
import signal
import subprocess

__all__ = ['end_all', 'install', 'spawn']

#: Seconds a process gets to exit on SIGTERM before its group is killed.
GRACE_S = 3.0

_live: dict[int, subprocess.Popen] = {}
_owner = os.getpid()


def spawn(cmd, **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, ...)`` in a new session (its own process group), recorded."""
    for pid in [pid for pid, proc in _live.items() if proc.poll() is not None]:
        del _live[pid]
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    _live[proc.pid] = proc
    return proc


def end_all() -> None:
    """SIGTERM to every recorded process still running, then SIGKILL to their groups."""
    if os.getpid() != _owner:  # a forked child of the test run: not its processes
        return
    running = [p for p in _live.values() if p.poll() is None]  # unreaped: the pid is theirs
    for proc in running:
        _signal_group(proc, signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc, signum) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _on_signal(signum, frame):
    end_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install() -> None:
    """End the recorded processes at exit and on SIGTERM / SIGHUP (from the main thread)."""
    atexit.register(end_all)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)
