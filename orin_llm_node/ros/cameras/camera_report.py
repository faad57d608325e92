# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The camera part of ``response/info``: what each camera gave one prompt (README schema).

No rclpy: it reads the request's camera views (camera_views.py) and the frames they hold.
"""

from orin_llm_node.ros.contract import CameraReport


def _stamp(ns):
    return {'sec': ns // 1_000_000_000, 'nanosec': ns % 1_000_000_000}


def camera_report(request):
    """The :class:`~orin_llm_node.ros.contract.CameraReport` of ``request``.

    ``cameras``: per camera, in listed order, its frame (stamp, frame_id) or its clip (frames,
    first and last stamp, span) or why it was left out; ``camera_sync``: whether the frames
    are one approximate-time set and how far apart their stamps are; ``video``: the time span
    of the frames a video request gave (clips, and one-frame cameras' frames; null for single
    frames).  The first camera's frame and reason are ``image`` / ``no_image`` (the only
    camera by default; ``no camera`` when there is none).
    """
    cameras, stamps, clip_stamps = [], [], []
    for view in request.views:
        entry = {'name': view.name, 'image': None, 'video': None, 'missing': view.missing or None}
        if view.clip:
            first, last = view.clip[0], view.clip[-1]
            entry['video'] = {'frames': len(view.clip), 'first_stamp': _stamp(first.stamp_ns),
                              'last_stamp': _stamp(last.stamp_ns),
                              'stamps': [_stamp(f.stamp_ns) for f in view.clip],
                              'span_s': round((last.stamp_ns - first.stamp_ns) / 1e9, 6),
                              'size': list(first.rgb.shape[:2])}
            clip_stamps += [first.stamp_ns, last.stamp_ns]
        elif view.frame is not None:        # a video request's camera with one frame
            entry['image'] = view.frame.describe()
            clip_stamps.append(view.frame.stamp_ns)
        elif view.image is not None:
            entry['image'] = view.image.describe()
            stamps.append(view.image.stamp_ns)
        cameras.append(entry)
    fields = {'cameras': cameras,
              'camera_sync': {'synchronised': bool(stamps) and request.synchronised,
                              'spread_s': round((max(stamps) - min(stamps)) / 1e9, 6)
                              if stamps else None},
              'video': None}
    if request.video_s > 0:
        fields['video'] = {'seconds': request.video_s,
                           'start': _stamp(min(clip_stamps)) if clip_stamps else None,
                           'end': _stamp(max(clip_stamps)) if clip_stamps else None,
                           'span_s': round((max(clip_stamps) - min(clip_stamps)) / 1e9, 6)
                           if clip_stamps else None}
    first = request.views[0] if request.views else None
    return CameraReport(image=first.image_info() if first else None,
                        missing=(first.missing or None) if first else 'no camera',
                        fields=fields)
