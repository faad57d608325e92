# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The client side of the node's topics: :class:`LLMClient` and :func:`image_message`.

What ``orin_llm_chat`` (chat.py), the demo and the benchmarks talk to the node with: the
names and QoS of contract.py, the node's latched ``ready``, a prompt's ``response/info``
matched by its text or its ``tag``, frames sent until the node's reader acknowledged them.
"""

import array
import io
import json
import os
from pathlib import Path
import time

import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from orin_llm_node.ros import contract


class LLMClient(Node):
    """Talks to one ``orin_llm`` node (topics under ``namespace``)."""

    def __init__(self, namespace='/orin_llm', node_name='orin_llm_chat', **kwargs):
        super().__init__(node_name, **kwargs)
        ns = '/' + namespace.strip('/') if namespace.strip('/') else ''
        self.topic = lambda name: f'{ns}/{name}'
        self.ready = False
        self.deltas = []
        self.infos = []
        self.errors = []
        self.on_delta = None
        self.on_error = None
        self._image_pubs = {}           # created on first use: no idle image publisher
        self.pub_prompt = self._publisher(String, contract.PROMPT)
        self.pub_envelope = self._publisher(String, contract.PROMPT_JSON)
        self._subscribe(Bool, contract.READY, self._on_ready)
        self._subscribe(String, contract.STREAM, self._on_delta)
        self._subscribe(String, contract.INFO, self._on_info)
        self._subscribe(String, contract.ERROR, self._on_error)
        self.cancel_client = self.create_client(Trigger, self.topic(contract.CANCEL))

    def _publisher(self, msg_type, topic):
        return self.create_publisher(msg_type, self.topic(topic.name), topic.qos())

    def _subscribe(self, msg_type, topic, callback):
        self.create_subscription(msg_type, self.topic(topic.name), callback, topic.qos())

    def _on_ready(self, msg):
        self.ready = msg.data

    def _on_delta(self, msg):
        self.deltas.append(msg.data)
        if self.on_delta:
            self.on_delta(msg.data)

    def _on_info(self, msg):
        try:
            self.infos.append(json.loads(msg.data))
        except (ValueError, RecursionError):
            pass                        # not the node's: it always sends a JSON object

    def _on_error(self, msg):
        self.errors.append(msg.data)
        if self.on_error:
            self.on_error(msg.data)

    def spin_until(self, condition, timeout_s):
        """Spin this node until ``condition()`` is true; returns whether it became true."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0 or not rclpy.ok(context=self.context):
                return False
            rclpy.spin_once(self, timeout_sec=min(left, 0.1))
        return True

    def wait_ready(self, timeout_s):
        """Wait for the latched ``ready`` and for the node's prompt subscription to match ours."""
        return self.spin_until(
            lambda: self.ready and self.pub_prompt.get_subscription_count() > 0, timeout_s)

    def image_publisher(self, msg_type, topic=None):
        """The (reliable) publisher for ``msg_type`` on ``topic`` (default: the node's)."""
        topic = topic or self.topic(contract.CLIENT_IMAGES.name + (
            '/compressed' if msg_type is CompressedImage else ''))
        if topic not in self._image_pubs:
            self._image_pubs[topic] = self.create_publisher(msg_type, topic,
                                                            contract.CLIENT_IMAGES.qos())
        return self._image_pubs[topic]

    def send_image(self, msg, topic=None, match_timeout_s=5.0, fresh_s=0.5, ack_timeout_s=10.0):
        """Publish an Image or CompressedImage once a subscriber matched, and wait for its ack.

        Returns ``'acknowledged'``; ``'unacknowledged'`` when subscribers matched but did not
        acknowledge within ``ack_timeout_s`` (the image was sent and may well have arrived:
        only the node's ``response/info`` can tell); ``'unmatched'`` when nothing subscribes to
        the topic within ``match_timeout_s`` (e.g. the node's image topic is remapped elsewhere).
        """
        pub = self.image_publisher(type(msg), topic)
        if not self.spin_until(lambda: pub.get_subscription_count() > 0, match_timeout_s):
            return 'unmatched'
        # Reliable: the node's reader has the image before the prompt goes out (they travel
        # on different topics). The node ages an unstamped image from its arrival, and an
        # acknowledgement can come one DDS heartbeat period (3 s) after the data arrived
        # (measured: about one send in six with the node's loopback profile), so an image
        # acknowledged late is sent again: the copy the prompt pairs with is at most
        # ``fresh_s`` old.  Under load no acknowledgement may come in time although the reader
        # has the image (the writer can match the reader before the reader matches the
        # writer): that is not a sign of a remapped topic (taking it for one failed 1 run in 53).
        deadline = time.monotonic() + ack_timeout_s
        while time.monotonic() < deadline:
            pub.publish(msg)
            if pub.wait_for_all_acked(Duration(seconds=fresh_s)):
                self.spin_until(lambda: False, 0.1)     # let the node's executor take it
                return 'acknowledged'
        return 'unacknowledged'

    def ask(self, text, timeout_s):
        """Publish ``text`` and wait for its ``response``; returns the answer or None."""
        info = self.ask_tagged(text, timeout_s)
        return None if info is None else info.get('text')

    def ask_tagged(self, text, timeout_s):
        """Publish ``text`` and return the node's ``response/info`` for it (or None on timeout).

        The node answers prompts in order, one ``response/info`` JSON object per prompt
        (answered or refused); ours is the first one naming our prompt after we sent it.
        """
        before = len(self.infos)
        self.deltas = []
        self.pub_prompt.publish(String(data=text))

        def mine():
            return next((i for i in self.infos[before:] if i.get('prompt') == text), None)

        if not self.spin_until(lambda: mine() is not None, timeout_s):
            return None
        return mine()

    def ask_envelope(self, envelope, timeout_s):
        """Publish a ``prompt/json`` envelope with a fresh ``tag``; its ``response/info``.

        Waits (within ``timeout_s``) for the node's ``prompt/json`` subscription first; None on
        timeout.
        """
        if not self.spin_until(lambda: self.pub_envelope.get_subscription_count() > 0,
                               timeout_s):
            return None
        tag = f'orin_llm_chat_{os.getpid()}_{time.time_ns()}'
        before = len(self.infos)
        self.deltas = []
        self.pub_envelope.publish(String(data=json.dumps({**envelope, 'tag': tag})))

        def mine():
            return next((i for i in self.infos[before:] if i.get('tag') == tag), None)

        if not self.spin_until(lambda: mine() is not None, timeout_s):
            return None
        return mine()

    def stream_rest(self, answer, timeout_s=2.0):
        """Wait for deltas still in flight after ``answer``; return the part not streamed.

        ``response/info`` and ``response/stream`` are different topics, so the last deltas may land
        after the whole answer.
        """
        self.spin_until(lambda: ''.join(self.deltas) == answer, timeout_s)
        streamed = ''.join(self.deltas)
        return answer[len(streamed):] if answer.startswith(streamed) else ''

    def cancel(self, timeout_s=2.0):
        """Ask the node to stop the answer in progress."""
        if not self.cancel_client.wait_for_service(timeout_sec=timeout_s):
            return False
        future = self.cancel_client.call_async(Trigger.Request())
        self.spin_until(future.done, timeout_s)
        return future.done() and future.result().success


def image_message(path):
    """A CompressedImage of the file: JPEG/PNG as they are, anything else re-encoded as PNG.

    Raises ``ValueError`` with a one-line reason for a file that cannot be read (missing, a
    directory, no permission) or is not a whole image (empty, truncated, corrupt, not an image).
    """
    import cv2
    import numpy as np
    from PIL import Image as PILImage

    from orin_llm_node.ros.cameras.ros_image import compressed_kind

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f'{path}: cannot read the image file ({exc.strerror or exc})') from None
    if not data:
        raise ValueError(f'{path}: the image file is empty')
    msg = CompressedImage()
    kind = compressed_kind(data)
    if kind is not None:
        # Sent as it is: decode it whole first, so that a truncated or corrupt file fails here
        # with its reason rather than on the node (Pillow refuses truncated data; OpenCV would
        # fill the missing rows with grey).
        try:
            with PILImage.open(io.BytesIO(data)) as img:
                img.load()
        except (OSError, ValueError, SyntaxError, PILImage.DecompressionBombError) as exc:
            raise ValueError(f'{path}: not a whole {kind} image ({exc})') from None
        msg.format = kind
    else:
        try:
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        except cv2.error:
            bgr = None
        if bgr is None:
            raise ValueError(f'{path}: not an image OpenCV can read')
        ok, png = cv2.imencode('.png', bgr)     # lossless: the node sees the file's pixels
        if not ok:
            raise ValueError(f'{path}: could not be encoded as PNG')
        msg.format, data = 'png', png.tobytes()
    msg.data = array.array('B', data)
    return msg
