# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Sets of camera frames whose header stamps lie within ``slop`` of each other.

The policy is message_filters' ``ApproximateTimeSynchronizer`` (the Python one of ROS 2), so a
node pairs frames the way any other ROS tool would; message_filters is not on PyPI, so the
policy is restated here, without rclpy (stamps are integer nanoseconds):

* each camera keeps a queue of its ``queue_size`` newest frames, keyed by stamp (a second frame
  with the same stamp replaces the first; the oldest stamp goes when the queue overflows, and
  when that is the arriving frame itself, a late one, it is dropped: no set);
* when a frame arrives, every *other* camera's frames within ``slop`` of its stamp are the
  candidates, nearest first; a camera with no candidate means no set;
* the candidates' combinations are tried in that order (the product of the nearest-first lists)
  and the first whose stamps span strictly less than ``slop`` is the set: it is emitted and its
  frames leave every queue.

Pure Python, not thread-safe: the caller holds its own lock.
"""

import itertools


class ApproximateSync:
    """message_filters' approximate-time policy over ``num_inputs`` stamped streams."""

    def __init__(self, num_inputs, queue_size, slop_ns):
        if num_inputs < 1 or queue_size < 1 or slop_ns <= 0:
            raise ValueError(f'need num_inputs >= 1, queue_size >= 1, slop_ns > 0; got '
                             f'{num_inputs}, {queue_size}, {slop_ns}')
        self.queue_size = queue_size
        self.slop_ns = slop_ns
        self.queues = [{} for _ in range(num_inputs)]

    def add(self, index, stamp_ns, item):
        """Queue ``item`` (stamp ``stamp_ns``) of input ``index``; the set it completes, if any.

        Returns None or a tuple of ``(stamp_ns, item)``, one per input in input order.
        """
        queue = self.queues[index]
        queue[stamp_ns] = item
        while len(queue) > self.queue_size:
            del queue[min(queue)]
        if stamp_ns not in queue:
            # Older than every frame of a full queue: trimmed at once.  message_filters drops it
            # the same way (a set needs each of its stamps still queued).
            return None
        candidates = []
        for other, q in enumerate(self.queues):
            if other == index:
                continue
            near = sorted((s for s in q if abs(s - stamp_ns) <= self.slop_ns),
                          key=lambda s: abs(s - stamp_ns))
            if not near:
                return None
            candidates.append(near)
        for combo in itertools.product(*candidates):
            stamps = list(combo)
            stamps.insert(index, stamp_ns)
            if max(stamps) - min(stamps) < self.slop_ns:
                return tuple((s, q.pop(s)) for s, q in zip(stamps, self.queues, strict=True))
        return None

    def clear(self):
        """Forget every queued frame."""
        for q in self.queues:
            q.clear()
