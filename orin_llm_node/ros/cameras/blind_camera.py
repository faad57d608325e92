# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Whether a camera is blind -- publishers on its topics, no frame arriving -- and what was seen.

Two stories look alike from the subscriber's side and have different fixes: frames that stopped
arriving from publishers that had been delivering (the camera stopped or stalled; the transport
had been working), and publishers none of whose frames ever arrived (lost on the way, or never
sent).  Only the second gets transport advice, fitted to what was seen: the publishers' QoS,
the node's ``image_qos`` and whether the node takes its frames over UDP (its own Fast DDS
profile, dds_profile.py).

Pure Python (no rclpy): intake.py reports each frame's arrival and, once a second, the
publishers on the camera's topics; it holds the lock and publishes what is said.
"""

from dataclasses import dataclass

# Publishers on a camera's topics and no frame for this long: the node says it is blind.
BLIND_AFTER_S = 5.0


def _size(nbytes):
    if nbytes < 1024:
        return f'{nbytes} bytes'
    return f'{nbytes / 1024:.0f} KB' if nbytes < 1024**2 else f'{nbytes / 1024**2:.1f} MB'


def _publishers(reliable):
    """'1 publisher (reliable)', '3 publishers (2 reliable, 1 best effort)'."""
    kinds = [f'{n} {kind}' for n, kind in ((sum(reliable), 'reliable'),
                                           (len(reliable) - sum(reliable), 'best effort')) if n]
    if len(kinds) == 1:
        kinds = [kinds[0].split(' ', 1)[1]]
    return f"{len(reliable)} publisher{'s' if len(reliable) > 1 else ''} ({', '.join(kinds)})"


def _never_arrived(reliable, image_qos, own_profile, topic):
    """Why a publisher's frames may never arrive, for the QoS seen; the fix."""
    best_effort = len(reliable) - sum(reliable)
    if best_effort and image_qos == 'reliable':
        return ("a best-effort publisher cannot match this node's reliable image subscriptions "
                '(image_qos reliable). Fix: set image_qos to auto or best_effort, or publish '
                'reliable')
    if not best_effort and image_qos != 'best_effort':
        return ('reliable frames are sent again until they arrive, whatever their size, so '
                f'the camera has published nothing since it matched: check that it runs '
                f'(ros2 topic hz {topic})')
    if own_profile:
        return ("its best-effort frames come over UDP (this node's own Fast DDS profile), "
                'where the large ones are lost when net.core.rmem_max is below 4194304, or it '
                f'publishes nothing. Check: ros2 topic hz {topic}; sysctl net.core.rmem_max; '
                'or give the camera config/fastdds_large_images.xml')
    return ('best-effort frames larger than 512 KB are lost by Fast DDS shared memory (or it '
            'publishes nothing). Fix: start the node without FASTDDS_DEFAULT_PROFILES_FILE/'
            'FASTRTPS_DEFAULT_PROFILES_FILE so that it applies its own profile, give the '
            'camera config/fastdds_large_images.xml, or publish reliable or on '
            '<topic>/compressed')


@dataclass
class BlindWatch:
    """One camera's frames and publishers over time; ``blind`` says why it is blind ('' if not)."""

    publishers_since: float | None = None   # since when publishers have been on its topics
    delivered: bool = False                 # a frame arrived while they were there
    last_frame_at: float | None = None      # monotonic time of the last frame
    last_frame_bytes: int = 0
    last_frame_topic: str = ''
    blind: str = ''

    def frame(self, now, nbytes, topic):
        """A frame of ``nbytes`` arrived on ``topic``; True when the camera was blind until now."""
        was_blind = bool(self.blind)
        self.last_frame_at, self.last_frame_bytes, self.last_frame_topic = now, nbytes, topic
        self.delivered, self.blind = True, ''
        return was_blind

    def check(self, now, publishers, image_qos, own_profile):
        """The text to say when the camera turns blind now (once), else None.

        ``publishers``: ``(topic, reliable)`` per publisher on the camera's topics (``reliable``:
        its QoS is); ``image_qos``: the node's parameter; ``own_profile``: the node applied its
        own Fast DDS profile (frames over UDP).
        """
        reliable = [r for _, r in publishers]
        if not reliable:
            self.publishers_since, self.delivered = None, False
            return None
        if self.publishers_since is None:
            self.publishers_since = now
        # Quiet since the last frame, or (none arrived from these publishers) since they came.
        since = self.last_frame_at if self.delivered else self.publishers_since
        if self.blind or now - since < BLIND_AFTER_S:
            return None
        there = _publishers(reliable)
        if self.delivered:
            self.blind = (
                f'blind: frames stopped arriving on {self.last_frame_topic} '
                f'{now - self.last_frame_at:.0f} s ago (the last of '
                f'{_size(self.last_frame_bytes)}) and {there} '
                f"{'are' if len(reliable) > 1 else 'is'} still there: the camera stopped "
                f'publishing or stalled (check: ros2 topic hz {self.last_frame_topic})')
        else:
            topics = sorted({topic for topic, _ in publishers})
            self.blind = (f'blind: {there} on {" and ".join(topics)} for {now - since:.0f} s '
                          'and none of its frames arrived: '
                          + _never_arrived(reliable, image_qos, own_profile, topics[0]))
        return self.blind
