# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Next-token sampling: greedy, temperature, top-k, top-p, with a per-request seeded generator.

With a grammar (``SamplingParams.response_format``) only the tokens its bitmask allows can be
picked; the CUDA-graph decode applies that mask inside the graph (``ModelRunner``), the eager
path here.

A draw is Gumbel-max, not ``torch.multinomial``: on CUDA, multinomial over a row with a NaN or
with nothing allowed is a device-side assert that poisons the CUDA context for the rest of
the process. Such a row is refused before any draw (``NonFiniteLogits``), and the draw itself
is an argmax, which cannot assert.
"""

import math
import secrets

import numpy as np
import torch

from .config import SamplingParams
from .structured import apply_bitmask

#: Exponential draws are clamped to this (float32's smallest normal): an exact 0 would make
#: ``-log`` +inf, and +inf plus a masked -inf is NaN.
_TINY = float(torch.finfo(torch.float32).tiny)


class NonFiniteLogits(RuntimeError):
    """A step's logits leave no token to pick: NaN or +inf among them, or every one at -inf."""


def _check_finite(top: float) -> None:
    # ``top``: the row's maximum, NaN when any entry is NaN (torch.max propagates it), +inf when
    # any is +inf, -inf when every token is masked.
    if math.isnan(top):
        raise NonFiniteLogits("the model's logits hold NaN (overflow in a float16 or "
                              "bfloat16 layer, or a broken checkpoint): no token to pick")
    if top == math.inf:
        raise NonFiniteLogits("the model's logits hold +inf (overflow in a float16 or "
                              "bfloat16 layer, or a broken checkpoint): no token to pick")
    if top == -math.inf:
        raise NonFiniteLogits('every token is masked at this step (-inf logits): no token '
                              'to pick')


class Sampler:
    """Samples one token id from a 1-D logits row; one instance per request.

    ``grammar``: a ``structured.Grammar`` for a constrained answer; the caller reports every
    token of the answer to :meth:`accept`. :attr:`greedy` says whether the pick is the argmax
    of the allowed logits (temperature 0): the CUDA-graph decode then picks inside its graph.
    """

    def __init__(self, params: SamplingParams, device: torch.device, banned_ids=(),
                 grammar=None):
        params.validate()  # a dataclass field may have changed since construction
        self.params = params
        #: The greedy rule: temperature 0 is the first maximum, deterministic, no generator.
        self.greedy = params.temperature == 0.0
        # Multimodal placeholders are never valid output (they would corrupt the history).
        self.banned_ids = tuple(sorted(banned_ids))
        self.banned = torch.tensor(self.banned_ids, dtype=torch.long, device=device)
        self.grammar = grammar
        self._words = None  # host bitmask of the eager constrained path
        self.generator = None
        if not self.greedy:
            self.generator = torch.Generator(device=device)
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """Pick the next token from ``logits`` ([vocab], any float dtype)."""
        if self.grammar is not None:
            if self._words is None:
                self._words = np.empty(-(-logits.numel() // 32), dtype=np.int32)
            self.grammar.fill_bitmask(self._words)
            logits = apply_bitmask(logits, torch.from_numpy(self._words).to(logits.device))
        if self.banned.numel():
            logits = logits.index_fill(0, self.banned, float('-inf'))
        return self.pick(logits)

    def pick(self, logits: torch.Tensor) -> int:
        """Pick from ``logits`` whose banned (and disallowed) ids are already at -inf.

        Raises ``NonFiniteLogits`` (nothing drawn, the generator untouched) when no token can
        be picked: a NaN or +inf among the allowed logits, or none allowed.
        """
        p = self.params
        top = float(logits.max())
        _check_finite(top)
        if self.greedy:
            return int(torch.argmax(logits))
        # Shifted so the maximum is 0: no +inf or NaN for any temperature SamplingParams allows
        # (config.MIN_TEMPERATURE); softmax and the filters below are shift-invariant.
        logits = (logits.float() - top) / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float('-inf'))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens before it already reach top_p (keeps >= 1 token).
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= p.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float('-inf'))
            logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
        # Gumbel-max: adding -log(E), E ~ Exp(1) from the seeded generator, to each logit and
        # taking the argmax draws a token with probability softmax(logits) exactly; -inf (a
        # filtered or masked token) stays -inf, so it is never drawn.
        noise = torch.empty_like(logits).exponential_(generator=self.generator)
        return int(torch.argmax(logits - noise.clamp_(min=_TINY).log_()))

    def accept(self, token: int) -> None:
        """Advance the grammar (if any) by the token just added to the answer."""
        if self.grammar is not None:
            self.grammar.accept(token)
