# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat``: ask the running node one question and print the streamed answer.

    orin_llm_chat "What is in front of you?"
    orin_llm_chat --image shelf.jpg "How many boxes are on the shelf?"
    orin_llm_chat -n /robot1/orin_llm --timeout 120 "Is the path clear?"

The on-robot counterpart of ``ros2 topic pub --once .../prompt`` + ``ros2 topic echo
.../response``: waits for the node's latched ``ready``, publishes the image (JPEG/PNG files go
out as they are on ``image/compressed``, anything else OpenCV reads as rgb8 on ``image``) and
the prompt, prints ``response/stream`` as it arrives and exits when ``response`` comes.
Ctrl-C cancels the answer on the node.  Exit status: 0 answered, 1 error or timeout.
"""

import argparse
import array
from pathlib import Path
import sys
import time

import rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

_RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                       reliability=ReliabilityPolicy.RELIABLE)
_STREAM = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                     reliability=ReliabilityPolicy.RELIABLE)
_LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


class LLMClient(Node):
    """Talks to one ``orin_llm`` node (topics under ``namespace``)."""

    def __init__(self, namespace='/orin_llm', node_name='orin_llm_chat', **kwargs):
        super().__init__(node_name, **kwargs)
        ns = '/' + namespace.strip('/') if namespace.strip('/') else ''
        self.topic = lambda name: f'{ns}/{name}'
        self.ready = False
        self.deltas = []
        self.responses = []
        self.errors = []
        self.diagnostics = []
        self.on_delta = None
        self.on_error = None
        self.pub_prompt = self.create_publisher(String, self.topic('prompt'), _RELIABLE)
        self.pub_image = self.create_publisher(Image, self.topic('image'), _RELIABLE)
        self.pub_compressed = self.create_publisher(CompressedImage,
                                                    self.topic('image/compressed'), _RELIABLE)
        self.create_subscription(Bool, self.topic('ready'), self._on_ready, _LATCHED)
        self.create_subscription(String, self.topic('response/stream'), self._on_delta, _STREAM)
        self.create_subscription(String, self.topic('response'), self._on_response, _RELIABLE)
        self.create_subscription(String, self.topic('error'), self._on_error, _RELIABLE)
        self.cancel_client = self.create_client(Trigger, self.topic('cancel'))

    def _on_ready(self, msg):
        self.ready = msg.data

    def _on_delta(self, msg):
        self.deltas.append(msg.data)
        if self.on_delta:
            self.on_delta(msg.data)

    def _on_response(self, msg):
        self.responses.append(msg.data)

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
        """Wait for the latched ``ready`` and for the node's subscriptions to match ours."""
        return self.spin_until(
            lambda: self.ready and self.pub_prompt.get_subscription_count() > 0
            and self.pub_image.get_subscription_count() > 0, timeout_s)

    def send_image(self, msg):
        """Publish an Image or CompressedImage and give DDS a moment to deliver it."""
        pub = self.pub_compressed if isinstance(msg, CompressedImage) else self.pub_image
        pub.publish(msg)
        # The image must arrive before the prompt (they travel on different topics).
        self.spin_until(lambda: False, 0.3)

    def ask(self, text, timeout_s):
        """Publish ``text`` and wait for its ``response``; returns the answer or None."""
        before = len(self.responses)
        self.deltas = []
        self.pub_prompt.publish(String(data=text))
        if not self.spin_until(lambda: len(self.responses) > before, timeout_s):
            return None
        return self.responses[before]

    def stream_rest(self, answer, timeout_s=2.0):
        """Wait for deltas still in flight after ``answer``; return the part not streamed.

        ``response`` and ``response/stream`` are different topics, so the last deltas may land
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
    """A CompressedImage (JPEG/PNG file, sent as is) or an rgb8 Image read with OpenCV."""
    data = Path(path).read_bytes()
    if data[:3] == b'\xff\xd8\xff' or data[:8] == b'\x89PNG\r\n\x1a\n':
        msg = CompressedImage()
        msg.format = 'jpeg' if data[:3] == b'\xff\xd8\xff' else 'png'
        msg.data = array.array('B', data)
        return msg
    import cv2
    import numpy as np

    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f'{path}: not an image OpenCV can read')
    from orin_llm_node.ros_image import rgb_to_image
    return rgb_to_image(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), Image)


def main(args=None):
    """Entry point of ``orin_llm_chat``."""
    parser = argparse.ArgumentParser(prog='orin_llm_chat', description=__doc__.split('\n')[0])
    parser.add_argument('prompt', nargs='+', help='the question (words are joined)')
    parser.add_argument('-i', '--image', help='image file to send with the prompt')
    parser.add_argument('-n', '--namespace', default='/orin_llm',
                        help='namespace of the node (default: /orin_llm, as the launch file)')
    parser.add_argument('--timeout', type=float, default=300.0,
                        help='seconds to wait for the node and for the answer (default 300)')
    argv = sys.argv[1:] if args is None else list(args)
    ros_args = remove_ros_args(['orin_llm_chat'] + argv)[1:]
    opts = parser.parse_args(ros_args)
    image = None
    if opts.image:
        try:
            image = image_message(opts.image)
        except (OSError, ValueError) as exc:
            print(f'orin_llm_chat: {exc}', file=sys.stderr)
            return 1
    # No rclpy signal handlers: Ctrl-C must leave the context up so that we can call cancel.
    rclpy.init(args=['orin_llm_chat'] + argv, signal_handler_options=SignalHandlerOptions.NO)
    client = LLMClient(opts.namespace)
    client.on_delta = lambda d: print(d, end='', flush=True)
    client.on_error = lambda e: print(f'\n[error] {e}', file=sys.stderr, flush=True)
    code = 1
    try:
        if not client.wait_ready(opts.timeout):
            print(f'orin_llm_chat: no ready node under {opts.namespace} after {opts.timeout:g} s'
                  ' (is it running? same ROS_DOMAIN_ID?)', file=sys.stderr)
            return 1
        if image is not None:
            client.send_image(image)
        answer = client.ask(' '.join(opts.prompt), opts.timeout)
        if answer is None:
            print(f'\norin_llm_chat: no answer after {opts.timeout:g} s', file=sys.stderr)
        else:
            print(client.stream_rest(answer))
            code = 0
    except KeyboardInterrupt:
        if rclpy.ok(context=client.context):
            client.cancel()
        print('\n(cancelled)', file=sys.stderr)
        code = 130
    finally:
        client.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == '__main__':
    sys.exit(main())
