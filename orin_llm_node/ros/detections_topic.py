# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ``detections`` topic: a detect request's boxes as ``vision_msgs/Detection2DArray``.

Published where ``vision_msgs`` imports (on a robot: ``ros-<distro>-vision-msgs``), one
message per camera and request: the header is the camera frame's own (stamp and frame_id), each
box its centre and size in that frame's pixels, the label in ``results[0].hypothesis.class_id``
(the Humble and later layout: ``bbox.center.position``).  Qwen3-VL gives no confidence: the
score is 1.0.  Without ``vision_msgs`` the node runs as before and says once (at the first
detect request) that the topic is off; ``response/info`` carries the same boxes either way.
"""

import importlib

from orin_llm_node.ros.contract import DETECTIONS


def vision_msgs():
    """The ``vision_msgs.msg`` module, or None where the package is not installed."""
    try:
        return importlib.import_module('vision_msgs.msg')
    except ImportError:
        return None


def detection_array(msgs, header, entries):
    """A ``Detection2DArray`` (``msgs``: vision_msgs.msg) of one camera's ``entries``.

    ``entries``: ros/detections.py's ``{label, bbox: [x_min, y_min, x_max, y_max]}`` in the
    pixels of the frame whose ``header`` it carries.
    """
    out = msgs.Detection2DArray(header=header)
    for entry in entries:
        x1, y1, x2, y2 = entry['bbox']
        det = msgs.Detection2D(header=header)
        det.bbox.center.position.x = (x1 + x2) / 2.0
        det.bbox.center.position.y = (y1 + y2) / 2.0
        det.bbox.size_x, det.bbox.size_y = float(x2 - x1), float(y2 - y1)
        hypothesis = msgs.ObjectHypothesisWithPose()
        hypothesis.hypothesis.class_id = entry['label']
        hypothesis.hypothesis.score = 1.0
        det.results.append(hypothesis)
        out.detections.append(det)
    return out


class DetectionsTopic:
    """The ``detections`` publisher of ``node``, or nothing without vision_msgs.

    Without it, the first detect request's boxes say so in the log, once: not at start-up,
    where a node that cannot start says one line only, and a node never asked for boxes has
    nothing to say.
    """

    def __init__(self, node):
        self._msgs = vision_msgs()
        self._logger = node.get_logger()
        self._said = False
        self._pub = None
        if self._msgs is not None:
            self._pub = node.create_publisher(self._msgs.Detection2DArray, DETECTIONS.name,
                                              DETECTIONS.qos())

    def publish(self, per_camera):
        """One message per ``(header, entries)`` of a detect request's cameras."""
        if self._pub is None:
            if not self._said:
                self._said = True
                self._logger.info('vision_msgs is not installed: the detections topic is off '
                                  '(response/info carries the boxes)')
            return
        for header, entries in per_camera:
            self._pub.publish(detection_array(self._msgs, header, entries))
