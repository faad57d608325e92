# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat``: ask the running node one question and print its answer.

    orin_llm_chat "What is in front of you?"
    orin_llm_chat --image shelf.jpg "How many boxes are on the shelf?"
    orin_llm_chat -n /robot1/orin_llm --timeout 120 "Is the path clear?"
    orin_llm_chat --image shelf.jpg --schema box.schema.json "Which box should I pick up?"
    orin_llm_chat --json "List the objects you see."
    orin_llm_chat --video frames/ --fps 2 "Which way did the person go?"
    orin_llm_chat --action --image shelf.jpg "How many boxes are on the shelf?"

The on-robot counterpart of ``ros2 topic pub --once .../prompt`` + ``ros2 topic echo
.../response``: waits for the node's latched ``ready``, sends the image as a
``sensor_msgs/CompressedImage`` on ``image/compressed`` (JPEG/PNG files as they are, anything
else OpenCV reads re-encoded as PNG: a compressed frame is small, so it arrives whatever the
DDS transport), waits until the node's reader has acknowledged it, publishes the prompt and
prints the answer that ``response/info`` names as the answer to *this* prompt, then its finish
reason on stderr.  Whether the node used the image is judged from that ``response/info`` alone
(a DDS acknowledgement can come late); only when nothing subscribes to the image topic does it
say the topic is probably remapped.  ``--video`` sends a clip instead: the directory's image
files in name order (or comma-separated files) as CompressedImages sent at ``fps``, stamped
``1 / fps`` apart, then the prompt on ``prompt/json`` asking for the seconds they span
(``video_s``); the node's ``video_buffer_s`` and ``video_fps`` are read first (its parameter
service), and a clip longer than the node keeps is refused with one line before anything is
sent.  Ctrl-C cancels the answer on the node.  Exit status: 0 answered (with the
image, when one was given), 1 error (one line: an unreadable image file, no node, timeout,
refusal, or an answer produced without the image), 2 bad arguments (one line, e.g. a
``--schema`` file that is not a JSON object or is nested deeper than the node takes).

``--schema FILE`` (a JSON Schema) / ``--json`` (any JSON object) send the question as a
``prompt/json`` request envelope with that ``response_format``, match the answer by its
``tag`` and print the parsed JSON; an answer that did not complete (``"valid": false``, e.g.
``finish_reason=length``) exits 1.

``--tools FILE`` (``--tool-choice``, ``--tool-results FILE``) and ``--detect LABELS``: tool
calls and grounding boxes printed as JSON lines (chat_tools.py).

``--action`` asks through the node's ``ask`` action instead (chat_action.py): stage lines on
stderr, the text on stdout as it comes, Ctrl-C cancels that goal.
"""

import argparse
import json
import os
import sys
import time

import rclpy
from rclpy.duration import Duration
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args

from orin_llm_node.cli import chat_tools, chat_video
from orin_llm_node.cli.chat_client import LLMClient, image_message
from orin_llm_node.parameters import MAX_PROMPT_CHARS
from orin_llm_node.ros import contract


def _image_verdict(info, msg):
    """None when ``info`` says our image was paired, else why the answer did without it."""
    image = info.get('image')
    if image is not None and image.get('frame_id') == msg.header.frame_id:
        return None
    if image is not None:
        return 'the node paired another image with the prompt'
    return info.get('no_image') or 'the node did not pair an image with the prompt'


def main(args=None):
    """Entry point of ``orin_llm_chat``."""
    parser = argparse.ArgumentParser(prog='orin_llm_chat', description=__doc__.split('\n')[0])
    parser.add_argument('prompt', nargs='*', help='the question (words are joined)')
    parser.add_argument('-i', '--image', help='image file to send with the prompt')
    parser.add_argument('-n', '--namespace', default='/orin_llm',
                        help='namespace of the node (default: /orin_llm, as the launch file)')
    parser.add_argument('--image-topic', default=None,
                        help='CompressedImage topic the node reads (default: '
                             "<namespace>/image/compressed; with the launch file's "
                             'image_topic:=T, T/compressed)')
    parser.add_argument('--video', metavar='DIR_OR_FILES',
                        help='send a clip: a directory of frames (name order) or '
                             'comma-separated frame files; the prompt asks for its seconds')
    parser.add_argument('--fps', type=float, default=2.0,
                        help='frames per second of --video (default 2)')
    parser.add_argument('--timeout', type=float, default=300.0,
                        help='seconds to wait for the node and for the answer (default 300)')
    parser.add_argument('--action', action='store_true',
                        help="ask through the node's ask action: stage lines on stderr, text "
                             'as it comes; Ctrl-C cancels the goal')
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument('--schema', metavar='FILE',
                     help='answer as JSON valid against this JSON Schema file (prompt/json)')
    fmt.add_argument('--json', action='store_true',
                     help='answer as a JSON object (prompt/json)')
    chat_tools.add_arguments(parser)
    argv = sys.argv[1:] if args is None else list(args)
    ros_args = remove_ros_args(['orin_llm_chat'] + argv)[1:]
    opts = parser.parse_args(ros_args)
    image = clip = None
    if opts.image and opts.video:
        parser.error('--image and --video exclude each other')
    if opts.action and opts.video:
        parser.error('--action sends a question with at most one --image (no --video)')
    if opts.action and (opts.tools is not None or opts.detect is not None):
        parser.error('--action sends a plain question: --tools and --detect go by prompt/json')
    if not opts.fps > 0:
        parser.error(f'--fps must be > 0, got {opts.fps:g}')
    try:
        opts.response_format = _response_format(opts)
        chat_tools.read(opts)
    except (OSError, ValueError) as exc:
        print(f'orin_llm_chat: {exc}', file=sys.stderr)
        return 2
    try:
        if opts.image:
            image = image_message(opts.image)
        if opts.video:
            clip = [image_message(path) for path in chat_video.video_files(opts.video)]
    except (OSError, ValueError) as exc:
        print(f'orin_llm_chat: {exc}', file=sys.stderr)
        return 1
    # No rclpy signal handlers: Ctrl-C must leave the context up so that we can call cancel.
    rclpy.init(args=['orin_llm_chat'] + argv, signal_handler_options=SignalHandlerOptions.NO)
    if opts.action:
        from orin_llm_node.cli import chat_action
        try:
            return chat_action.converse(opts, image, opts.response_format)
        finally:
            rclpy.try_shutdown()
    client = LLMClient(opts.namespace)
    client.on_error = lambda e: print(f'[node error] {e}', file=sys.stderr, flush=True)
    try:
        if clip is not None:
            return _converse_video(client, opts, clip)
        return _converse(client, opts, image)
    except KeyboardInterrupt:
        if rclpy.ok(context=client.context):
            client.cancel()
        print('\n(cancelled)', file=sys.stderr)
        return 130
    finally:
        client.destroy_node()
        rclpy.try_shutdown()


def _converse_video(client, opts, clip):
    if not client.wait_ready(opts.timeout):
        print(f'orin_llm_chat: no ready node under {opts.namespace} after {opts.timeout:g} s'
              ' (is it running? same ROS_DOMAIN_ID?)', file=sys.stderr)
        return 1
    settings, why = chat_video.node_video_settings(client, min(opts.timeout, 10.0))
    if settings is None:
        print(f"orin_llm_chat: cannot read the node's video settings ({why}): the clip is "
              'sent unchecked', file=sys.stderr)
    refusal = settings and chat_video.clip_refusal(len(clip), opts.fps, settings)
    if refusal:
        print(f'orin_llm_chat: {refusal}', file=sys.stderr)
        return 1
    frame_id = f'orin_llm_chat_{os.getpid()}_{time.time_ns()}'
    topic = opts.image_topic or client.topic(f'{contract.CLIENT_IMAGES.name}/compressed')
    period_ns = round(1e9 / opts.fps)
    # First the path: a reader can match our writer a DDS heartbeat (3 s) after our writer
    # matched it, and frames sent before that arrive late and stale (seen under load: a clip
    # of zero fresh frames).  One frame, stamped early enough that the clip's window leaves it
    # out and the node's ring keeps the clip's first frame, is sent until it is acknowledged.
    warm_ns = client.get_clock().now().nanoseconds
    opener = chat_video.stamp_clip([clip[0]], opts.fps, warm_ns, f'{frame_id}_path')[0]
    if not _image_taken(client, opener, topic):
        return 1
    first_ns = chat_video.clip_start_ns(warm_ns, client.get_clock().now().nanoseconds, opts.fps,
                                        settings and settings['video_fps'])
    chat_video.stamp_clip(clip, opts.fps, first_ns + (len(clip) - 1) * period_ns, frame_id)
    # Stamped from then on, 1/fps apart: the last stamps lie ahead of the node's clock by up
    # to the clip's length, so the clip is sent at its own pace (a stamp from the future is
    # refused), then asked for with the seconds it spans.
    # Each frame is published once, at its stamp (send_image's publish-until-acknowledged
    # would repeat frames and hold the clip back until its frames are stale); reliable
    # delivery retransmits a lost one.
    pub = client.image_publisher(type(clip[0]), topic)
    for msg in clip:
        ahead = (msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
                 - client.get_clock().now().nanoseconds) / 1e9
        if ahead > 0:
            client.spin_until(lambda: False, ahead)
        pub.publish(msg)
    # The prompt travels on another topic and the node's executor may take it before the
    # last frame's callback: wait (bounded, so the frames stay inside image_max_age_s) for
    # the frames to be acknowledged, then let the node's executor keep them.
    pub.wait_for_all_acked(Duration(seconds=1.0))
    client.spin_until(lambda: False, 0.2)
    # The node's "last video_s seconds" end at its newest kept frame: our last one.
    envelope = {'prompt': ' '.join(opts.prompt),
                'video_s': chat_video.clip_seconds(len(clip), opts.fps)}
    if opts.response_format is not None:
        envelope['response_format'] = opts.response_format
    info = client.ask_envelope(envelope, opts.timeout)
    if not _answered(info, opts):
        return 1
    print(info['text'])
    video = info.get('video') or {}
    print(f"[request {info['request_id']}: finish_reason={info['finish_reason']}, "
          f"{info.get('generated_tokens')} tokens, ttft {info.get('ttft_ms')} ms, clip "
          f"span {video.get('span_s')} s]", file=sys.stderr)
    return _used_or_said(chat_video.video_verdict(info, frame_id), 'clip')


def _converse(client, opts, image):
    if not client.wait_ready(opts.timeout):
        print(f'orin_llm_chat: no ready node under {opts.namespace} after {opts.timeout:g} s'
              ' (is it running? same ROS_DOMAIN_ID?)', file=sys.stderr)
        return 1
    if image is not None:
        # No stamp: the node ages the image from its arrival, so neither a slow hand-off nor
        # another machine's clock can make it stale; a unique frame_id names it in the answer.
        image.header.frame_id = f'orin_llm_chat_{os.getpid()}_{time.time_ns()}'
        topic = opts.image_topic or client.topic(f'{contract.CLIENT_IMAGES.name}/compressed')
        if not _image_taken(client, image, topic):
            return 1
    if opts.response_format is not None:
        return _converse_json(client, opts, image)
    if opts.tools is not None or opts.detect is not None:
        code, info = chat_tools.converse(client, opts, lambda i: _answered(i, opts))
        if code is not None:
            return code
        if opts.detect is not None:
            return 0        # every camera's newest frame: not a judgement on ours alone
        return _used_or_said(None if image is None else _image_verdict(info, image), 'image')
    info = client.ask_tagged(' '.join(opts.prompt), opts.timeout)
    if not _answered(info, opts):
        return 1
    print(info['text'])
    print(f"[request {info['request_id']}: finish_reason={info['finish_reason']}, "
          f"{info.get('generated_tokens')} tokens, ttft {info.get('ttft_ms')} ms]",
          file=sys.stderr)
    return _used_or_said(None if image is None else _image_verdict(info, image), 'image')


def _response_format(opts):
    """The ``response_format`` of ``--schema FILE`` / ``--json``, or None."""
    if opts.json:
        return {'type': 'json_object'}
    if opts.schema is None:
        return None
    schema = chat_tools.json_file(opts.schema, dict, 'a JSON object (a JSON Schema)',
                                  MAX_PROMPT_CHARS)
    return {'type': 'json_schema', 'schema': schema}


def _converse_json(client, opts, image):
    info = client.ask_envelope({'prompt': ' '.join(opts.prompt),
                                'response_format': opts.response_format}, opts.timeout)
    if not _answered(info, opts):
        return 1
    print(f"[request {info['request_id']}: finish_reason={info['finish_reason']}, "
          f"valid={str(info.get('valid')).lower()}, {info.get('generated_tokens')} tokens]",
          file=sys.stderr)
    if not info.get('valid'):
        print(info['text'])
        print(f"orin_llm_chat: the answer is incomplete (finish_reason="
              f"{info['finish_reason']}): not valid JSON for the schema", file=sys.stderr)
        return 1
    print(json.dumps(info['json'], ensure_ascii=False))
    return _used_or_said(None if image is None else _image_verdict(info, image), 'image')


def _image_taken(client, msg, topic):
    """Send an image; False (said on stderr) when nothing subscribes to ``topic``."""
    if client.send_image(msg, topic) != 'unmatched':
        return True
    print(f"orin_llm_chat: nothing subscribes to {topic}: is the node's image topic "
          'remapped? Pass --image-topic.', file=sys.stderr)
    return False


def _answered(info, opts):
    """Whether ``info`` is an answer; why not is said on stderr (no answer in time, refused)."""
    if info is None:
        print(f'orin_llm_chat: no answer after {opts.timeout:g} s', file=sys.stderr)
        return False
    if info.get('text') is None:
        print(f"orin_llm_chat: prompt refused (request {info.get('request_id')}): "
              f"{info.get('error')}", file=sys.stderr)
        return False
    return True


def _used_or_said(why, what):
    """Exit code: 0 when the answer used the caller's ``what``, else 1 with ``why`` on stderr."""
    if why is None:
        return 0
    print(f'orin_llm_chat: the answer above was produced WITHOUT your {what}: {why}',
          file=sys.stderr)
    return 1


if __name__ == '__main__':
    sys.exit(main())
