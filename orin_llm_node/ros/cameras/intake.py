# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Camera images in: subscriptions, checks on arrival, newest frames, synchronised sets, video.

Per camera (parameter ``image_topics``): its subscriptions, the newest frame, its video ring
(frame_ring.py) and blindness (blind_camera.py); across cameras, the newest approximate-time set
(camera_sync.py); what a prompt gets from them is camera_views.py's records.

Runs on the executor (callbacks and a 1 s timer); prompts take their frames here on the
executor too (:meth:`ImageIntake.take`), and the session only drops a frame it could not decode
with :meth:`ImageIntake.forget`, under the intake's lock.
"""

from dataclasses import dataclass, field
import threading
import time

from rclpy.qos import ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from orin_llm_node.parameters import camera_topics
from orin_llm_node.refusals import REASON_CHARS, clip
from orin_llm_node.ros import native_heap
from orin_llm_node.ros.cameras import ros_image
from orin_llm_node.ros.cameras.blind_camera import BlindWatch
from orin_llm_node.ros.cameras.camera_sync import ApproximateSync
from orin_llm_node.ros.cameras.camera_views import (
    FRAME_ID_CHARS,
    CameraView,
    PendingImage,
    missing_reason,
    stale_reason,
)
from orin_llm_node.ros.cameras.frame_ring import FrameRing, resize_for_model
from orin_llm_node.ros.contract import image_qos

try:                                    # Iron and later
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:                     # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

# Header stamps further ahead of our clock than this are refused (clock skew, bad drivers).
FUTURE_TOLERANCE_S = 1.0
# Frames per camera the synchroniser holds while waiting for the other cameras (the queue size
# message_filters users usually give; about 0.3 s of a 30 Hz camera).
SYNC_QUEUE_SIZE = 10


@dataclass
class Camera:
    """One camera name: its subscriptions, newest frame, video ring and blindness."""

    index: int
    name: str
    ring: FrameRing
    subscriptions: list = field(default_factory=list)
    newest: PendingImage | None = None
    watch: BlindWatch = field(default_factory=BlindWatch)
    refused: str = ''                       # why its last frame was refused ('' = it was not)

    def topics(self):
        """Its resolved (namespaced, remapped) topic names."""
        return sorted({sub.topic_name for sub in self.subscriptions})

    def topic(self, compressed):
        """The resolved name of its Image (``compressed``: CompressedImage) topic."""
        return next((sub.topic_name for sub in self.subscriptions
                     if (sub.msg_type is CompressedImage) == compressed),
                    camera_topics(self.name)[compressed])   # while subscribe() is under way


class ImageIntake:
    """The cameras of ``node`` (parameter ``image_topics``) and what arrived from them.

    Its subscriptions and its once-a-second check run in ``callback_group``.
    """

    def __init__(self, node, callback_group):
        self.node = node
        self.callback_group = callback_group
        self.cameras = []
        self._lock = threading.Lock()
        # Told (under the lock) whenever a camera keeps a new frame: a prompt may wait for one.
        self._kept = threading.Condition(self._lock)
        self._sync = None
        self._synced = None             # the newest approximate-time set: ((stamp, image), ...)
        self._processor = None          # sizes video frames as the model sees them

    def subscribe(self, mode, processor=None):
        """Open every camera's subscriptions, per ``image_qos`` (``mode``).

        ``processor`` (a frame_ring.FrameSizer of the engine's processors) sizes the frames kept
        for video; None keeps none.

        Measured (bench/image_delivery.py): a best-effort subscription matches every
        publisher but under Fast DDS gets large frames only if they come over UDP (the node's
        own DDS profile, see dds_profile.py); a reliable one matches only reliable publishers
        and gets every frame from them whatever the transport.  ``auto`` has both: the newest
        frame from either wins, and the reliable twin stays quiet about best-effort publishers
        it cannot match.
        """
        params = self.node.params
        names = list(params['image_topics'])
        self._processor = processor
        self._sync = ApproximateSync(len(names), SYNC_QUEUE_SIZE,
                                     round(params['camera_sync_s'] * 1e9))
        self._synced = None
        self.cameras = [Camera(i, name, FrameRing(params['video_fps'], params['video_buffer_s']))
                        for i, name in enumerate(names)]
        for reliable in {'auto': (False, True), 'best_effort': (False,),
                         'reliable': (True,)}[mode]:
            extra = {}
            if mode == 'auto' and reliable:
                extra['event_callbacks'] = SubscriptionEventCallbacks(
                    incompatible_qos=lambda _event: None)
            qos = image_qos(reliable)
            for camera in self.cameras:
                kinds = zip(camera_topics(camera.name), (Image, CompressedImage), (False, True),
                            strict=True)
                for topic, msg_type, compressed in kinds:
                    camera.subscriptions.append(self.node.create_subscription(
                        msg_type, topic,
                        lambda msg, c=camera, z=compressed: self._accept(c, msg, z), qos,
                        callback_group=self.callback_group, **extra))

    def unsubscribe(self):
        """Close the subscriptions and forget every frame (the rings' memory goes back)."""
        for camera in self.cameras:
            for sub in camera.subscriptions:
                self.node.destroy_subscription(sub)
            camera.subscriptions = []
        with self._lock:
            for camera in self.cameras:
                camera.newest = None
                camera.ring.clear()
            if self._sync is not None:
                self._sync.clear()
            self._synced = None
        self._report_memory()

    def topics(self):
        """The resolved (namespaced, remapped) image topic names of every camera."""
        return sorted(t for camera in self.cameras for t in camera.topics())

    def wait_for(self, stamp_ns, timeout_s):
        """Wait until every camera keeps a frame stamped at or after ``stamp_ns``.

        At most ``timeout_s`` seconds; True if they all do.  A prompt that names the stamp of
        the frame it was published with (``image_stamp``) waits here for the camera callback
        that may still be on its way (callbacks of different groups run in any order).
        """
        deadline = time.monotonic() + timeout_s
        with self._kept:
            while not all(c.newest is not None and c.newest.stamp_ns >= stamp_ns
                          for c in self.cameras):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._kept.wait(left)
        return True

    def take(self, now_ns, max_age_s, video_s=0.0, not_before_ns=None):
        """What each camera gives a prompt arriving at ``now_ns``; (views, synchronised).

        ``video_s`` > 0: each camera's kept frames of the last ``video_s`` seconds up to the
        newest frame any camera kept (which must be fresh, ``max_age_s``).  Else one
        frame per camera: the newest approximate-time set if every frame of it is fresh enough,
        otherwise the newest fresh frame of each camera (``synchronised`` False).
        ``not_before_ns``: a frame stamped before it is never paired (``image_stamp``).
        """
        with self._lock:
            if video_s > 0:
                return self._clips(now_ns, max_age_s, video_s), True
            newest = [camera.newest for camera in self.cameras]
            refused = [camera.refused for camera in self.cameras]
            synced = self._synced
        floor = -1 if not_before_ns is None else not_before_ns
        if len(self.cameras) > 1 and synced is not None and not any(
                stale_reason(image.stamp_ns, now_ns, max_age_s) or image.stamp_ns < floor
                for _, image in synced):
            frames, synchronised = [image for _, image in synced], True
        else:
            frames, synchronised = newest, len(self.cameras) == 1
        views = []
        for camera, image, last_refused in zip(self.cameras, frames, refused, strict=True):
            why = missing_reason(image, last_refused, now_ns, max_age_s)
            if not why and image.stamp_ns < floor:
                why = (f'no frame stamped at or after the image_stamp asked for (the newest is '
                       f'{(floor - image.stamp_ns) / 1e9:.3f} s older)')
            views.append(CameraView(camera.name, image=None if why else image, missing=why))
        return views, synchronised

    def _clips(self, now_ns, max_age_s, video_s):
        # "The last video_s seconds" end at the newest frame any camera kept, so a clip holds
        # video_s seconds of frames however late the prompt comes; that frame must be fresh
        # (image_max_age_s), as a single frame must.  Called under the lock.
        ends = [c.ring.newest_stamp for c in self.cameras if len(c.ring)]
        end = max(ends, default=None)
        stale = end is not None and stale_reason(end, now_ns, max_age_s, 'newest kept frame')
        views = []
        for camera in self.cameras:
            clip = [] if end is None or stale else camera.ring.clip(
                end - round(video_s * 1e9), end)
            if len(clip) == 1:
                # One frame in the window (a slow camera, a ring just emptied by a new
                # resolution, a window shorter than 1 / video_fps): a clip needs two (one
                # temporal patch), so the camera gives it as an image.
                views.append(CameraView(camera.name, frame=clip[0]))
                continue
            if camera.ring.capacity == 0 or self._processor is None:
                why = 'no video frames are kept (video_buffer_s is 0)'
            elif not len(camera.ring):
                why = 'no frame kept yet'
            elif stale:
                why = stale
            else:
                why = f'no frame kept in the {video_s:g} s up to the newest one'
            views.append(CameraView(camera.name, clip=clip or None, missing='' if clip else why))
        return views

    def forget(self, pending, why):
        """Stop pairing ``pending`` with prompts (the session could not decode it: ``why``)."""
        with self._lock:
            for camera in self.cameras:
                if camera.newest is pending:
                    camera.newest, camera.refused = None, why
            if self._synced is not None and any(i is pending for _, i in self._synced):
                self._synced = None

    def _stamp_ns(self, header):
        stamp = header.stamp.sec * 1_000_000_000 + header.stamp.nanosec
        if stamp > 0:
            return stamp, True
        return self.node.get_clock().now().nanoseconds, False

    def _accept(self, camera, msg, compressed):
        """Keep ``msg`` as the camera's newest frame if every check on its headers passes.

        A refused frame, or one not newer than the kept one (a delayed sample, the reliable
        twin of the same frame), never replaces the kept one.
        """
        self._frame_arrived(camera, len(msg.data), camera.topic(compressed))
        stamp, stamped = self._stamp_ns(msg.header)
        now = self.node.get_clock().now().nanoseconds
        topic = camera.name + ('/compressed' if compressed else '')
        pending = PendingImage(msg, compressed, stamp, stamped)
        try:
            # Headers only: every check the engine's image processor would make, and the size
            # of a compressed image from its header (decoded below only when due for the video
            # ring).
            (ros_image.check_compressed if compressed else ros_image.check_image)(msg)
            ahead = (stamp - now) / 1e9
            if ahead > FUTURE_TOLERANCE_S:
                raise ros_image.ImageConversionError(
                    f'stamp is {ahead:.1f} s in the future (clocks out of sync?)', 'future')
        except ros_image.ImageConversionError as exc:
            self._refuse(camera, topic, exc)
            return
        with self._lock:
            camera.refused = ''
            kept = camera.newest
            if self._replaces(None if kept is None else [(kept.stamp_ns, kept)],
                              [(stamp, pending)], now):
                camera.newest = pending
                self._kept.notify_all()
            due = self._processor is not None and camera.ring.wants(stamp)
        if not due:
            self._synchronise(camera, stamp, pending, now)
            return
        # Only frames due on the video_fps grid are decoded here, and resized once, now; the
        # frame is already the newest one meanwhile (decoding a large one takes a second, and
        # a prompt arriving then is paired with it, as with a frame never decoded here).
        try:
            rgb = resize_for_model(pending.rgb(), self._processor)
        except ros_image.ImageConversionError as exc:
            with self._lock:
                if camera.newest is pending:
                    camera.newest = kept
            self._refuse(camera, topic, exc)
            return
        finally:
            native_heap.trim()      # the full frame's pages, freed on this executor thread
        self._synchronise(camera, stamp, pending, now)
        with self._lock:
            camera.ring.offer(stamp, lambda: rgb, clip(msg.header.frame_id, FRAME_ID_CHARS),
                              stamped)
        self._report_memory()

    def _synchronise(self, camera, stamp, pending, now):
        # The newest approximate-time set across the cameras, with this frame offered to it.
        if len(self.cameras) < 2:
            return
        with self._lock:
            found = self._sync.add(camera.index, stamp, pending)
            if found is not None and self._replaces(self._synced, found, now):
                self._synced = found

    def _refuse(self, camera, topic, exc):
        with self._lock:
            camera.refused = clip(exc, REASON_CHARS)
        self.node.replies.refuse_image(topic, exc)

    @staticmethod
    def _replaces(kept, arrived, now_ns):
        """Whether the frames ``arrived`` replace the ``kept`` ones (None: nothing kept).

        Both are ``(stamp_ns, item)`` pairs, one frame or one synchronised set.  Only newer
        frames do: a delayed sample never brings an older scene back.  Frames kept from ahead
        of the clock (it jumped back: a bag replayed from its start with use_sim_time) would
        shut out every new one, so they go.
        """
        if kept is None:
            return True
        kept_ns = max(s for s, _ in kept)
        return (max(s for s, _ in arrived) > kept_ns
                or kept_ns - now_ns > FUTURE_TOLERANCE_S * 1e9)

    def _report_memory(self):
        with self._lock:
            rings = [c.ring for c in self.cameras]
            held = sum(r.nbytes for r in rings)
            frames = sum(len(r) for r in rings)
            limit = sum(r.limit_bytes(*r.frame_shape[:2]) for r in rings if r.frame_shape)
        self.node.replies.facts(video_buffer_bytes=held, video_buffer_frames=frames,
                                video_buffer_limit_bytes=limit)

    def _frame_arrived(self, camera, nbytes, topic):
        if camera.watch.frame(time.monotonic(), nbytes, topic):
            self._report_blindness()
            self.node.get_logger().info(f'camera {camera.name}: frames are arriving again')

    def _report_blindness(self):
        self.node.replies.facts(camera='; '.join(c.watch.blind for c in self.cameras
                                               if c.watch.blind))

    def check_camera(self):
        """Say once per camera (on ``error``, in /diagnostics) when it is blind, and what was seen.

        blind_camera.py tells a camera that stopped from one whose frames never arrived.
        """
        for camera in self.cameras:
            publishers = [(topic, info.qos_profile.reliability == ReliabilityPolicy.RELIABLE)
                          for topic in camera.topics()
                          for info in self.node.get_publishers_info_by_topic(topic)]
            said = camera.watch.check(time.monotonic(), publishers, self.node.params['image_qos'],
                                      bool(self.node.dds_profile))
            if said:
                self._report_blindness()
                self.node.replies.error(said)
