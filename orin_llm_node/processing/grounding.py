# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Grounding: where the things a request names are, as boxes in the camera frame's pixels.

A ``detect`` request names what to find: a list of labels (``["red cup", "gripper"]``) or one
phrase (``"the cup left of the robot"``). The prompt is Qwen3-VL's own grounding instruction
(the phrasing of its grounding cookbook) and the answer is held to its box-list format,
``[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]``, written as the model writes it (``", "``
and ``": "`` separators), at most ``MAX_BOXES`` boxes; with a list, every label is one of the
request's.

Qwen3-VL's coordinates are relative to the image it saw, 0-1000 on each axis. The image it saw
is the camera frame resized as a whole (``smart_resize`` rounds each side to the patch grid and
scales the two sides by slightly different factors; nothing is cropped or padded), so a
relative coordinate names the same place in the frame: ``box_to_frame`` maps it to the frame's
pixels, exactly for frames scaled up or down and for any aspect ratio.
"""

__all__ = ['COORDINATE_RANGE', 'MAX_BOXES', 'box_list_schema', 'box_to_frame', 'check_detect',
           'detections', 'grounding_prompt']

#: Qwen3-VL's box coordinates run from 0 to this on each axis of the image it saw.
COORDINATE_RANGE = 1000
#: Most boxes one answer may hold (each is ~20-30 tokens).
MAX_BOXES = 32
MAX_LABEL_CHARS = 100
_LABELS_PROMPT = ('Locate every instance that belongs to the following categories: "{}". '
                  'Report bbox coordinates in JSON format.')
_PHRASE_PROMPT = 'Locate {}, output its bbox coordinates using JSON format.'
# How the model writes the list (and how a call's JSON is written: engine/tool_calls.py).
_JSON_STYLE = {'item_separator': ', ', 'key_separator': ': ', 'whitespace_flexible': False}


def check_detect(detect) -> list[str] | str | None:
    """``detect`` checked: None, a non-empty phrase, or a non-empty list of distinct labels."""
    if detect is None:
        return None
    if isinstance(detect, str):
        _check_label('detect', detect)
        return detect
    if not isinstance(detect, (list, tuple)) or not detect:
        raise ValueError('detect must be a phrase or a non-empty list of labels')
    for i, label in enumerate(detect):
        _check_label(f'detect[{i}]', label)
    if len(set(detect)) != len(detect):
        raise ValueError('detect names a label twice')
    return list(detect)


def _check_label(where: str, label) -> None:
    if not isinstance(label, str) or not label.strip():
        raise ValueError(f'{where} must be a non-empty string')
    try:
        label.encode('utf-8')
    except UnicodeEncodeError:      # "\ud800" in JSON: no text a prompt or a box can hold
        raise ValueError(f'{where} must be valid Unicode (it holds a lone surrogate)') from None
    if len(label) > MAX_LABEL_CHARS or '"' in label or '\n' in label:
        raise ValueError(f'{where} must be at most {MAX_LABEL_CHARS} characters on one line '
                         'without a double quote')


def grounding_prompt(detect) -> str:
    """The user text asking for the boxes of ``detect`` (checked)."""
    if isinstance(detect, str):
        return _PHRASE_PROMPT.format(detect)
    return _LABELS_PROMPT.format(', '.join(detect))


def box_list_schema(detect) -> dict:
    """The JSON Schema of the answer to ``detect`` (checked): the list of labelled boxes."""
    coordinate = {'type': 'integer', 'minimum': 0, 'maximum': COORDINATE_RANGE}
    label = ({'type': 'string', 'maxLength': MAX_LABEL_CHARS} if isinstance(detect, str)
             else {'enum': list(detect)})
    box = {'type': 'object',
           'properties': {'bbox_2d': {'type': 'array', 'items': coordinate,
                                      'minItems': 4, 'maxItems': 4},
                          'label': label},
           'required': ['bbox_2d', 'label'], 'additionalProperties': False}
    return {'type': 'array', 'items': box, 'maxItems': MAX_BOXES, 'x-guidance': _JSON_STYLE}


def box_to_frame(bbox_2d, frame_size) -> list[float]:
    """One box from the model's 0-1000 frame to ``[x_min, y_min, x_max, y_max]`` frame pixels.

    ``frame_size``: ``(height, width)`` of the camera frame the image came from. Pixel
    coordinates are continuous: ``(0, 0)`` is the top-left corner of the top-left pixel and a
    box reaching the right edge has ``x_max == width``. Corners given in either order are put
    in order; coordinates outside 0-1000 are clamped to the frame.
    """
    height, width = frame_size
    x1, y1, x2, y2 = (min(max(v, 0), COORDINATE_RANGE) for v in bbox_2d)
    # The resize maps the frame's whole width onto the model image's whole width (and height
    # likewise), so the model image's size cancels: relative 0-1000 is relative in the frame.
    xs = sorted((x1 * width / COORDINATE_RANGE, x2 * width / COORDINATE_RANGE))
    ys = sorted((y1 * height / COORDINATE_RANGE, y2 * height / COORDINATE_RANGE))
    return [xs[0], ys[0], xs[1], ys[1]]


def detections(parsed, frame_size) -> list[dict]:
    """``[{label, bbox_2d, bbox}]`` of a valid answer: the model's boxes and the frame's pixels."""
    return [{'label': box['label'], 'bbox_2d': list(box['bbox_2d']),
             'bbox': box_to_frame(box['bbox_2d'], frame_size)} for box in parsed]
