# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What shapes one answer, and what it yields: a response format, grounding boxes, tool calls.

``AnswerShape.build`` reads a turn's request (``SamplingParams.response_format`` / ``detect`` /
``tools`` + ``tool_choice``, and ``tool_results``) before anything changes: the grammar the
sampler applies, the user text (``detect``'s grounding prompt when the caller gives none), the
tool results in the order of the calls they answer, the system turn a change of tools needs.
``AnswerShape.outcome`` turns the finished answer into ``tool_calls``, ``detections``, the
finish reason (``tool_calls`` when the answer ends on calls) and the assistant message's text.
"""

from dataclasses import dataclass, field

import numpy as np

from orin_llm_node.processing.grounding import box_list_schema, detections, grounding_prompt
from orin_llm_node.processing.tools import check_tool_choice

from .finish_reason import FinishReason
from .tool_calls import ToolCalls, order_results

__all__ = ['AnswerShape', 'Outcome']


@dataclass
class Outcome:
    """What a finished answer yields besides its text (see ``ChatResult``)."""

    finish: str
    content: str
    tool_calls: list[dict] = field(default_factory=list)
    detections: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class AnswerShape:
    """One turn's answer shape (built by :meth:`build`).

    ``response_format``: the format the answer is parsed with (the request's, or ``detect``'s
    box list); ``grammar``: what the sampler applies (None: free); ``tool_calls``: the tool-call
    decoder when tools are given; ``text``: the user message (None: none); ``tool_results``:
    ``(call id, content)`` in call order; ``frame_size``: ``(height, width)`` of ``detect``'s
    image; ``tools_changed``: the conversation's system turn must be rendered with ``tools``.
    """

    response_format: dict | None
    grammar: object
    tool_calls: ToolCalls | None
    text: object
    tool_results: list
    frame_size: tuple[int, int] | None
    tools: list[dict] | None
    tools_changed: bool

    @classmethod
    def build(cls, conv, text, images, sampling, tool_results, grammar_for, vocabulary,
              tokenizer) -> 'AnswerShape':
        """The shape of a turn of ``conv``; ``ValueError`` says what is wrong with the request.

        ``grammar_for(fmt)``: the engine's fresh matcher of a response format;
        ``vocabulary()``: its ``GrammarTokenizer``; ``tokenizer``: the checkpoint's.
        """
        fmt, frame_size = sampling.response_format, None
        if sampling.detect is not None:
            frames = [p for p in [*(images or []), *_list(text)] if isinstance(p, np.ndarray)]
            if len(frames) != 1:
                raise ValueError(f'detect takes exactly one image in its turn (the frame the '
                                 f'boxes are in), got {len(frames)}')
            frame_size = tuple(frames[0].shape[:2])
            fmt = {'type': 'json_schema', 'schema': box_list_schema(sampling.detect)}
            if text is None:
                text = grounding_prompt(sampling.detect)
        ordered = []
        if tool_results is not None:
            ordered = order_results(tool_results, conv.pending_tool_calls())
        elif text is None:
            raise ValueError('text must be a str, got NoneType (or give tool_results)')
        tools, calls = sampling.tools, None
        if tools is not None:
            choice = check_tool_choice(sampling.tool_choice, tools)
            calls = ToolCalls(tools, choice, vocabulary(), tokenizer)
        grammar = calls if calls is not None else grammar_for(fmt)
        return cls(fmt, grammar, calls, text, ordered, frame_size, tools, tools != conv.tools)

    def outcome(self, finish: str, text: str, parsed, stop_ids) -> Outcome:
        """What the answer ``text`` (ended by ``finish``; ``parsed``: its valid JSON) yields."""
        out = Outcome(finish, text)
        if finish == FinishReason.ERROR:
            return out
        if self.tool_calls is not None:
            try:
                out.tool_calls = self.tool_calls.calls()
            except ValueError as exc:  # a call's JSON nests deeper than Python parses
                out.finish, out.error = FinishReason.ERROR, str(exc)
                return out
            if out.tool_calls:
                out.content = self.tool_calls.content()
                if finish == FinishReason.STOP and self.tool_calls.ends_on_calls(stop_ids):
                    out.finish = FinishReason.TOOL_CALLS
        if self.frame_size is not None and parsed is not None:
            out.detections = detections(parsed, self.frame_size)
        return out


def _list(text) -> list:
    return list(text) if isinstance(text, (list, tuple)) else []
