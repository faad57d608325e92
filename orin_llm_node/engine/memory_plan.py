# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""How much memory a configured engine needs, what it may take, and the KV pool it gets.

Made before a single weight is read (the weights are counted on the ``meta`` device), so a
checkpoint that cannot fit is refused with one line instead of an out-of-memory kill halfway
through loading. The node, ``orin_llm_check`` and the tests share :func:`plan_memory`.

What the process may take (``available``), read once the CUDA context exists: on a CUDA device
the plan first asks ``cudaMemGetInfo``, which creates the device's primary context, so every
figure read after it already lacks the context's share (on a Jetson that share is taken from
the same RAM):

* a discrete GPU: ``torch.cuda.mem_get_info`` (free device memory);
* an integrated GPU (Jetson: ``is_integrated``, unified memory) and the CPU: system memory,
  ``MemAvailable`` from ``/proc/meminfo`` (free RAM plus the page cache the kernel can
  reclaim), lowered to the room left under the memory limits of the process's own cgroup and
  of each cgroup above it (``/proc/self/cgroup``; v2 ``memory.max - memory.current``, v1
  ``memory.limit_in_bytes - memory.usage_in_bytes``): a systemd ``MemoryMax=`` sits on the
  service's cgroup, not on the root. ``mem_get_info`` on Tegra counts no reclaimable cache,
  so it is only the fallback.

The KV pool is sized for what is configured: ``KV_CONVERSATIONS`` conversations of
``max_model_len`` tokens (the one being answered and one more kept warm in the prefix cache),
capped by ``kv_fraction`` of what is left after the weights and the scratch estimates. The
fraction is 0.9 on a discrete GPU (the process owns it) and 0.5 on unified memory and the CPU
(the rest of the robot -- camera drivers, planners, ROS 2 -- lives in the same RAM);
``EngineConfig.gpu_memory_fraction`` overrides it. The automatic pool never holds less than
one whole ``max_model_len`` conversation: a plan whose share cannot hold one is refused with
its figures, not shrunk under it (answers would be cut and turns dropped although the plan
said it fits). ``kv_cache_memory_mb`` / ``num_kv_blocks`` set the pool outright.

The scratch figures are estimates of the peaks that come after the pool is allocated: prefill
activations of a ``max_model_len`` prompt, the vision tower on one ``image_max_pixels`` image,
the dense layer a quantized prefill dequantizes into, logits, the vision cache and a fixed
headroom for the allocator and the Python heap; on CUDA also the cuBLAS workspace, the CUDA
graph pools, the kernels CUDA loads on first use after the plan (``CUDA_LAZY_MODULES``) and,
on unified memory, NVRTC compiling our kernels (``NVRTC_COMPILE``).
"""

from dataclasses import asdict, dataclass, field, replace
import math
from pathlib import Path

import torch

from orin_llm_node.quantization import model_weight_bytes

from .config import EngineConfig
from .prefill_graph import DEFAULT_BUCKETS

__all__ = ['KV_CONVERSATIONS', 'MemoryPlan', 'MemoryPlanError', 'available_memory',
           'plan_memory']

#: Conversations of ``max_model_len`` tokens the automatic KV pool is sized for.
KV_CONVERSATIONS = 2
#: Share of what is left after weights and scratch that the automatic KV pool may take.
KV_FRACTION_DISCRETE = 0.9
KV_FRACTION_SHARED = 0.5
_MIB = 2**20
_GB = 1e9
#: cuBLAS workspace (per stream; 32 MiB on Hopper, less elsewhere) and the CUDA graph pools
#: (decode graph plus the prefill buckets' private pool), CUDA only.
CUBLAS_WORKSPACE = 32 * _MIB
GRAPH_POOL_BASE = 32 * _MIB
#: Kernel modules CUDA loads on first use, after the plan (lazy loading, the default since
#: CUDA 12.2 and set by torch since 1.13): the torch and cuBLAS kernels of the shapes the
#: engine runs (no cuDNN: the patch embedding is a GEMM). Bounded by what loading every module
#: at once costs: a torch CUDA context measured 666,632,192 B of device memory with eager
#: loading and 287,047,680 B with lazy loading (PyTorch pull request 86509); the difference is
#: all that lazy loading defers.
CUDA_LAZY_MODULES = 666_632_192 - 287_047_680
#: NVRTC loaded and compiling the engine's kernels (unified memory: host RAM is the GPU's).
#: Measured peak over the resident set before it: 91 MiB, the same for the 7 programs of one
#: dtype and head_dim as for all 57 (CUDA 12.9 NVRTC, x86-64; /proc/self VmHWM).
NVRTC_COMPILE = 96 * _MIB
#: Allocator fragmentation, the tokenizer and the Python heap.
HEADROOM = 256 * _MIB
_CGROUP_UNLIMITED = 1 << 60


class MemoryPlanError(ValueError):
    """The configured checkpoint, KV and scratch cannot fit in what the process may take."""


@dataclass(frozen=True)
class MemoryPlan:
    """Every figure of the plan, in bytes unless named otherwise."""

    device: str
    integrated: bool
    available: int                  # what the process may take now, before the weights
    available_source: str           # where ``available`` came from
    weight_format: str
    weights: int
    kv_bytes_per_token: int
    block_size: int
    max_model_len: int
    kv_one_conversation: int        # one max_model_len conversation, whole blocks
    kv_wanted: int                  # KV_CONVERSATIONS of them, or the explicit setting
    kv_explicit: bool               # kv_cache_memory_mb / num_kv_blocks set the pool
    kv_fraction: float
    kv_cap: int                     # kv_fraction x (available - weights - scratch)
    kv: int                         # the pool: num_blocks whole blocks
    num_blocks: int
    scratch: dict = field(default_factory=dict)
    fits: bool = True
    would_fit: tuple = ()           # settings that fit, when this one does not

    @property
    def scratch_total(self) -> int:
        """Sum of the scratch estimates."""
        return sum(self.scratch.values())

    @property
    def kv_required(self) -> int:
        """Room the KV needs after weights and scratch.

        The explicit pool, or a room whose ``kv_fraction`` share holds one whole
        ``max_model_len`` conversation.
        """
        if self.kv_explicit:
            return self.kv_wanted
        return math.ceil(self.kv_one_conversation / self.kv_fraction)

    @property
    def needed(self) -> int:
        """Weights + the room the KV requires + scratch."""
        return self.weights + self.kv_required + self.scratch_total

    def refusal(self) -> str:
        """One line: the figures, and the settings that would fit."""
        kv = (f'KV {_gb(self.kv_wanted)} (kv_cache_memory_mb)' if self.kv_explicit else
              f'KV room {_gb(self.kv_required)} (the pool takes {self.kv_fraction:.0%} of '
              f'what is left, and it must hold one {self.max_model_len}-token conversation: '
              f'{_gb(self.kv_one_conversation)})')
        fix = '; '.join(self.would_fit) or 'no setting of this checkpoint fits: use a smaller one'
        return (f'the model does not fit in memory on {self.device}: weights '
                f'{_gb(self.weights)} ({self.weight_format}) + {kv} + scratch '
                f'{_gb(self.scratch_total)} = {_gb(self.needed)} > {_gb(self.available)} '
                f'available ({self.available_source}); would fit: {fix}')

    def as_dict(self) -> dict:
        """JSON-ready figures (``orin_llm_check --json``)."""
        return {**asdict(self), 'scratch_total': self.scratch_total,
                'kv_required': self.kv_required, 'needed': self.needed}


def _gb(n: int) -> str:
    return f'{n / _GB:.2f} GB'


def _meminfo_available(root: Path) -> int | None:
    try:
        for line in (root / 'proc/meminfo').read_text().splitlines():
            if line.startswith('MemAvailable:'):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == 'max' or not text.isdigit() else int(text)


def _own_cgroups(root: Path) -> list[tuple[Path, str, str, str]]:
    """``(directory, cgroup path, limit file, usage file)`` of the process's memory cgroups.

    Each hierarchy named in ``/proc/self/cgroup`` (v2: ``0::/path``; v1: the ``memory``
    controller's line) gives the process's own cgroup and every one above it, up to the mount
    point: a limit anywhere on that path applies. A directory that is not there (a v1
    container sees its own cgroup at the mount point) is skipped.
    """
    try:
        lines = (root / 'proc/self/cgroup').read_text().splitlines()
    except OSError:
        lines = []
    hierarchies = []
    for line in lines:
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        if parts[0] == '0' and not parts[1]:
            hierarchies.append((parts[2], '', 'memory.max', 'memory.current'))
        elif 'memory' in parts[1].split(','):
            hierarchies.append((parts[2], 'memory', 'memory.limit_in_bytes',
                                'memory.usage_in_bytes'))
    if not hierarchies:  # no /proc/self/cgroup: the mount points themselves
        hierarchies = [('/', '', 'memory.max', 'memory.current'),
                       ('/', 'memory', 'memory.limit_in_bytes', 'memory.usage_in_bytes')]
    found = []
    for path, mount, limit, usage in hierarchies:
        names = [n for n in path.strip().split('/') if n and n != '.']
        if '..' in names:
            continue
        for depth in range(len(names), -1, -1):
            directory = root.joinpath('sys/fs/cgroup', mount, *names[:depth])
            if directory.is_dir():
                found.append((directory, '/' + '/'.join(names[:depth]), limit, usage))
    return found


def _cgroup_room(root: Path) -> tuple[int, str] | None:
    """The least room under any memory limit of the process's cgroups, and which cgroup."""
    rooms = []
    for directory, path, limit, usage in _own_cgroups(root):
        top, used = _read_int(directory / limit), _read_int(directory / usage)
        if top is not None and used is not None and top < _CGROUP_UNLIMITED:
            rooms.append((max(top - used, 0), f'cgroup limit of {path}'))
    return min(rooms) if rooms else None


def available_memory(device: torch.device, root: str | Path = '/') -> tuple[int, bool, str]:
    """``(bytes the process may take, integrated GPU?, where the figure came from)``.

    On a CUDA device this creates the device's CUDA context first (``cudaMemGetInfo``), so
    what it takes is no longer in the figures read after it.
    """
    root = Path(root)
    integrated = False
    device_free = None
    if device.type == 'cuda':
        device_free = int(torch.cuda.mem_get_info(device)[0])
        integrated = bool(getattr(torch.cuda.get_device_properties(device),
                                  'is_integrated', False))
        if not integrated:
            return device_free, False, 'cudaMemGetInfo'
    figures = []
    meminfo = _meminfo_available(root)
    if meminfo is not None:
        figures.append((meminfo, 'MemAvailable'))
    room = _cgroup_room(root)
    if room is not None:
        figures.append(room)
    if not figures and device_free is not None:
        figures.append((device_free, 'cudaMemGetInfo'))
    if not figures:
        raise MemoryPlanError('cannot tell how much memory is available (no /proc/meminfo): '
                              'set kv_cache_memory_mb')
    value, source = min(figures)
    return value, integrated, source


def _scratch(mcfg, itemsize: int, max_model_len: int, image_max_pixels: int,
             quantized: bool, cuda: bool, integrated: bool, vision_cache_bytes: int) -> dict:
    tc, vc = mcfg.text, mcfg.vision
    q = tc.num_attention_heads * tc.head_dim
    kv = tc.num_key_value_heads * tc.head_dim
    h, inter = tc.hidden_size, tc.intermediate_size
    # Live at once inside one decoder layer during prefill: residual, normed input (+ its fp32
    # RMSNorm temporary), q/k/v, attention output, gate_up, the SiLU product.
    per_token = (3 * h + q + 2 * kv + q + 3 * inter) * itemsize + 4 * h
    patches = image_max_pixels // (vc.patch_size * vc.patch_size)
    per_patch = (6 * vc.hidden_size + 2 * vc.intermediate_size) * itemsize
    scratch = {
        'prefill_activations': max_model_len * per_token,
        'vision_activations': patches * per_patch,
        'logits': 2 * tc.vocab_size * 4,
        'vision_cache': vision_cache_bytes,
        'headroom': HEADROOM,
    }
    if quantized:
        largest = max(2 * inter * h, (q + 2 * kv) * h, inter * h, q * h)
        scratch['quantized_prefill_layer'] = largest * itemsize
    if cuda:
        scratch['cublas_workspace'] = CUBLAS_WORKSPACE
        scratch['cuda_graph_pools'] = GRAPH_POOL_BASE + max(DEFAULT_BUCKETS) * per_token
        scratch['cuda_lazy_modules'] = CUDA_LAZY_MODULES
        if integrated:  # NVRTC runs in host RAM, which a discrete GPU's free memory is not
            scratch['nvrtc_compile'] = NVRTC_COMPILE
    return scratch


def _image_max_pixels(cfg: EngineConfig) -> int:
    from orin_llm_node.processing import ImageProcessor

    try:
        proc = ImageProcessor.from_pretrained(cfg.model_path)
    except (OSError, ValueError):
        proc = ImageProcessor()         # a bare config.json: the reference defaults
    return proc.capped(max_pixels=cfg.image_max_pixels).max_pixels


def _weights(cfg: EngineConfig, dtype: torch.dtype, quantization: str, mcfg=None):
    from orin_llm_node.models.loader import meta_model

    model = meta_model(cfg.model_path, dtype, quantization, mcfg)
    return model_weight_bytes(model), model.weight_format, model.config


def plan_memory(cfg: EngineConfig, device: torch.device | None = None,
                dtype: torch.dtype | None = None, root: str | Path = '/') -> MemoryPlan:
    """The memory plan for ``cfg`` on ``device`` (``root``: where ``/proc`` and ``/sys`` are).

    Raises ``ModelLoadError`` for an unreadable ``config.json``; never raises for a plan that
    does not fit (``fits`` is False and ``refusal()`` says why).
    """
    from .model_runner import kv_bytes_per_block

    device = device if device is not None else cfg.resolve_device()
    dtype = dtype if dtype is not None else cfg.resolve_dtype(device)
    weights, weight_format, mcfg = _weights(cfg, dtype, cfg.quantization)
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_block = kv_bytes_per_block(mcfg.text, cfg.block_size, dtype)
    available, integrated, source = available_memory(device, root)
    cuda = device.type == 'cuda'
    pixels = _image_max_pixels(cfg)

    def scratch_for(max_model_len, quantized):
        return _scratch(mcfg, itemsize, max_model_len, pixels, quantized, cuda, integrated,
                        int(cfg.vision_cache_mb * _MIB))

    quantized = weight_format != str(dtype).replace('torch.', '')
    scratch = scratch_for(cfg.max_model_len, quantized)
    one = math.ceil(cfg.max_model_len / cfg.block_size) * per_block
    fraction = cfg.gpu_memory_fraction or (
        KV_FRACTION_DISCRETE if cuda and not integrated else KV_FRACTION_SHARED)
    cap = max(int(fraction * (available - weights - sum(scratch.values()))), 0)
    explicit = cfg.num_kv_blocks is not None or cfg.kv_cache_memory_mb is not None
    if cfg.num_kv_blocks is not None:
        wanted = cfg.num_kv_blocks * per_block
        blocks = cfg.num_kv_blocks
    elif cfg.kv_cache_memory_mb is not None:
        wanted = int(cfg.kv_cache_memory_mb * _MIB)
        blocks = wanted // per_block
        if blocks < 1:
            raise ValueError(
                f'KV cache budget of {wanted / _MIB:.1f} MiB holds no block of '
                f'{per_block / _MIB:.2f} MiB (raise kv_cache_memory_mb or lower block_size)')
    else:
        tokens = (cfg.cpu_kv_tokens if device.type == 'cpu' and cfg.cpu_kv_tokens
                  else KV_CONVERSATIONS * cfg.max_model_len)
        wanted = math.ceil(tokens / cfg.block_size) * per_block
        # Never under one whole conversation: a share that cannot hold one is refused below
        # (``needed``), and the max only covers the cap's rounding and a small cpu_kv_tokens.
        blocks = max(min(wanted, cap), one) // per_block
    plan = MemoryPlan(
        device=str(device), integrated=integrated, available=available,
        available_source=source, weight_format=weight_format, weights=weights,
        kv_bytes_per_token=per_block // cfg.block_size, block_size=cfg.block_size,
        max_model_len=cfg.max_model_len, kv_one_conversation=one, kv_wanted=wanted,
        kv_explicit=explicit, kv_fraction=fraction, kv_cap=cap, kv=blocks * per_block,
        num_blocks=blocks, scratch=scratch)
    if plan.needed <= available:
        return plan
    return _with_advice(plan, cfg, dtype, mcfg, scratch_for)


def _with_advice(plan: MemoryPlan, cfg: EngineConfig, dtype, mcfg, scratch_for) -> MemoryPlan:
    """``plan`` refused, with the settings that would fit (each alone, or as one pair)."""
    from orin_llm_node.errors import ModelLoadError

    per_token = plan.kv_bytes_per_token
    # What each token of max_model_len takes: its prefill activations and, unless the pool is
    # set outright, the room whose share holds its KV.
    act = scratch_for(1, False)['prefill_activations']
    kv_per_token = 0 if plan.kv_explicit else per_token / plan.kv_fraction
    kv_fixed = plan.kv_wanted if plan.kv_explicit else 0

    def longest(weights, scratch):
        # The longest max_model_len (whole 256s) that fits beside these, if shorter.
        fixed = weights + kv_fixed + sum(scratch.values()) - scratch['prefill_activations']
        tokens = int((plan.available - fixed) / (kv_per_token + act)) // 256 * 256
        return tokens if 256 <= tokens < cfg.max_model_len else None

    advice, pair = [], None
    if mcfg.quantization_config is None and cfg.quantization in ('none', 'int8'):
        for q in ('int8', 'int4'):
            if q == cfg.quantization:
                continue
            try:
                weights, _, _ = _weights(cfg, dtype, q, mcfg)
            except (ModelLoadError, ValueError):
                continue
            scratch = scratch_for(cfg.max_model_len, True)
            if weights + plan.kv_required + sum(scratch.values()) <= plan.available:
                advice.append(f'quantization={q} (weights {_gb(weights)})')
                pair = None
                break
            tokens = longest(weights, scratch)
            if tokens:  # int4 comes last: the longest
                pair = (tokens, f'quantization={q} with max_model_len={tokens} '
                                f'(weights {_gb(weights)})')
    tokens = longest(plan.weights, plan.scratch)
    if tokens:
        advice.append(f'max_model_len={tokens}')
    if pair and pair[0] > (tokens or 0) + 256:  # worth the second change
        advice.append(pair[1])
    room = plan.available - plan.weights - plan.scratch_total
    whole = math.ceil(plan.kv_one_conversation / _MIB)
    if not plan.kv_explicit and room >= whole * _MIB:
        # Only the share refused it: a pool of one whole conversation, set outright, fits.
        advice.append(f'kv_cache_memory_mb={whole} (one whole conversation; '
                      f'{_gb(room - whole * _MIB)} left to the rest of the robot)')
    elif room >= 64 * _MIB and (plan.kv_explicit or room < plan.kv_one_conversation):
        advice.append(f'kv_cache_memory_mb={int(room * 0.9 / _MIB)} (conversations longer '
                      f'than {int(room * 0.9) // per_token} tokens drop their oldest turns)')
    return replace(plan, fits=False, would_fit=tuple(advice))
