# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The one place that touches the device: KV tensor, slot mapping, block tables, prefill, decode.

Short text-only prefills (follow-up questions) run padded to a bucket through
``prefill_graph.PrefillGraphs`` (captured CUDA graphs on a GPU); long ones run in chunks
(``prefill_chunks``), so the engine can stop between them. Decode is split for CUDA
Graphs: ``prepare_decode`` does all host work (writes the token, position, slot and
block-table *static* buffers, sets the backend's per-step metadata) and ``run_decode`` only
runs the model on those buffers (``_decode_forward``); graphs capture that and the token
pick (``_decode_pick``: the static token bitmask -- banned ids, and a grammar's allowed
tokens -- applied to the logits, then the argmax), so a greedy step is two replays and one
8-byte copy of the token id to the host. A constrained step computes its grammar mask on the
host while the GPU runs the forward graph and copies it in before the pick graph runs.

The attention backend comes from the one factory (``kernels.backend_factory``:
``attention_backend`` auto / cuda / torch); with the CUDA kernels it also gives the fused
RMSNorm / SiLU / quantized-linear ops (``cuda_ops.FusedOps``), which the runner installs for
the layers (``kernels.dispatch``) around each of its own steps only, and drops on ``close``.
"""

from contextlib import nullcontext
from functools import wraps
import logging
import math

import numpy as np
import torch

from orin_llm_node.kernels import dispatch
from orin_llm_node.kernels.backend_factory import make_attention_backend

from .prefill_graph import DEFAULT_BUCKETS, PrefillGraphs
from .structured import apply_bitmask, host_bitmask

__all__ = ['ModelRunner', 'kv_bytes_per_block']

log = logging.getLogger(__name__)


def kv_bytes_per_block(text_cfg, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over all layers (K and V)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (
        text_cfg.num_hidden_layers * 2 * block_size * text_cfg.num_key_value_heads
        * text_cfg.head_dim * itemsize
    )


def _with_fused_ops(step):
    # The runner's fused ops are what the layers dispatch to while ``step`` runs (a graph
    # captured inside holds their kernels); outside its steps, and in other runners, they
    # are not installed.
    @wraps(step)
    def run(self, *args, **kwargs):
        with self.fused_ops_installed():
            return step(self, *args, **kwargs)

    return run


class ModelRunner:
    """Owns the paged KV tensor and runs the model for prefill and decode steps.

    ``launcher`` builds the CUDA kernels (``make_attention_backend``); tests pass the CPU
    kernel emulator's.
    """

    def __init__(self, model, num_blocks: int, block_size: int, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, enable_cuda_graph: bool = False,
                 prefill_buckets: tuple[int, ...] | None = None, attention_backend: str = 'auto',
                 launcher=None):
        tc = model.config.text
        self.model = model
        # cuda:<index>, never a bare "cuda": graphs are captured on this device's own stream
        # (cuda_graph.GraphCapture), whichever device the calling thread has current.
        self.device, self.dtype = dispatch.tensor_device(device), dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = torch.zeros(
            (tc.num_hidden_layers, 2, num_blocks, block_size, tc.num_key_value_heads,
             tc.head_dim),
            dtype=dtype, device=device,
        )
        self.bytes_per_block = kv_bytes_per_block(tc, block_size, dtype)
        # backend_fallback_reason: why 'auto' runs torch on CUDA (None: it did not fall back);
        # fused_ops: the layers' fused kernels beside the CUDA attention (None: torch bodies).
        self.attn, self.fused_ops, self.backend_fallback_reason = make_attention_backend(
            self.kv_cache, tc.num_attention_heads, max_model_len, attention_backend, launcher)
        self._fused_scope = (nullcontext() if self.fused_ops is None else
                             dispatch.installed(self.device, dtype, self.fused_ops))
        # CUDA Graph decode (engine/cuda_graph.py): needs a backend that reads its per-step
        # metadata from device memory (graph_safe); captured on the first decode step,
        # replayed by run_decode after prepare_decode has written the static buffers.
        self.decode_graph = None
        if enable_cuda_graph and device.type == 'cuda':
            from .cuda_graph import CudaGraphDecode

            if self.attn.graph_safe:
                self.decode_graph = CudaGraphDecode(self)
            elif self.backend_fallback_reason is None:  # a fallback has said so already
                log.warning('CUDA graphs need the CUDA attention backend: decoding eagerly')
        self.max_blocks_per_seq = math.ceil(max_model_len / block_size) + 1
        # Bucketed prefill of short text-only suffixes: by default only where it pays, with
        # graphs (padding costs compute); tests pass buckets to run the padding on the CPU.
        if prefill_buckets is None:
            prefill_buckets = DEFAULT_BUCKETS if self.cuda_graph_active else ()
        self.prefill_graphs = PrefillGraphs(self, prefill_buckets) if prefill_buckets else None
        # Static decode buffers: a captured graph holds their addresses; only contents change.
        self.decode_input_ids = torch.zeros(1, dtype=torch.long, device=device)
        self.decode_positions = torch.zeros(1, dtype=torch.long, device=device)
        self.decode_slot_mapping = torch.zeros(1, dtype=torch.long, device=device)
        self.decode_block_table = torch.zeros(
            self.max_blocks_per_seq, dtype=torch.long, device=device
        )
        # The ids the next token may take (int32 bitmask, bit set = allowed), read by the
        # graph's pick: everything but the sampler's banned ids, and for a constrained answer
        # only what its grammar allows. Written before the pick runs, from a pinned host copy.
        words = -(-tc.vocab_size // 32)
        self.decode_token_mask = torch.full((words,), -1, dtype=torch.int32, device=device)
        self.decode_mask_shifts = torch.arange(32, dtype=torch.int32, device=device)
        self._mask_host = torch.empty(words, dtype=torch.int32,
                                      pin_memory=device.type == 'cuda')
        self._mask_sampler = None  # the unconstrained sampler decode_token_mask was built for
        self._allowed_words = None  # host bitmask of that sampler's not-banned ids
        self._table_on_device: list[int] = []  # host mirror of decode_block_table's prefix

    @property
    def cuda_graph_active(self) -> bool:
        """Whether decode steps replay a captured CUDA graph (not merely enabled)."""
        return self.decode_graph is not None

    def fused_ops_installed(self):
        """A ``with`` block in which the layers dispatch to this runner's fused ops (if any)."""
        return self._fused_scope

    def close(self) -> None:
        """Drop the fused ops, the graphs, the attention backend and the KV tensor.

        Nothing of this runner stays installed or referenced by it; it cannot run again.
        """
        self.fused_ops = self.attn = self.decode_graph = self.prefill_graphs = None
        self.model = self.kv_cache = self._mask_sampler = None
        self._fused_scope = nullcontext()

    # ---- vision ----------------------------------------------------------------------------

    @_with_fused_ops
    @torch.inference_mode()
    def encode_image(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]):
        """Vision tower output (merger + DeepStack rows) of one image, on the device."""
        pv = pixel_values.to(self.device, self.dtype)
        grid = torch.tensor([grid_thw], dtype=torch.long)  # host: the tower caches per grid
        return self.model.encode_images(pv, grid)

    # ---- prefill ---------------------------------------------------------------------------

    def slot_mapping(self, block_table: list[int], start: int, end: int) -> np.ndarray:
        """Flat KV slots of the token indices ``start..end-1`` of a sequence."""
        idx = np.arange(start, end, dtype=np.int64)
        table = np.asarray(block_table, dtype=np.int64)
        return table[idx // self.block_size] * self.block_size + idx % self.block_size

    @_with_fused_ops
    @torch.inference_mode()
    def prefill(self, token_ids: list[int], positions: np.ndarray, block_table: list[int],
                num_cached: int, visual=None) -> torch.Tensor:
        """Run the uncached suffix ``token_ids`` (positions ``[3, N]``) of a sequence.

        ``num_cached`` tokens of the sequence are already in the KV cache (through
        ``block_table``, which covers the whole sequence); ``visual`` holds the vision rows of
        the image pads inside the suffix. Returns fp32 logits ``[V]`` of the last token only.
        """
        n = len(token_ids)
        graphs = self.prefill_graphs
        if visual is None and graphs is not None and graphs.bucket(n) is not None:
            return graphs.run(token_ids, positions, block_table, num_cached)
        dev = self.device
        slots = self.slot_mapping(block_table, num_cached, num_cached + n)
        ids = torch.tensor(token_ids, dtype=torch.long, device=dev)
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(dev)
        table = torch.tensor(block_table, dtype=torch.long, device=dev)
        self.attn.prepare(torch.from_numpy(slots).to(dev), table, num_cached, n)
        hidden = self.model(ids, pos, self.attn, visual)
        return self.model.compute_logits(hidden[-1:])[0]

    def prefill_chunks(self, token_ids: list[int], positions: np.ndarray,
                       block_table: list[int], num_cached: int, visual, chunk_tokens: int):
        """:meth:`prefill` in chunks of at most ``chunk_tokens`` tokens, one per step.

        Yields ``(num_kv_tokens, logits)`` after each chunk: the tokens of the sequence that
        have K/V now, and the fp32 logits ``[V]`` of the chunk's last token (the answer's first
        logits after the last chunk). A chunk attends to everything before it through the KV
        cache, as the suffix after a prefix-cache hit does; a boundary may fall inside an image
        or a clip, whose ``visual`` rows are split with its pad tokens. Closing the generator
        between chunks leaves the KV of the chunks done valid.
        """
        if chunk_tokens <= 0:
            raise ValueError(f'chunk_tokens must be positive, got {chunk_tokens}')
        n = len(token_ids)
        if visual is not None:
            cfg = self.model.config
            pads = np.isin(np.asarray(token_ids), (cfg.image_token_id, cfg.video_token_id))
            rows = np.concatenate(([0], np.cumsum(pads)))  # visual rows before each token
        for lo in range(0, n, chunk_tokens):
            hi = min(lo + chunk_tokens, n)
            part = None
            if visual is not None and rows[hi] > rows[lo]:
                part = visual[int(rows[lo]):int(rows[hi])]
            yield num_cached + hi, self.prefill(token_ids[lo:hi], positions[:, lo:hi],
                                                block_table, num_cached + lo, part)

    @_with_fused_ops
    def capture_prefill_graphs(self) -> None:
        """Capture the bucketed prefill graphs now (no-op without them); call at load."""
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture_all()

    # ---- decode ----------------------------------------------------------------------------

    def prepare_decode(self, token_id: int, position: int, block_table: list[int],
                       context_len: int) -> None:
        """Host side of a decode step: fill the static buffers, set backend metadata.

        The step feeds ``token_id`` (sequence index ``context_len - 1``, 1-D ``position``);
        ``block_table`` must already hold a block for that index (allocated by the caller).
        Only block-table entries that changed since the last step are copied.
        """
        bs = self.block_size
        idx = context_len - 1
        slot = block_table[idx // bs] * bs + idx % bs
        mirror = self._table_on_device
        n = len(block_table)
        if n > self.max_blocks_per_seq:
            raise ValueError(f'block table of {n} blocks exceeds {self.max_blocks_per_seq}')
        # Most steps the table is unchanged: one compare, no copy. It grows by one block
        # every block_size steps (only the new entry is copied); another table is copied whole.
        m = len(mirror)
        if n != m or block_table != mirror:
            keep = m if n > m and block_table[:m] == mirror else 0
            new = torch.tensor(block_table[keep:], dtype=torch.long)
            self.decode_block_table[keep:n].copy_(new, non_blocking=True)
            self._table_on_device = list(block_table)
        self.decode_input_ids.fill_(token_id)
        self.decode_positions.fill_(position)
        self.decode_slot_mapping.fill_(slot)
        self.attn.prepare(self.decode_slot_mapping, self.decode_block_table, idx, 1)

    @_with_fused_ops
    @torch.inference_mode()
    def run_decode(self) -> torch.Tensor:
        """Device side of a decode step: fp32 logits ``[V]`` (a graph replay when enabled)."""
        if self.decode_graph is not None:
            return self.decode_graph.run()
        return self._decode_forward()

    def _decode_forward(self) -> torch.Tensor:
        # Reads only the static buffers and the KV tensor: safe to capture in a CUDA graph
        # once the backend reads its metadata from device memory.
        hidden = self.model(self.decode_input_ids, self.decode_positions, self.attn)
        return self.model.compute_logits(hidden)[0]

    def _decode_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The token pick a graph holds: decode_token_mask applied (Sampler's rule: disallowed
        # ids to -inf, first maximum), and the greedy token as an int64 [1].
        masked = apply_bitmask(logits, self.decode_token_mask, self.decode_mask_shifts)
        return masked, masked.argmax().reshape(1)

    def _decode_graph_body(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The whole step the two decode graphs hold, run eagerly: logits and greedy token.
        logits = self._decode_forward()
        return logits, self._decode_pick(logits)[1]

    def decode(self, token_id: int, position: int, block_table: list[int],
               context_len: int) -> torch.Tensor:
        """One decode step: ``prepare_decode`` then ``run_decode``."""
        self.prepare_decode(token_id, position, block_table, context_len)
        return self.run_decode()

    @_with_fused_ops
    @torch.inference_mode()
    def decode_sample(self, token_id: int, position: int, block_table: list[int],
                      context_len: int, sampler) -> int:
        """One decode step and the next token, picked by ``sampler`` (an ``engine.Sampler``).

        Under a CUDA graph the step's token mask (banned ids, the grammar's allowed tokens) is
        applied inside the pick graph: greedy is then two replays plus an 8-byte copy; other
        sampling reads the masked logits. Eagerly the sampler masks and picks.
        """
        self.prepare_decode(token_id, position, block_table, context_len)
        graph = self.decode_graph
        if graph is None:
            return sampler(self._decode_forward())
        graph.run_forward()  # queued on the GPU; the host goes on meanwhile
        self._write_token_mask(sampler)
        if sampler.greedy:
            return graph.run_greedy()
        return sampler.pick(graph.run_pick())

    def _write_token_mask(self, sampler) -> None:
        # Unconstrained: the banned ids, written once per sampler (no host work per step).
        # Constrained: the grammar's mask for this step, computed while the forward graph
        # runs, then copied (non-blocking, stream-ordered before the pick graph).
        if sampler.grammar is None and sampler is self._mask_sampler:
            return
        if self._mask_sampler is None or sampler.banned_ids != self._mask_sampler.banned_ids:
            self._allowed_words = host_bitmask(self.decode_token_mask.numel() * 32,
                                               banned=sampler.banned_ids)
        host = self._mask_host.numpy()
        if sampler.grammar is None:
            host[:] = self._allowed_words
        else:
            sampler.grammar.fill_bitmask(host)
            np.bitwise_and(host, self._allowed_words, out=host)
        self.decode_token_mask.copy_(self._mask_host, non_blocking=True)
        self._mask_sampler = sampler
