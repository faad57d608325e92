# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the cameras give one prompt: frames as received, each camera's view, the queued request.

The records the intake (intake.py) hands to the node and the session; ``response/info`` names
their frames.  No rclpy: the messages are held, never built here.
"""

from dataclasses import dataclass, field

from orin_llm_node.refusals import clip
from orin_llm_node.ros.cameras import ros_image

# A frame_id is repeated in response/info cut to this length (it is the sender's text).
FRAME_ID_CHARS = 128


@dataclass
class PendingImage:
    """A camera's frame as received (decoded on the session thread only if a prompt takes it)."""

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

    def rgb(self):
        """The pixels as ``HxWx3`` RGB; :class:`ros_image.ImageConversionError` if unusable."""
        if self.compressed:
            return ros_image.compressed_to_rgb(self.msg)
        return ros_image.image_to_rgb(self.msg)


@dataclass
class CameraView:
    """What one camera gives one prompt: a frame, or a clip (video), or why neither."""

    name: str
    image: PendingImage | None = None
    clip: list | None = None        # frame_ring.BufferedFrame, oldest first
    # A video request's camera with one kept frame in the window: that frame, as an image.
    frame: object = None            # frame_ring.BufferedFrame
    missing: str = ''               # why the camera is left out (said in response/info)
    # A goal's own image: the caller sent it for this question, so one that cannot be decoded
    # fails the request instead of leaving it out as a camera's frame is.
    required: bool = False

    def image_info(self):
        """The single frame this camera gives, as ``response/info`` names it; or None."""
        if self.image is not None:
            return self.image.describe()
        return None if self.frame is None else self.frame.describe()


@dataclass
class Request:
    """One queued prompt and what each camera gave it when it arrived."""

    request_id: int
    text: str
    views: list = field(default_factory=list)      # CameraView per camera, in listed order
    synchronised: bool = True       # the frames are one approximate-time set (or one camera)
    video_s: float = 0.0            # the clip's length asked for (0: single frames)
    envelope: dict | None = None    # prompt/json: the checked keys (request_envelope.KEYS)
    # Told what becomes of this request besides the topics (an ask goal: goal_feedback.py):
    # ``queued(ahead)``, ``stage(name)``, ``delta(text)``, ``finished(info, result)`` on the
    # session's thread, ``refused(reason)`` where it is dropped or drained unanswered.
    listener: object = None

    @property
    def image(self):
        """The first camera's frame (the only one in the default one-camera set-up)."""
        return self.views[0].image if self.views else None


def missing_reason(image, refused, now_ns, max_age_s):
    """Why a camera's kept frame ``image`` is not paired ('' = it is).

    ``refused``: why the last frame received after it was refused ('' = none was).
    """
    if image is None:
        return f'image rejected: {refused}' if refused else 'no image received yet'
    stale = stale_reason(image.stamp_ns, now_ns, max_age_s)
    if stale and refused:
        return f'{stale}; the last frame received was rejected: {refused}'
    return stale


def stale_reason(stamp_ns, now_ns, max_age_s, what='newest image'):
    """Why a frame stamped ``stamp_ns`` is too old to pair at ``now_ns`` ('' = it is not)."""
    age = (now_ns - stamp_ns) / 1e9
    if age > max_age_s:
        return f'{what} is {age:.1f} s old (> image_max_age_s {max_age_s:g} s)'
    return ''
