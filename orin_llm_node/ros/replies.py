# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The port through which the session (session.py) talks to the world: :class:`Replies`.

The session knows the node only through this port and its settings; the node implements it
over its publishers (node_replies.py), the session's in-process tests with a recorder.  Every
method may be called from the session's thread; none blocks on the executor.
"""

from typing import Protocol


class Replies(Protocol):
    """What the session says, and to whom (the node's topics, its facts, its log)."""

    #: A logger with ``debug``, ``info``, ``warning`` and ``error`` (one line each).
    logger: object

    def stream(self, delta):
        """A text delta of the answer being decoded (``response/stream``)."""

    def answer(self, text):
        """A whole answer (``response``)."""

    def info(self, info):
        """What one prompt got: a :class:`~orin_llm_node.ros.contract.AnswerInfo`."""

    def error(self, text):
        """Why something was refused or failed (``error`` and the log)."""

    def count(self, **counts):
        """Add to the node's counters (``errors=1``, ``requests=1``; see NodeFacts)."""

    def facts(self, **values):
        """Set facts of the last answer (``last_ttft_ms``, ...; see NodeFacts)."""

    def diagnostics(self, pool_stats, queue_depth, force=False, only_if_due=False,
                    backend_stats=None):
        """Publish ``/diagnostics`` with the pool's statistics if due (or ``force``).

        A node on a server passes no pool, its ``BackendStats`` as ``backend_stats``.

        Returns the seconds until the next periodic publication is due.
        """

    def frame_rejected(self, view, exc):
        """The frame ``view.image`` could not be decoded (``exc``: an ImageConversionError).

        The node stops pairing it with prompts and says why; the prompt goes on without it.
        """

    def detections(self, per_camera):
        """A detect request's boxes per camera, ``[(frame header, entries)]`` (``detections``)."""
