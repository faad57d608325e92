# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat --video``: the clip's frames, their stamps, and the node's video settings.

A clip is sent at its own pace (its stamps must not lie ahead of the node's clock), so a clip
the node cannot keep would stream for its whole length only to be refused: the client reads
the node's ``video_buffer_s`` and ``video_fps`` from its parameter service first and refuses
such a clip before sending anything (chat.py sends it).
"""

from pathlib import Path

VIDEO_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp', '.ppm', '.pgm')
# The node's parameters the client plans a clip with (ros/parameters.py).
VIDEO_SETTINGS = ('video_fps', 'video_buffer_s')


def video_files(spec):
    """The frame files of ``--video``: a directory's images in name order, or "a,b,c" files."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
        if not files:
            raise ValueError(f'{spec}: no image files ({", ".join(VIDEO_SUFFIXES)})')
        return files
    return [Path(p) for p in spec.split(',') if p]


def stamp_clip(msgs, fps, end_ns, frame_id):
    """Stamp ``msgs`` ``1 / fps`` apart, the last at ``end_ns``; all with ``frame_id``."""
    from builtin_interfaces.msg import Time
    period = round(1e9 / fps)
    for k, msg in enumerate(msgs):
        t = end_ns - (len(msgs) - 1 - k) * period
        msg.header.stamp = Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000)
        msg.header.frame_id = frame_id
    return msgs


def clip_seconds(frames, fps):
    """The ``video_s`` a clip of ``frames`` at ``fps`` asks for: the seconds its frames span.

    Half a period more than the span, so that the node's window ``(end - video_s, end]``
    surely holds the first frame; the node refuses more than its ``video_buffer_s``.
    """
    return round((frames - 0.5) / fps, 3)


def clip_refusal(frames, fps, settings):
    """Why the node would refuse a clip of ``frames`` at ``fps`` (one line), or None.

    ``settings``: the node's :data:`VIDEO_SETTINGS`.
    """
    kept = settings['video_buffer_s']
    if kept == 0:
        return ('the node keeps no video (its video_buffer_s is 0): start it with '
                'video_buffer_s > 0; nothing was sent')
    if clip_seconds(frames, fps) <= kept:
        return None
    most = int(kept * fps + 0.5) + 1
    while most > 0 and clip_seconds(most, fps) > kept:
        most -= 1
    return (f'{frames} frames at --fps {fps:g} span {(frames - 1) / fps:.1f} s, but the node '
            f'keeps {kept:g} s per camera (its video_buffer_s): send at most {most} frames at '
            f'--fps {fps:g}, or start the node with a larger video_buffer_s; nothing was sent')


def clip_start_ns(opened_ns, now_ns, fps, video_fps=None):
    """The first frame's stamp of a clip sent after the frame stamped ``opened_ns``.

    Now, but far enough after that frame that the clip's window leaves it out (two periods of
    ``fps``) and that the node's ring, which keeps one frame per ``1 / video_fps`` from the one
    it kept last, keeps the clip's first frame.
    """
    after = 2 * round(1e9 / fps)
    if video_fps:
        after = max(after, round(1e9 / video_fps))
    return max(now_ns, opened_ns + after)


def node_video_settings(client, timeout_s):
    """The :data:`VIDEO_SETTINGS` of the node ``client`` talks to; (values, '') or (None, why).

    The node is the one subscribing to ``client``'s ``prompt/json`` topic (whatever its node
    name); read through its parameter service.
    """
    from rcl_interfaces.msg import ParameterType
    from rcl_interfaces.srv import GetParameters

    topic = client.topic('prompt/json')
    found = []

    def served():
        # An endpoint's node is named once the node's graph information arrived (until then,
        # Fast DDS gives '_NODE_NAME_UNKNOWN_').
        found[:] = [info for info in client.get_subscriptions_info_by_topic(topic)
                    if info.node_name != '_NODE_NAME_UNKNOWN_']
        return found

    if not client.spin_until(served, timeout_s):
        return None, f'no node subscribes to {topic}'
    info = found[0]
    service = f"{info.node_namespace.rstrip('/')}/{info.node_name}/get_parameters"
    caller = client.create_client(GetParameters, service)
    try:
        if not caller.wait_for_service(timeout_sec=timeout_s):
            return None, f'{service} does not answer'
        future = caller.call_async(GetParameters.Request(names=list(VIDEO_SETTINGS)))
        if not client.spin_until(future.done, timeout_s) or future.result() is None:
            return None, f'{service} gave no answer in {timeout_s:g} s'
        values = future.result().values
    finally:
        client.destroy_client(caller)
    if len(values) != len(VIDEO_SETTINGS) or any(
            v.type != ParameterType.PARAMETER_DOUBLE for v in values):
        return None, f'{service} has no double {" and ".join(VIDEO_SETTINGS)}'
    return {name: v.double_value for name, v in zip(VIDEO_SETTINGS, values, strict=True)}, ''


def video_verdict(info, frame_id):
    """None when ``info`` says the answer used our clip, else why it did without it."""
    cameras = info.get('cameras') or []
    if any(c.get('video') and c['video'].get('frames') for c in cameras):
        return None
    reasons = '; '.join(f"{c.get('name')}: {c.get('missing')}" for c in cameras
                        if c.get('missing'))
    return reasons or f'the node paired no clip ({frame_id}) with the prompt'
