# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Where the CUDA kernel sources live and exactly how each variant is compiled.

This is the one truth shared by the runtime (``cuda_ops.py`` hands ``KernelVariant.source`` /
``.options`` to ``cupy.RawModule``), by the CPU NVRTC test (``test/test_nvrtc_compile.py``
compiles ``KernelVariant.nvrtc_options(sm)``: those options plus what CuPy adds, for each
target SM) and by the CPU kernel emulator (which flushes subnormals when they do). Importing it
needs neither CUDA nor CuPy.

Variants are selected with ``-D`` defines (no C++ templates, so no name expressions):
``KV_DTYPE_ID`` and ``HEAD_DIM`` per attention variant, ``KV_DTYPE_ID`` alone for the
quantized-linear kernels (``quant_variant``), plus the tuning constants below. The sources are
header-free (no ``cuda_fp16.h``), so no include path is needed; ``common.cuh`` is inlined into
each source so that CuPy's on-disk kernel cache, which hashes the source text and options,
sees every edit of the shared header.
"""

from dataclasses import dataclass
from pathlib import Path
import re

from orin_llm_node.package_files import share_dir

__all__ = [
    'CUPY_OPTIONS',
    'DTYPE_IDS',
    'GEMV_WARPS',
    'HEAD_DIMS',
    'KERNEL_FILES',
    'MAX_GROUP',
    'NUM_THREADS',
    'PARTITION_SIZE',
    'PREFILL_ROWS',
    'PREFILL_ROWS_PER_WARP',
    'PREFILL_TC_KV_TILE',
    'PREFILL_TC_ROWS',
    'QUANT_KERNEL_FILES',
    'SPLIT_MIN_TOKENS',
    'TARGET_SMS',
    'KernelVariant',
    'kernel_source',
    'kernels_dir',
    'prefill_rows',
    'quant_variant',
    'runtime_variants',
    'variant',
]

#: Element types of activations / KV cache (torch dtype names) -> ``KV_DTYPE_ID``.
DTYPE_IDS = {'float16': 0, 'bfloat16': 1, 'float32': 2}
#: Head dimensions the runtime compiles (128: every Qwen3-VL size; 32: the tiny test models).
HEAD_DIMS = (32, 64, 128)
#: Tokens per shared-memory pass of a decode split (shared memory is sized by it).
PARTITION_SIZE = 256
#: Fewest context tokens given a decode split of their own: a 128-token context is spread over
#: 8 splits per KV head, so short contexts keep many SMs busy too.
SPLIT_MIN_TOKENS = 16
#: Query heads of one KV head served by one decode CTA (larger GQA groups use more CTAs).
MAX_GROUP = 8
#: Threads per CTA of kv_write, paged_decode_split, paged_prefill, qk_norm_rope_kv_write and
#: silu_and_mul.
NUM_THREADS = 128

#: Kernel file -> the extern "C" functions the runtime fetches from it.
#: rms_norm.cu and silu_mul.cu do not depend on HEAD_DIM; they are built with each variant
#: anyway (one module per variant keeps a single compile path).
KERNEL_FILES = {
    'kv_write.cu': ('kv_write',),
    'paged_decode.cu': ('paged_decode_split', 'paged_decode_reduce'),
    'paged_prefill.cu': ('paged_prefill',),
    'qk_norm_rope_kv.cu': ('qk_norm_rope_kv_write',),
    'rms_norm.cu': ('rms_norm', 'add_rms_norm'),
    'silu_mul.cu': ('silu_and_mul',),
}
#: Query rows ((token, head) pairs of one KV head) that each warp of the fp32 (CUDA-core)
#: paged_prefill scores.
PREFILL_ROWS_PER_WARP = 4
#: Query rows per fp32 paged_prefill CTA.
PREFILL_ROWS = NUM_THREADS // 32 * PREFILL_ROWS_PER_WARP
#: Query rows per fp16/bf16 (tensor-core) paged_prefill CTA: one 16-row mma tile per warp.
PREFILL_TC_ROWS = NUM_THREADS // 32 * 16
#: Keys per shared-memory tile of the tensor-core paged_prefill (K and V: 2 x 64 x (HEAD_DIM
#: + 8) elements, 34 KiB at head_dim 128 in fp16/bf16).
PREFILL_TC_KV_TILE = 64

#: Output features (one warp each) per CTA of the quantized GEMV / dequantise kernels.
GEMV_WARPS = 4
#: Kernel files compiled per activation dtype only (weight-only quantized linear layers).
QUANT_KERNEL_FILES = {
    'quant_linear.cu': tuple(f'quant_{op}_{fmt}' for fmt in ('int8', 'int4', 'fp8')
                             for op in ('gemv', 'dequant')),
}

#: What ``cupy.RawModule(code=..., options=...)`` appends to the caller's options, CuPy 13 and
#: 14 alike (cupy/_core/core.pyx ``assemble_cupy_compiler_options``, cupy/cuda/compiler.py
#: ``_compile_with_cache_cuda`` and ``_compile_using_nvrtc``), besides ``-arch=sm_<device>``
#: (``KernelVariant.nvrtc_options``). Flush-to-zero is forced: fp32 subnormals are read as 0
#: and never produced, so no kernel may compute through one (quant_linear.cu decodes the FP8
#: subnormals as normal floats). CuPy also adds include paths (-I: its own headers, its CCCL
#: copy, the CUDA headers; v14 fails with "Failed to find CUDA headers" when it finds none)
#: and, only if CUPY_NVRTC_USE_PCH is set, --pch: the sources include nothing, so neither can
#: change the code (test_nvrtc_compile checks the sources are self-contained). Our
#: ``-std=c++17`` stops CuPy from adding its own ``--std``.
CUPY_OPTIONS = ('-ftz=true', '--device-as-default-execution-space')
#: Compute capabilities the kernels are checked for without a GPU: Orin (8.7), Hopper (9.0).
TARGET_SMS = (87, 90)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernels_dir() -> Path:
    """The ``cuda_kernels`` directory of this copy of the package (checkout or install)."""
    return share_dir() / 'cuda_kernels'


def _read_inlined(path: Path) -> str:
    def inline(match):
        inc = path.parent / match.group(1)
        if not inc.is_file():
            raise FileNotFoundError(f'{path.name}: #include "{match.group(1)}" not found')
        return _read_inlined(inc)

    return _INCLUDE.sub(inline, path.read_text())


def kernel_source(name: str, directory: Path | None = None) -> str:
    """The source text of ``cuda_kernels/<name>`` with its local ``#include "..."`` inlined."""
    path = (directory or kernels_dir()) / name
    if not path.is_file():
        raise FileNotFoundError(f'no kernel source {path}')
    return _read_inlined(path.resolve())


@dataclass(frozen=True)
class KernelVariant:
    """One compiled unit: a kernel file for one (dtype, head_dim); head_dim 0: not used."""

    file: str
    dtype: str
    head_dim: int
    source: str
    options: tuple[str, ...]
    functions: tuple[str, ...]

    def nvrtc_options(self, sm: int) -> tuple[str, ...]:
        """Every NVRTC option CuPy compiles this variant with for a GPU of compute ``sm``.

        Ours, then CuPy's (:data:`CUPY_OPTIONS`), then a cubin for that SM (87: Orin, 90: Hopper).
        """
        return (*self.options, *CUPY_OPTIONS, f'-arch=sm_{sm}')


def variant(file: str, dtype: str, head_dim: int, directory: Path | None = None) -> KernelVariant:
    """Source and NVRTC options of ``file`` for ``dtype`` (a torch dtype name) and ``head_dim``.

    The options are what the runtime passes to CuPy: no ``-arch`` and no include path (CuPy
    adds them, see :data:`CUPY_OPTIONS` and ``KernelVariant.nvrtc_options``).
    """
    if file not in KERNEL_FILES:
        raise ValueError(f'unknown kernel file {file!r}; expected one of {sorted(KERNEL_FILES)}')
    if dtype not in DTYPE_IDS:
        raise ValueError(f'CUDA kernels support dtypes {sorted(DTYPE_IDS)}, got {dtype!r}')
    if head_dim not in HEAD_DIMS:
        raise ValueError(f'CUDA kernels support head_dim in {HEAD_DIMS}, got {head_dim}')
    options = (
        '-std=c++17',
        f'-DKV_DTYPE_ID={DTYPE_IDS[dtype]}',
        f'-DHEAD_DIM={head_dim}',
        f'-DPARTITION_SIZE={PARTITION_SIZE}',
        f'-DSPLIT_MIN_TOKENS={SPLIT_MIN_TOKENS}',
        f'-DMAX_GROUP={MAX_GROUP}',
        f'-DNUM_THREADS={NUM_THREADS}',
        f'-DPREFILL_ROWS_PER_WARP={PREFILL_ROWS_PER_WARP}',
        f'-DPREFILL_TC_ROWS={PREFILL_TC_ROWS}',
        f'-DPREFILL_TC_KV_TILE={PREFILL_TC_KV_TILE}',
    )
    return KernelVariant(
        file=file,
        dtype=dtype,
        head_dim=head_dim,
        source=kernel_source(file, directory),
        options=options,
        functions=KERNEL_FILES[file],
    )


def prefill_rows(dtype: str) -> int:
    """Query rows per paged_prefill CTA for ``dtype`` (the launcher sizes the grid with it).

    fp32 runs on CUDA cores (:data:`PREFILL_ROWS`), fp16 and bf16 on tensor cores
    (:data:`PREFILL_TC_ROWS`).
    """
    if dtype not in DTYPE_IDS:
        raise ValueError(f'CUDA kernels support dtypes {sorted(DTYPE_IDS)}, got {dtype!r}')
    return PREFILL_ROWS if dtype == 'float32' else PREFILL_TC_ROWS


def quant_variant(dtype: str) -> KernelVariant:
    """Source and NVRTC options of the quantized-linear kernels for activations ``dtype``."""
    if dtype not in DTYPE_IDS:
        raise ValueError(f'CUDA kernels support dtypes {sorted(DTYPE_IDS)}, got {dtype!r}')
    (file, functions), = QUANT_KERNEL_FILES.items()
    return KernelVariant(
        file=file,
        dtype=dtype,
        head_dim=0,
        source=kernel_source(file),
        options=('-std=c++17', f'-DKV_DTYPE_ID={DTYPE_IDS[dtype]}',
                 f'-DGEMV_WARPS={GEMV_WARPS}'),
        functions=functions,
    )


def runtime_variants() -> list[KernelVariant]:
    """Every variant the runtime may compile (what the NVRTC test must compile)."""
    return [
        variant(file, dtype, head_dim)
        for file in KERNEL_FILES
        for dtype in DTYPE_IDS
        for head_dim in HEAD_DIMS
    ] + [quant_variant(dtype) for dtype in DTYPE_IDS]
