# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A ``detect`` request: one grounding turn per camera, boxes in each camera frame's pixels.

The engine takes one image per grounding turn, so a request runs one turn per camera that
gave a frame, each in a conversation of its own (the system prompt, the frame, the grounding
prompt; reset afterwards, its blocks kept as cache): the boxes never enter the node's
conversation.  The frame each turn gets is the camera's newest frame as decoded, at the
camera's own size (a ``detect`` request takes no clip, so never a video ring's frame resized
to the model's size); each box is mapped from the model's 0-1000 frame to that camera's
width and height (``processing.grounding.box_to_frame``: the resize cancels out exactly).

No rclpy: ``response/info`` entries here, the ``Detection2DArray`` in detections_topic.py.
"""

from dataclasses import replace

import numpy as np

from orin_llm_node.processing.grounding import box_to_frame

# The turn's outcomes after which the other cameras' turns are not run.
_STOPS = ('cancelled', 'timeout', 'error', 'kv_exhausted', 'context_full')


def camera_size(view, frame):
    """``(height, width)`` of the camera frame ``view`` gave: its message's size.

    A raw Image says it in its header fields; a CompressedImage's size is its decoded size.
    """
    msg = view.image.msg
    if not view.image.compressed:
        return int(msg.height), int(msg.width)
    return tuple(frame.shape[:2])


def entries(view, frame, result):
    """The ``response/info`` detections of one camera's turn (``result``: a ChatResult)."""
    seen = view.image.describe()
    size = camera_size(view, frame)
    return [{'label': det['label'], 'bbox': box_to_frame(det['bbox_2d'], size),
             'bbox_2d': list(det['bbox_2d']), 'camera': view.name,
             'frame_id': seen['frame_id'], 'stamp': seen['stamp']}
            for det in result.detections]


def detect_turns(engine, system_prompt, request, used, sampling, run_turn):
    """Run ``request``'s grounding turns; ``(result, detections, per_camera)``.

    ``used``: the session's decoded ``[(view, frame)]``; ``run_turn(conv, text, images,
    sampling)``: the session's streaming turn.  ``result`` combines the turns (see
    :func:`combine`); ``per_camera``: ``[(header, entries)]`` for the Detection2DArray topic.
    ``ValueError`` when no camera gave a frame.
    """
    frames = [(v, f) for v, f in used if isinstance(f, np.ndarray) and v.image is not None]
    if not frames:
        missing = '; '.join(f'{v.name}: {v.missing}' for v in request.views if v.missing)
        raise ValueError(f'detect needs a camera frame, and none gave one ({missing or "none"})')
    results, found, per_camera = [], [], []
    for view, frame in frames:
        conv = engine.new_conversation(system_prompt=system_prompt)
        try:
            result = run_turn(conv, request.text, [frame], sampling)
        finally:
            engine.reset(conv)
        results.append((view.name, result))
        camera_entries = entries(view, frame, result)
        found += camera_entries
        per_camera.append((view.image.msg.header, camera_entries))
        if result.finish_reason in _STOPS:
            break
    return combine(results), found, per_camera


def combine(results):
    """One ChatResult for the cameras' turns ``[(camera, result)]``.

    One camera: its result.  Several: text ``camera: answer`` per line; ``parsed`` (the
    ``json`` of ``response/info``) ``{camera: boxes}``; valid if every answer is; the first
    finish reason that is not ``stop`` (else ``stop``) and its error; token counts summed;
    the first turn's time to first token.
    """
    if len(results) == 1:
        return results[0][1]
    first = results[0][1]
    odd = next((r for _, r in results if r.finish_reason != 'stop'), first)
    rates = [r.decode_tok_s for _, r in results if r.decode_tok_s > 0]
    return replace(
        first, text='\n'.join(f'{name}: {r.text}' for name, r in results),
        token_ids=[t for _, r in results for t in r.token_ids],
        prompt_token_ids=[t for _, r in results for t in r.prompt_token_ids],
        finish_reason=odd.finish_reason, error=odd.error,
        cached_tokens=sum(r.cached_tokens for _, r in results),
        vision_s=sum(r.vision_s for _, r in results),
        decode_tok_s=sum(rates) / len(rates) if rates else 0.0,
        valid=all(r.valid for _, r in results),
        parsed={name: r.parsed for name, r in results},
        detections=[d for _, r in results for d in r.detections])
