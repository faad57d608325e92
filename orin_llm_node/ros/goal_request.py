# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""An ask goal read into the session's ``Request``, or refused with the reason.

The goal's fields become a ``prompt/json`` envelope, checked by the same ``parse_envelope``
(one set of rules for both ways in: a field the envelope does not know yet, e.g. ``tools``
before the node takes tools, is refused as its key would be).  Its images are the prompt's
frames, read with the image topics' header checks (``ros_image``) and decoded on the session's
thread like theirs; without images, the node's cameras give the frames (or clips) as for a
prompt, limited to the goal's ``cameras``.  No rclpy calls here: the node's state, cameras and
clock are asked through ``node``.
"""

import json

from orin_llm_node import bounded_json
from orin_llm_node.ros import tool_requests
from orin_llm_node.ros.cameras import ros_image
from orin_llm_node.ros.cameras.camera_report import camera_report
from orin_llm_node.ros.cameras.camera_views import CameraView, PendingImage, Request
from orin_llm_node.ros.prompts import not_ready
from orin_llm_node.ros.request_envelope import EnvelopeError, parse_envelope

# Goal fields holding JSON text, each an envelope key of the same name when not empty.
JSON_FIELDS = ('response_format', 'tools', 'tool_results')


class GoalRefused(ValueError):
    """A goal the node does not queue; ``str(err)``: why, ``cameras``: what they gave it."""

    def __init__(self, reason, cameras=None):
        super().__init__(reason)
        self.cameras = cameras


def goal_request(node, request_id, goal, listener):
    """The queued ``Request`` of ``goal``; :class:`GoalRefused` with the reason if not.

    Checks, in order: the node's state, the envelope, the goal's images or cameras, a clip's
    length and frames (the queue's room is the server's: checked as it queues).
    """
    state = node.state()
    if state != 'active':
        raise GoalRefused(not_ready(state))
    envelope = goal_envelope(goal, node.runtime('tools'))
    text = tool_requests.request_text(envelope)
    if goal.images or goal.compressed_images:
        if goal.cameras or goal.video_s > 0:
            raise GoalRefused('a goal with images takes no cameras and no video_s (its images '
                              'are the frames)')
        views = [_goal_view(i, msg) for i, msg in enumerate(
            list(goal.images) + list(goal.compressed_images))]
        request = Request(request_id, text, views, True, 0.0, envelope, listener)
    else:
        request = _camera_request(node, request_id, text, envelope, goal.cameras, listener)
    return request


def goal_envelope(goal, tools_parameter=''):
    """The checked ``prompt/json`` envelope of ``goal`` (``GoalRefused`` if malformed).

    An empty field is a key left out, ``prompt`` included (``tool_results`` alone need none);
    ``tools_parameter``: as for ``parse_envelope``.
    """
    data = {'prompt': goal.prompt} if goal.prompt else {}
    for name in JSON_FIELDS:
        text = getattr(goal, name)
        if text:
            try:
                data[name] = bounded_json.loads(text)
            except ValueError as exc:
                raise GoalRefused(f'{name} is not valid JSON: {exc}') from None
    if goal.max_new_tokens > 0:
        data['max_new_tokens'] = goal.max_new_tokens
    if not goal.temperature < 0:        # NaN too: the envelope's check refuses it
        data['temperature'] = float(goal.temperature)
    if goal.video_s != 0:
        data['video_s'] = goal.video_s
    for name in ('conversation', 'tag'):
        if getattr(goal, name):
            data[name] = getattr(goal, name)
    try:
        return parse_envelope(json.dumps(data), tools_parameter)
    except EnvelopeError as exc:
        raise GoalRefused(f'malformed goal: {exc}') from None


def _goal_view(index, msg):
    # One of the goal's images, checked as an image topic checks a frame on arrival.
    compressed = hasattr(msg, 'format')
    name = f'goal image {index + 1}'
    try:
        if compressed:
            ros_image.check_compressed(msg)
        else:
            ros_image.check_image(msg)
    except ros_image.ImageConversionError as exc:
        raise GoalRefused(f'{name}: {exc}') from None
    stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
    return CameraView(name, image=PendingImage(msg, compressed, stamp, stamp > 0),
                      required=True)


def _camera_request(node, request_id, text, envelope, cameras, listener):
    # What the node's cameras give the goal, as prompts.py pairs a prompt with them.
    params = node.params
    known = [camera.name for camera in node.intake.cameras]
    unknown = [name for name in cameras if name not in known]
    if unknown:
        raise GoalRefused(f"unknown camera(s) {', '.join(map(repr, unknown))} (the node's: "
                          f"{', '.join(known)})")
    video_s = envelope.get('video_s', node.runtime('video_window_s'))
    if video_s > params['video_buffer_s']:
        raise GoalRefused(f'a clip of {video_s:g} s asked for, but each camera keeps '
                          f"{params['video_buffer_s']:g} s (video_buffer_s)")
    now = node.get_clock().now().nanoseconds
    # Tool results alone add no message, so they take no frames (as a prompt's).
    views, synchronised = node.intake.take(now, params['image_max_age_s'], video_s) \
        if text else ([], True)
    if cameras:
        views = [view for view in views if view.name in cameras]
    request = Request(request_id, text, views, synchronised, video_s, envelope, listener)
    if video_s > 0 and views and all(view.missing for view in views):
        missing = '; '.join(f'{v.name}: {v.missing}' for v in views)
        raise GoalRefused(f'a clip of the last {video_s:g} s has zero frames ({missing})',
                          camera_report(request))
    return request
