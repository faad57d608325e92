# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Next-token sampling: greedy, temperature, top-k, top-p, with a per-request seeded generator.

With a grammar (``SamplingParams.response_format``) only the tokens its bitmask allows can be
picked; the CUDA-graph decode applies that mask inside the graph (``ModelRunner``), the eager
path here.
"""

import secrets

import numpy as np
import torch

from .config import SamplingParams
from .structured import apply_bitmask


class Sampler:
    """Samples one token id from a 1-D logits row; one instance per request.

    ``grammar``: a ``structured.Grammar`` for a constrained answer; the caller reports every
    token of the answer to :meth:`accept`.
    """

    def __init__(self, params: SamplingParams, device: torch.device, banned_ids=(),
                 grammar=None):
        params.validate()  # a dataclass field may have changed since construction
        self.params = params
        # Multimodal placeholders are never valid output (they would corrupt the history).
        self.banned_ids = tuple(sorted(banned_ids))
        self.banned = torch.tensor(self.banned_ids, dtype=torch.long, device=device)
        self.grammar = grammar
        self._words = None  # host bitmask of the eager constrained path
        self.generator = None
        if not params.greedy:
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
            logits = logits.index_fill(0, self.banned, float("-inf"))
        return self.pick(logits)

    def pick(self, logits: torch.Tensor) -> int:
        """Pick from ``logits`` whose banned (and disallowed) ids are already at -inf."""
        p = self.params
        if p.greedy:
            return int(torch.argmax(logits))
        # Shifted so the maximum is 0: no +inf or NaN for any temperature SamplingParams allows
        # (config.MIN_TEMPERATURE); softmax and the filters below are shift-invariant.
        logits = logits.float()
        logits = (logits - logits.max()) / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens before it already reach top_p (keeps >= 1 token).
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= p.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def accept(self, token: int) -> None:
        """Advance the grammar (if any) by the token just added to the answer."""
        if self.grammar is not None:
            self.grammar.accept(token)
