# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A request's history that the server does not hold, written into a new conversation.

Each earlier turn goes in as the chat template renders it: the user message up to the
assistant's generation prompt, the answer tokenized as text, closed with ``<|im_end|>`` (as
``LLMEngine`` keeps an answered turn). Nothing is generated; the next turn's prefill computes
the KV (from the prefix cache where it has these tokens).

What this costs stays linear in the history, whatever its length:

* a user message is rendered after the turn before it alone (and the system message), not
  after the whole history: rendering turn *k* after *k* turns made a history of *N* turns cost
  O(N²) renders. One render of the whole history then checks that the template renders each
  turn the same either way; a template that looks across turns gets the whole history per
  turn, as before.
* turns that cannot fit within ``max_model_len`` beside the new message (the engine would drop
  them, oldest first) are left out before anything is rendered or tokenized, by a floor on the
  tokens a text takes (:class:`TokenFloor`); so is a new message whose text alone cannot fit.
"""

import math

from orin_llm_node.serve.chat_request import decoded

__all__ = ['TokenFloor', 'check_fits', 'replay']

#: How much NFC normalisation (the Qwen tokenizers') can shorten UTF-8 text: a Hangul syllable
#: written as its three jamo (9 bytes) composes to one code point (3 bytes).
_NFC_SHRINK = 3


class TokenFloor:
    """The fewest tokens a text can take, from its UTF-8 length and the tokenizer's vocabulary.

    No token stands for more than ``max_token_bytes`` bytes of text (its longest decoded
    token, plus one byte for a decoder that drops a leading space), so a text of ``n`` bytes
    takes at least ``n / (max_token_bytes * 3)`` tokens (NFC can shorten it threefold).
    """

    def __init__(self, tokenizer):
        longest = max(len(tokenizer.decode([i], skip_special_tokens=False)
                          .encode('utf-8', 'surrogatepass'))
                      for i in range(tokenizer.vocab_size))
        self.bytes_per_token = (longest + 1) * _NFC_SHRINK

    def of(self, parts) -> int:
        """The floor of the text parts among ``parts`` (str; anything else counts 0)."""
        size = sum(len(p.encode('utf-8', 'surrogatepass')) for p in parts if isinstance(p, str))
        return math.ceil(size / self.bytes_per_token)


def check_fits(floor: TokenFloor, parts, max_model_len: int) -> None:
    """``ValueError`` (``context_full: ...``) when the text of a new message cannot fit."""
    least = floor.of(parts)
    if least >= max_model_len:
        raise ValueError(f"context_full: the message's text takes at least {least} tokens; "
                         f'max_model_len is {max_model_len}')


def replay(engine, conv, exchanges, floor: TokenFloor, room: int) -> None:
    """Write ``exchanges`` ((user parts, answer), oldest first) into ``conv``, a new one.

    ``room``: tokens left within ``max_model_len`` for them beside the system prompt and the
    new message (its floor); the oldest exchanges that cannot fit in it are left out.
    """
    kept = _newest_that_fit(exchanges, floor, room)
    system = conv.messages()
    prompts = engine.prompts
    turns = _pieces(prompts, system, kept, window=True)
    if not _renders_the_same(prompts.template, system, turns):
        turns = _pieces(prompts, system, kept, window=False)
    end = engine.tokenizer.im_end_id
    for piece, answer in turns:
        conv.open_turn(piece)
        for token in engine.tokenizer.encode_text(answer):
            conv.append_token(token)
        conv.close_turn(answer, end)


def _newest_that_fit(exchanges, floor: TokenFloor, room: int) -> list:
    # Each exchange takes at least its text's floor and the <|im_end|> closing its answer.
    start, used = len(exchanges), 0
    while start > 0:
        parts, answer = exchanges[start - 1]
        used += floor.of([*parts, answer]) + 1
        if used > room:
            break
        start -= 1
    return exchanges[start:]


def _pieces(prompts, system: list[dict], exchanges, window: bool) -> list:
    # (user turn piece, answer) of each exchange, rendered after the exchange before it
    # (``window``) or after the whole history so far.
    turns, history, before = [], list(system), []
    for parts, answer in exchanges:
        piece = prompts.user_turn([*system, *before] if window else history, decoded(parts), [])
        said = [*piece.messages, {'role': 'assistant', 'content': answer}]
        turns.append((piece, answer))
        before = said
        if not window:
            history.extend(said)
    return turns


def _renders_the_same(template, system: list[dict], turns) -> bool:
    # Whether the template renders the whole history as the turns rendered one after another
    # (each after the one before it): one render of the whole, two small ones per turn.
    if not turns:
        return True
    whole, before = list(system), []
    text = template.render(system, add_generation_prompt=False) if system else ''
    for piece, answer in turns:
        said = [*piece.messages, {'role': 'assistant', 'content': answer}]
        window = [*system, *before]
        head = template.render(window, add_generation_prompt=False) if window else ''
        rendered = template.render([*window, *said], add_generation_prompt=False)
        if not rendered.startswith(head):
            return False
        text += rendered[len(head):]
        whole.extend(said)
        before = said
    return template.render(whole, add_generation_prompt=False) == text
