# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the node promises on the wire: its topic and service names, their QoS, ``response/info``.

The node (node.py, node_replies.py, cameras/intake.py) and its clients (``orin_llm_chat``, the
demo) read the names and QoS from here, so both sides of a topic always match.
:class:`AnswerInfo` is the one ``response/info`` record: every prompt gets exactly one, built by
one of its three constructors (:meth:`~AnswerInfo.answered`, :meth:`~AnswerInfo.failed`,
:meth:`~AnswerInfo.refused`) and sent as strict JSON (:meth:`~AnswerInfo.to_json`; README: the
schema).

No rclpy at import: the QoS profiles are built on request (:meth:`Topic.qos`), so the session
and its in-process tests use :class:`AnswerInfo` without a ROS installation being loaded.
"""

from dataclasses import dataclass, field
import json

from orin_llm_node.valid_text import valid_text


@dataclass(frozen=True)
class Topic:
    """A topic of the node: its name and QoS (always reliable).

    ``name`` is relative (under the node's namespace) unless it starts with ``/``; ``latched``:
    transient local, so a late subscriber gets the last message.
    """

    name: str
    depth: int
    latched: bool = False

    def qos(self):
        """The ``rclpy.qos.QoSProfile`` of this topic (publishers and subscriptions alike)."""
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        return QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=self.depth,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=(DurabilityPolicy.TRANSIENT_LOCAL if self.latched
                        else DurabilityPolicy.VOLATILE))


# Deep enough that DDS never drops a prompt while the executor is busy: every prompt reaches
# the node, where an overflow of its own queue (queue_size) is reported.
PROMPT = Topic('prompt', 1000)
PROMPT_JSON = Topic('prompt/json', 1000)
RESPONSE = Topic('response', 10)
STREAM = Topic('response/stream', 100)
INFO = Topic('response/info', 10)
ERROR = Topic('error', 10)
READY = Topic('ready', 1, latched=True)
# vision_msgs/Detection2DArray of a detect request's boxes, where vision_msgs is installed.
DETECTIONS = Topic('detections', 10)
DIAGNOSTICS = Topic('/diagnostics', 10)
# A client's frames for the default camera (image_topics: [image]) on ``image`` and
# ``image/compressed`` (orin_llm_chat --image / --video, the demo): reliable, and deep enough
# that a clip's frames wait in the writer for their acknowledgements instead of replacing each
# other.
CLIENT_IMAGES = Topic('image', 10)
# Opened by activate (std_srvs/Trigger): forget the conversation; stop the answer in progress.
RESET = 'reset'
CANCEL = 'cancel'
# Requests the node's services and the ask action's goal, cancel and result services hold while
# the executor is busy: DDS keeps only the newest ``depth`` of them (rclpy's default is 10), and
# an older one is lost without a word.  As deep as the prompt topics, so every goal and call
# reaches the node, which answers each one (a goal beyond queue_size is refused with the reason).
REQUEST_DEPTH = 1000
# The ask action (orin_llm_node/action/Ask), relative like the services: /orin_llm/ask under the
# launch file's namespace.  Open in every state: a goal the node cannot take is refused with why.
ASK = 'ask'


def request_qos():
    """QoS of the node's services and of its action's services (:data:`REQUEST_DEPTH` deep).

    A client sending many requests at once needs the same on its side (its responses).
    """
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=REQUEST_DEPTH,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def image_qos(reliable):
    """QoS of one of a camera's image subscriptions: the newest frame only (depth 1)."""
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=(ReliabilityPolicy.RELIABLE if reliable
                                   else ReliabilityPolicy.BEST_EFFORT))


@dataclass(frozen=True)
class CameraReport:
    """The camera part of one ``response/info`` (cameras/camera_report.py builds it).

    ``image`` / ``missing``: the first camera's frame and why it gave none; ``fields``: the
    ``cameras``, ``camera_sync`` and ``video`` entries, in that order.
    """

    image: dict | None
    missing: str | None
    fields: dict


@dataclass(frozen=True)
class AnswerInfo:
    """One ``response/info`` object: what one prompt got (README: the schema).

    ``kind``: ``answered`` (the engine ran the prompt; ``error`` is set when it refused it
    for the context or the pool, or failed while it ran), ``failed`` (the session could not run
    it: bad input, an internal error) or ``refused`` (never queued: empty, too long, a full
    queue, a node not active, a bad envelope).  Only an answer carries the token counts,
    latency, weight format, ``no_image``, ``backend`` and the server's ``model`` (None on the
    local backend); the camera part is there whenever it was taken.  A count or time a
    server does not report is None (null), never guessed.
    """

    kind: str
    request_id: int
    prompt: str | None
    finish_reason: str
    error: str | None = None
    text: str | None = None
    image: dict | None = None
    no_image: str | None = None
    cameras: dict | None = None
    generated_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0
    weight_format: str = ''
    tag: str | None = None
    valid: bool | None = None
    parsed: object = None           # the constrained answer as JSON (``json``)
    # The answer's tool calls ([{id, name, arguments}]; empty: none) and, for a detect request,
    # its boxes in each camera frame's pixels (ros/detections.py; None: not a detect request).
    tool_calls: list = field(default_factory=list)
    detections: list | None = None
    backend: str = 'local'          # what answered: local | openai
    model: str | None = None        # the model name the server answered with

    @classmethod
    def answered(cls, request, result, cameras, weight_format, detections=None,
                 backend='local', model=None):
        """The engine's ``result`` for ``request`` (``cameras``: its :class:`CameraReport`).

        ``result``: an ``LLMEngine`` ``ChatResult`` or a server's ``RemoteResult`` (token ids
        only when the server returns them, its ``usage`` counts otherwise). ``detections``: a
        detect request's boxes, as ros/detections.py gives them.
        """
        return cls(
            'answered', request.request_id, request.text, result.finish_reason,
            error=result.error, text=None if result.error else result.text,
            image=cameras.image, no_image=cameras.missing, cameras=cameras.fields,
            generated_tokens=_count(result.token_ids, result, 'completion_tokens'),
            cached_tokens=result.cached_tokens,
            prompt_tokens=_count(result.prompt_token_ids, result, 'prompt_tokens'),
            ttft_ms=round(1000.0 * result.ttft_s, 3),
            decode_tok_s=None if result.decode_tok_s is None else round(result.decode_tok_s, 3),
            weight_format=weight_format or None, tag=_tag(request.envelope), valid=result.valid,
            parsed=result.parsed, tool_calls=list(result.tool_calls),
            detections=detections, backend=backend, model=model)

    @classmethod
    def failed(cls, request, reason, cameras):
        """``request`` could not be run: ``reason`` (``finish_reason`` ``error``)."""
        return cls('failed', request.request_id, request.text, 'error', error=reason,
                   cameras=cameras.fields, tag=_tag(request.envelope))

    @classmethod
    def refused(cls, request_id, prompt, reason, tag=None, cameras=None):
        """A prompt never queued, and why (``cameras``: what they gave it, when asked)."""
        return cls('refused', request_id, prompt, 'refused', error=reason,
                   cameras=None if cameras is None else cameras.fields, tag=tag)

    def to_json(self):
        """The JSON text, strict: a NaN or infinity anywhere raises ``ValueError``.

        Every number is finite by construction (the engine's parse maps a number beyond a
        float's range to null): a bug that breaks that must not reach a client as ``NaN``.
        Every string is valid Unicode (valid_text.py): a lone surrogate from a server or in a
        model's JSON answer is U+FFFD here, so the record can always be published.
        """
        out = {'request_id': self.request_id, 'prompt': self.prompt, 'text': self.text,
               'image': self.image}
        if self.kind == 'answered':
            out['no_image'] = self.no_image
        out.update(self.cameras or {})
        out.update(finish_reason=self.finish_reason, error=self.error)
        if self.kind == 'answered':
            out.update(generated_tokens=self.generated_tokens, cached_tokens=self.cached_tokens,
                       prompt_tokens=self.prompt_tokens, ttft_ms=self.ttft_ms,
                       decode_tok_s=self.decode_tok_s, weight_format=self.weight_format,
                       backend=self.backend, model=self.model)
        if self.tag is not None:
            out['tag'] = self.tag
        if self.valid is not None:
            out.update(valid=self.valid, json=self.parsed)
        if self.tool_calls:
            out['tool_calls'] = self.tool_calls
        if self.detections is not None:
            out['detections'] = self.detections
        return valid_text(json.dumps(out, ensure_ascii=False, allow_nan=False))


def _tag(envelope):
    return (envelope or {}).get('tag')


def _count(ids, result, reported):
    # Tokens counted from their ids, else the server's own count (usage), else unknown.
    return len(ids) if ids is not None else getattr(result, reported, None)
