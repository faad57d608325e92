# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Whether the node's log lines carry ANSI colour codes: only where they reach a terminal.

rcutils colours a line when its stream is a TTY and ``RCUTILS_COLORIZED_OUTPUT`` is unset.  The
launch file runs the node on a pseudo-terminal (``emulate_tty``: its lines come line-buffered,
in order), which always looks like one, so a launch redirected to a file wrote escape codes into
it.  The launch file therefore passes the node :func:`colour_env` of its own output.  Imports
nothing of the package (the launch file reads it before any node exists).
"""

VARIABLE = 'RCUTILS_COLORIZED_OUTPUT'


def colour_env(to_terminal, environ):
    """The variables the node needs: colour exactly when ``to_terminal`` (a stream's isatty).

    ``environ``: the launch's environment; an operator's own ``RCUTILS_COLORIZED_OUTPUT`` stands
    (nothing is added).
    """
    if VARIABLE in environ:
        return {}
    return {VARIABLE: '1' if to_terminal else '0'}
