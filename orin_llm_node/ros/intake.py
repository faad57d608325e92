# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Camera images in: subscriptions, checks on arrival, the newest image, and blindness.

Runs on the executor (callbacks and a 1 s timer); the worker only reads the newest image through
:meth:`ImageIntake.take` and drops one it could not decode with :meth:`ImageIntake.forget`, both
under the intake's lock.
"""

from dataclasses import dataclass
import math
import threading
import time

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from orin_llm_node.ros import ros_image
from orin_llm_node.ros.refusals import clip

try:                                    # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:                     # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

# A camera publisher matched and no frame for this long: the node says it is blind.
BLIND_AFTER_S = 5.0
# Header stamps further ahead of our clock than this are refused (clock skew, bad drivers).
FUTURE_TOLERANCE_S = 1.0
# A frame_id is repeated in response/info cut to this length (it is the sender's text).
FRAME_ID_CHARS = 128


@dataclass
class PendingImage:
    """The newest image as received (decoded on the worker only if a prompt takes it)."""

    msg: object
    compressed: bool
    stamp_ns: int               # header stamp, else receive time (ROS clock)
    stamped: bool

    def describe(self):
        """The image as named in ``response/info``: its header stamp and frame_id."""
        return {'stamp': {'sec': self.msg.header.stamp.sec,
                          'nanosec': self.msg.header.stamp.nanosec},
                'frame_id': clip(self.msg.header.frame_id, FRAME_ID_CHARS),
                'stamped': self.stamped}


@dataclass
class Request:
    """One queued prompt and the image paired with it when it arrived."""

    request_id: int
    text: str
    image: PendingImage | None
    received_ns: int
    no_image: str = ''          # why no image is paired (said in response/info)


class ImageIntake:
    """The image subscriptions of ``node`` and what arrived on them."""

    def __init__(self, node):
        self.node = node
        self.subscriptions = []
        self._lock = threading.Lock()
        self._newest = None
        self._last_frame_at = None      # monotonic time of the last image that arrived
        self._publishers_since = None   # since when a camera publisher has been matched

    def subscribe(self, mode):
        """Open the image subscriptions, per ``image_qos`` (``mode``).

        Measured (bench/image_delivery.py): a best-effort subscription matches every publisher
        but under Fast DDS gets large frames only if they come over UDP (the node's own DDS
        profile, see dds_profile.py); a reliable one matches only reliable publishers and gets
        every frame from them whatever the transport.  ``auto`` has both: the newest frame from
        either wins, and the reliable twin stays quiet about best-effort publishers it cannot
        match.
        """
        kinds = (('image', Image, False), ('image/compressed', CompressedImage, True))
        for reliable in {'auto': (False, True), 'best_effort': (False,),
                         'reliable': (True,)}[mode]:
            extra = {}
            if mode == 'auto' and reliable:
                extra['event_callbacks'] = SubscriptionEventCallbacks(
                    incompatible_qos=lambda _event: None)
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                             reliability=ReliabilityPolicy.RELIABLE if reliable
                             else ReliabilityPolicy.BEST_EFFORT)
            for topic, msg_type, compressed in kinds:
                self.subscriptions.append(self.node.create_subscription(
                    msg_type, topic, lambda msg, c=compressed: self._accept(msg, c), qos,
                    **extra))

    def unsubscribe(self):
        """Close the image subscriptions and forget the newest image."""
        for sub in self.subscriptions:
            self.node.destroy_subscription(sub)
        self.subscriptions = []
        with self._lock:
            self._newest = None

    def topics(self):
        """The resolved (namespaced, remapped) image topic names."""
        return sorted({sub.topic_name for sub in self.subscriptions})

    def take(self, now_ns, max_age_s):
        """The newest image if fresh enough, else (None, why not)."""
        with self._lock:
            image = self._newest
        if image is None:
            return None, 'no image received yet'
        age = (now_ns - image.stamp_ns) / 1e9
        if age > max_age_s:
            return None, f'newest image is {age:.1f} s old (> image_max_age_s {max_age_s:g} s)'
        return image, ''

    def forget(self, pending):
        """Stop pairing ``pending`` with prompts (the worker could not decode it)."""
        with self._lock:
            if self._newest is pending:
                self._newest = None

    def _stamp_ns(self, header):
        stamp = header.stamp.sec * 1_000_000_000 + header.stamp.nanosec
        if stamp > 0:
            return stamp, True
        return self.node.get_clock().now().nanoseconds, False

    def _accept(self, msg, compressed):
        """Keep ``msg`` as the newest image if every check on its headers passes."""
        self._frame_arrived()
        stamp, stamped = self._stamp_ns(msg.header)
        try:
            # Headers only: every check the engine's image processor would make, and the size
            # of a compressed image from its header (never decoded here).
            (ros_image.check_compressed if compressed else ros_image.check_image)(msg)
            ahead = (stamp - self.node.get_clock().now().nanoseconds) / 1e9
            if ahead > FUTURE_TOLERANCE_S:
                raise ros_image.ImageConversionError(
                    f'stamp is {ahead:.1f} s in the future (clocks out of sync?)', 'future')
        except ros_image.ImageConversionError as exc:
            # Refused once, here: the prompts after it are answered text-only.
            with self._lock:
                self._newest = None
            self.node.refuse_image('image/compressed' if compressed else 'image', exc)
            return
        with self._lock:
            self._newest = PendingImage(msg, compressed, stamp, stamped)

    def _frame_arrived(self):
        self._last_frame_at = time.monotonic()
        if self.node.info.snapshot().camera:
            self.node.info.update(camera='')
            self.node.get_logger().info('camera frames are arriving again')

    def check_camera(self):
        """Say once (on ``error`` and in /diagnostics) when a camera is matched but blind."""
        topics = self.topics()
        publishers = sum(self.node.count_publishers(topic) for topic in topics)
        now = time.monotonic()
        if publishers == 0:
            self._publishers_since = None
            return
        if self._publishers_since is None:
            self._publishers_since = now
        since = max(self._publishers_since, self._last_frame_at or -math.inf)
        if self.node.info.snapshot().camera or now - since < BLIND_AFTER_S:
            return
        if self.node.dds_profile:
            fix = ('this node already takes its frames over UDP (its own Fast DDS profile): '
                   'check that the camera really publishes (ros2 topic hz), that '
                   'net.core.rmem_max is at least 4194304 (sysctl), or give the camera '
                   'config/fastdds_large_images.xml')
        else:
            fix = ('start the node without FASTDDS_DEFAULT_PROFILES_FILE/'
                   'FASTRTPS_DEFAULT_PROFILES_FILE so that it applies its own profile, give '
                   'the camera config/fastdds_large_images.xml, or publish reliable or on '
                   '<topic>/compressed')
        text = (f'blind: {publishers} publisher(s) on {" and ".join(topics)} but no frame '
                f'arrived for {now - since:.0f} s; large best-effort frames are lost by '
                f'Fast DDS shared memory (> 512 KB). Fix: {fix}')
        self.node.info.update(camera=text)
        self.node.publish_error(text)
