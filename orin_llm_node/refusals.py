# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the node says when it refuses input: sender text cut short, and a bounded rate limit.

Anything a sender controls (a prompt, an image's encoding, format or frame_id) is cut with
:func:`clip` / :func:`preview` before it goes into an ``error`` message, a log line or
``response/info``, so a 100 KB encoding name costs a few dozen bytes there.  A
:class:`RefusalLimiter` lets one message per topic and kind of fault through per period and
counts the rest; its keys are the code's own fault kinds (never the reason text), and it keeps
at most ``max_keys`` of them.  Pure Python (no rclpy), so it is unit-tested on its own.
"""

from collections import OrderedDict
import threading

# Longest sender-controlled string repeated in a message (an encoding name, a format string).
ECHO_CHARS = 40
# Longest reason text published on ``error`` or logged for one refusal.
REASON_CHARS = 300


def preview(text, n=60):
    """``text`` on one line, cut to ``n`` characters."""
    text = ' '.join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + '...'


def clip(text, n=ECHO_CHARS):
    """``text`` cut to ``n`` characters (``...`` and the original length mark the cut)."""
    text = str(text)
    if len(text) <= n:
        return text
    return f'{text[:n]}... ({len(text)} characters)'


class RefusalLimiter:
    """At most one message per ``(topic, kind)`` per ``period_s``; the rest are counted.

    :meth:`admit` answers whether a refusal may be said now and how many of its kind were held
    back since it was last said.  Thread-safe (the executor and the session both refuse).
    """

    def __init__(self, period_s=1.0, max_keys=64):
        self.period_s = period_s
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._keys = OrderedDict()      # (topic, kind) -> [last said (monotonic s), held back]

    def admit(self, topic, kind, now):
        """Whether a refusal of ``kind`` on ``topic`` may be said at time ``now``.

        ``(True, held_back)``: say it, ``held_back`` of the same key were not said before it;
        ``(False, 0)``: only count it.
        """
        key = (topic, kind)
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now - entry[0] < self.period_s:
                entry[1] += 1
                return False, 0
            held_back = entry[1] if entry is not None else 0
            self._keys[key] = [now, 0]
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            return True, held_back
