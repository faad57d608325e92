# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the cameras put into one prompt: the frames decoded, the multi-camera prompt text.

Runs on the session's thread (the frames are decoded only when a prompt takes them).  No
rclpy: it reads the request's camera views (camera_views.py).
"""

from fractions import Fraction

import numpy as np

from orin_llm_node.refusals import REASON_CHARS, clip, preview
from orin_llm_node.ros.cameras import ros_image


def decode(request, rejected):
    """[(view, RGB array or VideoClip)] of the cameras that give ``request`` something.

    A frame that cannot be decoded leaves its camera out: ``rejected(view, exc)`` is told
    (before the view forgets the frame) and the view's ``missing`` says why.  A ``required``
    image (a goal's own) that cannot be decoded raises ``ValueError`` with the reason instead:
    the question was about that image.
    """
    used = []
    for view in request.views:
        if view.clip:
            from orin_llm_node.processing import VideoClip
            # Exact stamps: which frames the clip keeps never depends on the clock's origin.
            used.append((view, VideoClip([f.rgb for f in view.clip],
                                         [Fraction(f.stamp_ns, 10**9) for f in view.clip])))
            continue
        if view.frame is not None:          # one frame in a clip's window: an image
            used.append((view, view.frame.rgb))
            continue
        if view.image is None:
            continue
        try:
            used.append((view, view.image.rgb()))
        except ros_image.ImageConversionError as exc:
            why = f'image rejected: {clip(exc, REASON_CHARS)}'
            if view.required:
                raise ValueError(f'{view.name}: {why}') from exc
            rejected(view, exc)
            view.image, view.missing = None, why
    return used


def content(request, used):
    """The engine's (text, images, videos) for ``used`` (from :func:`decode`).

    One camera: the text as it is, with its frame or clip (exactly the prompt of the
    single-camera node).  Several: one text of parts, each frame or clip introduced by its
    camera's name in the listed order, then the question.
    """
    if len(request.views) == 1:
        images = [x for _, x in used if isinstance(x, np.ndarray)]
        videos = [x for _, x in used if not isinstance(x, np.ndarray)]
        return request.text, images, videos
    parts = []
    if len(used) > 1 and not request.synchronised:
        parts.append('(The frames below are the newest of each camera, not taken at the '
                     'same time.)\n')
    for view, x in used:
        parts += [f'{view.name}: ', x, '\n']
    return parts + [request.text], [], []


def summary(request, used):
    """The prompt as the log names it: its text cut short and what the cameras gave."""
    return f"'{preview(request.text)}'" + ''.join(
        f' + {x.shape[1]}x{x.shape[0]} image' if isinstance(x, np.ndarray)
        else f' + {len(x.frames)}-frame clip' for _, x in used)
