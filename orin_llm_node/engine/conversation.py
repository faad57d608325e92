# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A conversation: one token history (system prompt, then turns), its media and messages.

The history changes only through the conversation's methods (open a turn, append a generated
token, close the turn, drop the oldest turns, go back to a checkpoint). How a turn's tokens are
built from the chat template: ``orin_llm_node.processing.prompt``. The KV blocks holding the
history are the KV cache manager's books (``KVBlocks``); the conversation only reads them.
"""

from dataclasses import dataclass
import itertools

from orin_llm_node.processing import ImageRef, PromptPiece, VideoRef

_ids = itertools.count()


@dataclass
class _Segment:
    # A run of the history (the system prompt, or one turn with its answer): its messages, its
    # length in tokens and its images and clips at offsets relative to the run's first token.
    messages: list[dict]
    num_tokens: int
    media: list[tuple[int, ImageRef | VideoRef]]


class Conversation:
    """One chat's history, made by ``LLMEngine.new_conversation``."""

    def __init__(self, system: PromptPiece, kv):
        self.id = next(_ids)
        self._token_ids = list(system.token_ids)
        self._segments = [_Segment(list(system.messages), len(system.token_ids),
                                   list(system.media))]
        self.kv = kv  # its KVCacheManager's KVBlocks: written by the manager only
        self._tools = None  # the tools its system turn renders

    # ---- reading -------------------------------------------------------------------------

    @property
    def token_ids(self) -> list[int]:
        """The whole history (read-only: change it through the methods)."""
        return self._token_ids

    @property
    def block_table(self) -> list[int]:
        """The KV blocks holding the history, in order (read-only)."""
        return self.kv.ids

    @property
    def num_kv_tokens(self) -> int:
        """Leading tokens of the history whose K/V are in ``block_table``."""
        return self.kv.num_tokens

    @property
    def num_turns(self) -> int:
        """User turns in the history (the system prompt excluded)."""
        return len(self._segments) - 1

    @property
    def system_prompt(self) -> str | None:
        """The system prompt's text (None: none)."""
        messages = self._segments[0].messages
        return messages[0]['content'] if messages else None

    @property
    def tools(self) -> list[dict] | None:
        """The tools its system turn renders (None: none); see :meth:`replace_system`."""
        return self._tools

    def pending_tool_calls(self) -> list[dict]:
        """The calls of the last answer (OpenAI ``tool_calls`` entries; empty when none)."""
        messages = self._segments[-1].messages if len(self._segments) > 1 else []
        if messages and messages[-1]['role'] == 'assistant':
            return list(messages[-1].get('tool_calls', []))
        return []

    def turn_lengths(self) -> list[int]:
        """Tokens of the system prompt, then of each turn, oldest first."""
        return [seg.num_tokens for seg in self._segments]

    def messages(self) -> list[dict]:
        """HF-style messages of the whole history."""
        return [m for seg in self._segments for m in seg.messages]

    def media_spans(self) -> list[tuple[int, ImageRef | VideoRef]]:
        """(first pad token index, image or clip) of every item in ``token_ids``, in order."""
        return self._spans(self._segments)

    def without_oldest(self, num_turns: int, turn: PromptPiece):
        """(token ids, image spans) of the history less its oldest ``num_turns``, plus ``turn``.

        Pure: what the prompt would be if those turns were dropped.
        """
        start = sum(seg.num_tokens for seg in self._segments[:1 + num_turns])
        system = self._segments[0].num_tokens
        tokens = [*self._token_ids[:system], *self._token_ids[start:], *turn.token_ids]
        kept = [self._segments[0], *self._segments[1 + num_turns:]]
        spans = self._spans(kept)
        spans.extend((len(tokens) - len(turn.token_ids) + off, img) for off, img in turn.media)
        return tokens, spans

    @staticmethod
    def _spans(segments) -> list[tuple[int, ImageRef | VideoRef]]:
        spans, base = [], 0
        for seg in segments:
            spans.extend((base + off, img) for off, img in seg.media)
            base += seg.num_tokens
        return spans

    # ---- changing ------------------------------------------------------------------------

    def open_turn(self, turn: PromptPiece) -> None:
        """Append a user turn (up to the assistant generation prompt)."""
        self._token_ids.extend(turn.token_ids)
        self._segments.append(_Segment(list(turn.messages), len(turn.token_ids),
                                       list(turn.media)))

    def append_token(self, token_id: int) -> None:
        """Append one generated token to the open turn."""
        self._token_ids.append(token_id)
        self._segments[-1].num_tokens += 1

    def close_turn(self, answer: str, end_id: int, tool_calls=None) -> None:
        """End the open turn with ``answer``; its ids end with ``end_id`` (<|im_end|>).

        ``tool_calls``: the answer's calls (``[{id, name, arguments}]``); the message then
        holds them as OpenAI's ``tool_calls`` and ``answer`` is the text outside them.
        """
        if self._token_ids[-1] != end_id:
            self.append_token(end_id)
        message = {'role': 'assistant', 'content': answer}
        if tool_calls:
            message['tool_calls'] = [
                {'id': c['id'], 'type': 'function',
                 'function': {'name': c['name'], 'arguments': c['arguments']}}
                for c in tool_calls]
        self._segments[-1].messages.append(message)

    def replace_system(self, system: PromptPiece, tools) -> None:
        """Put ``system`` (rendered with ``tools``) in place of the system turn; turns stay.

        The KV blocks must have been released first: every later block's hash chains over it.
        """
        if self.kv.ids:
            raise RuntimeError("release the conversation's blocks before rewriting its history")
        old = self._segments[0].num_tokens
        self._token_ids = [*system.token_ids, *self._token_ids[old:]]
        self._segments = [_Segment(list(system.messages), len(system.token_ids),
                                   list(system.media)), *self._segments[1:]]
        self._tools = tools

    def checkpoint(self) -> tuple:
        """The history as it is now, for :meth:`restore` (the turns in it are never changed)."""
        return list(self._token_ids), list(self._segments), self._tools

    def restore(self, checkpoint: tuple) -> None:
        """Go back to ``checkpoint``'s history (turns opened since gone, dropped ones back).

        The KV blocks must have been released first.
        """
        if self.kv.ids:
            raise RuntimeError("release the conversation's blocks before rewriting its history")
        tokens, segments, self._tools = checkpoint
        self._token_ids, self._segments = list(tokens), list(segments)

    def drop_oldest(self, num_turns: int) -> None:
        """Forget the oldest ``num_turns`` turns (the system prompt stays).

        The KV blocks must have been released first: their hashes chain over the dropped turns.
        """
        if self.kv.ids:
            raise RuntimeError("release the conversation's blocks before rewriting its history")
        if num_turns:
            self._token_ids, _ = self.without_oldest(num_turns, PromptPiece([], []))
            del self._segments[1:1 + num_turns]

    def reset(self) -> None:
        """Back to the system prompt only (the blocks must have been released)."""
        self.drop_oldest(self.num_turns)
