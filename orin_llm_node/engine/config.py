# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Engine and sampling configuration: plain dataclasses, validated once at construction."""

from dataclasses import dataclass
import numbers
from pathlib import Path

import numpy as np
import torch

from orin_llm_node import package_files
from orin_llm_node.kernels.backend_factory import ATTENTION_BACKENDS
from orin_llm_node.processing.grounding import check_detect
from orin_llm_node.processing.tools import check_tool_choice, check_tools
from orin_llm_node.quantization import AT_LOAD_FORMATS

from .structured import check_response_format

_DEVICES = ('auto', 'cpu', 'cuda')
_DTYPES = {
    'float32': torch.float32,
    'fp32': torch.float32,
    'bfloat16': torch.bfloat16,
    'bf16': torch.bfloat16,
    'float16': torch.float16,
    'fp16': torch.float16,
}

#: Sampling temperatures other than 0 must lie in ``[MIN_TEMPERATURE, MAX_TEMPERATURE]``: the
#: normal float32 range. The sampler works in float32 on ``(logits - max) / temperature``,
#: whose entries are <= 0 with the maximum exactly 0, so the softmax sees a finite 0 and values
#: that may round to -inf (probability 0) but never +inf or NaN, provided the temperature is a
#: positive normal float32: a smaller value rounds to 0 or a subnormal (flushed to 0 on a GPU;
#: 0 / 0 is NaN), and a larger one rounds to inf (-inf / inf is NaN for masked tokens).
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)  # 1.1754944e-38
MAX_TEMPERATURE = float(np.finfo(np.float32).max)  # 3.4028235e+38
#: Seeds ``torch.Generator.manual_seed`` takes as themselves (it maps negative ones onto these).
MAX_SEED = 2**64 - 1


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')


def _model_dir(model_path: str | Path) -> Path:
    # The checkpoint directory; an empty one is the demo checkpoint when it is installed.
    if str(model_path):
        return Path(model_path).expanduser()
    demo = package_files.DEMO_MODEL_DIR
    if (demo / 'config.json').is_file():
        return demo
    raise ValueError(f'model_path is empty and the demo checkpoint is not installed ({demo}): '
                     'set model_path to a Qwen3-VL checkpoint directory')


@dataclass
class EngineConfig:
    """Everything the engine needs to start; invalid values raise ValueError naming the field.

    KV pool size: ``num_kv_blocks`` if given, else ``kv_cache_memory_mb``, else room for
    ``memory_plan.KV_CONVERSATIONS`` conversations of ``max_model_len`` tokens (on the CPU,
    ``cpu_kv_tokens`` tokens when set) capped by ``gpu_memory_fraction`` of what is available
    after the weights and the scratch (None: 0.9 on a discrete GPU, 0.5 on unified memory and
    the CPU), never less than one ``max_model_len`` conversation. ``engine.memory_plan`` has
    the figures; a configuration whose share cannot hold one conversation beside the weights
    and scratch is refused before loading.

    ``attention_backend``: ``"auto"`` runs the CUDA kernels on a CUDA device and falls back to
    the torch path (one WARN line, the reason in ``LLMEngine.backend_fallback_reason``) when
    CuPy cannot import, compile or load them; ``"cuda"`` fails instead; ``"torch"`` never
    touches CuPy.

    ``prefill_chunk_tokens``: a prompt's uncached tokens are prefilled in chunks of at most
    this many; ``LLMEngine.cancel()`` and ``SamplingParams.timeout_s`` are checked between
    chunks, so a long prefill stops within one chunk of either. Each chunk attends to the ones
    before through the KV cache, as after a prefix-cache hit: greedy answers stay those of an
    unchunked prefill.

    ``quantization``: ``"none"`` loads the checkpoint as it is (float, or its own INT4 / INT8 /
    FP8 format when its config.json declares one); ``"int8"``, ``"int4"`` (groups of 128,
    symmetric), ``"int4_asym"`` or ``"fp8"`` quantize a float checkpoint's decoder projections
    while loading (weight-only, round-to-nearest, no calibration).

    ``model_path``: the checkpoint directory (``~`` expanded); empty means the embedded demo
    checkpoint (``package_files.DEMO_MODEL_DIR``), as the node's empty ``model_path`` does.

    The ROS node's parameters that set these fields, and ``SamplingParams``' (ROS names where
    they say more on the command line): the engine column of the parameter table,
    ``ros/parameters.py``.
    """

    model_path: str | Path
    device: str = 'auto'
    dtype: str = 'auto'
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_mb: float | None = None
    gpu_memory_fraction: float | None = None
    cpu_kv_tokens: int | None = None
    max_model_len: int = 8192
    enable_prefix_cache: bool = True
    enable_cuda_graph: bool = True
    # Pixel bounds on top of the checkpoint's (ImageProcessor.capped): the maximum is a cost cap
    # that never raises the checkpoint's own, the minimum replaces the checkpoint's.
    image_max_pixels: int | None = None
    image_min_pixels: int | None = None
    # Cost cap on a video clip's pixels (frames x height x width, the reference's clip-level
    # bound): lowers the checkpoint's maximum, never raises it (VideoProcessor.capped).
    video_max_pixels: int | None = None
    vision_cache_mb: float = 64.0
    block_order_seed: int | None = None
    quantization: str = 'none'
    attention_backend: str = 'auto'
    prefill_chunk_tokens: int = 2048

    def __post_init__(self):
        self.model_path = _model_dir(self.model_path)
        if self.device not in _DEVICES and not str(self.device).startswith('cuda:'):
            raise ValueError(
                f"device must be one of {_DEVICES} (or 'cuda:N'), got {self.device!r}"
            )
        if self.dtype != 'auto' and self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        _positive_int('block_size', self.block_size)
        _positive_int('num_kv_blocks', self.num_kv_blocks, allow_none=True)
        _positive_int('max_model_len', self.max_model_len)
        _positive_int('cpu_kv_tokens', self.cpu_kv_tokens, allow_none=True)
        _positive_int('prefill_chunk_tokens', self.prefill_chunk_tokens)
        if self.kv_cache_memory_mb is not None and not self.kv_cache_memory_mb > 0:
            raise ValueError(
                f'kv_cache_memory_mb must be > 0 when set, got {self.kv_cache_memory_mb!r}'
            )
        if self.gpu_memory_fraction is not None and not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(
                f'gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction!r}'
            )
        if self.vision_cache_mb < 0:
            raise ValueError(f'vision_cache_mb must be >= 0, got {self.vision_cache_mb!r}')
        for name in ('image_max_pixels', 'image_min_pixels', 'video_max_pixels'):
            _positive_int(name, getattr(self, name), allow_none=True)
        if (
            self.image_max_pixels is not None
            and self.image_min_pixels is not None
            and self.image_min_pixels > self.image_max_pixels
        ):
            raise ValueError(
                f'image_min_pixels ({self.image_min_pixels}) must not exceed '
                f'image_max_pixels ({self.image_max_pixels})'
            )
        if self.quantization != 'none' and self.quantization not in AT_LOAD_FORMATS:
            raise ValueError(
                f"quantization must be 'none' or one of {sorted(AT_LOAD_FORMATS)}, "
                f"got {self.quantization!r}"
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f'attention_backend must be one of {ATTENTION_BACKENDS}, '
                f'got {self.attention_backend!r}'
            )
        if self.block_order_seed is not None and not isinstance(self.block_order_seed, int):
            raise ValueError(f'block_order_seed must be an int, got {self.block_order_seed!r}')

    def resolve_device(self) -> torch.device:
        """The torch device: 'auto' means CUDA when available, else the CPU."""
        if self.device == 'auto':
            return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
        if str(self.device).startswith('cuda') and not torch.cuda.is_available():
            raise ValueError(f'device={self.device!r} but CUDA is not available')
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        """The torch dtype: 'auto' means bfloat16 on CUDA and float32 on the CPU."""
        if self.dtype == 'auto':
            return torch.bfloat16 if device.type == 'cuda' else torch.float32
        return _DTYPES[self.dtype]


@dataclass
class SamplingParams:
    """Per-request decoding settings. ``temperature == 0`` is greedy (deterministic).

    ``top_k == 0`` and ``top_p == 1.0`` disable those filters; ``seed`` (an integer in
    ``[0, 2**64 - 1]``, None = random) makes sampling reproducible; ``timeout_s`` ends the
    answer with ``finish_reason="timeout"``. A temperature other than 0 must be in
    ``[MIN_TEMPERATURE, MAX_TEMPERATURE]`` (why: ``MIN_TEMPERATURE``). The ROS parameters that
    set these: the engine column of ``ros/parameters.py``'s table.

    ``response_format`` constrains the answer (``engine/structured.py``):
    ``{"type": "json_object"}``, ``{"type": "json_schema", "schema": {...}}`` or
    ``{"type": "regex", "pattern": "..."}``; the grammar then also decides where the answer
    ends, so it cannot be combined with ``ignore_eos``.

    ``tools`` (OpenAI function definitions) are rendered in the conversation's system turn and
    ``tool_choice`` (``"auto"``, the default; ``"required"``, ``"none"`` or a named tool) says
    whether and which the answer calls; every call follows its tool's schema
    (``processing/tools.py``, ``engine/tool_calls.py``). ``detect`` (a list of labels or a
    phrase) asks for grounding boxes (``processing/grounding.py``). Each of ``response_format``,
    ``tools`` and ``detect`` shapes the answer, so at most one of them is set, and none with
    ``ignore_eos``.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    timeout_s: float | None = None
    response_format: dict | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    detect: list[str] | str | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field (run at construction)."""
        _positive_int('max_tokens', self.max_tokens)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not (
                t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(
                f'temperature must be 0 (greedy) or a finite number in [{MIN_TEMPERATURE:.7g}, '
                f'{MAX_TEMPERATURE:.7g}] (the normal float32 range the sampler divides by), '
                f'got {t!r}')
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f'top_p must be in (0, 1], got {self.top_p!r}')
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f'top_k must be an integer >= 0 (0 = off), got {self.top_k!r}')
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
            or not 0 <= self.seed <= MAX_SEED
        ):
            raise ValueError(f'seed must be None (random) or an integer in [0, 2**64 - 1], '
                             f'got {self.seed!r}')
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f'timeout_s must be > 0 when set, got {self.timeout_s!r}')
        self.response_format = check_response_format(self.response_format)
        self.tools = check_tools(self.tools)
        check_tool_choice(self.tool_choice, self.tools)
        self.detect = check_detect(self.detect)
        shaping = [name for name in ('response_format', 'tools', 'detect')
                   if getattr(self, name) is not None]
        if len(shaping) > 1:
            raise ValueError(f"{' and '.join(shaping)} cannot be combined (each shapes the "
                             "answer)")
        if shaping and self.ignore_eos:
            raise ValueError(f'ignore_eos cannot be combined with {shaping[0]} (the grammar '
                             'decides where the answer ends)')
