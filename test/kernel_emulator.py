# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Run the ``cuda_kernels`` on the CPU: a tiny CUDA execution-model emulator for tests.

The kernel sources are compiled as host C++ (g++) against a harness that provides what they
use: ``threadIdx``/``blockIdx``/``gridDim``, ``__shared__`` (one CTA runs at a time; its
threads are fibers on one OS thread sharing the kernel's static arrays), ``__syncthreads`` (a
block barrier), ``__shfl_xor_sync`` (a per-warp exchange between barriers) and, for the
fp16/bf16 builds, the tensor-core ``mma.sync.aligned.m16n8k16`` of ``cuda_kernels/mma.cuh``
(``emu_mma_m16n8k16``: a warp-collective exchange of the lanes' fragments, laid out exactly as
the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type" says, so a kernel
that loads its fragments any other way gets wrong results here as on a GPU). A divergent
barrier, shuffle or mma -- undefined behaviour on a GPU -- fails the launch instead of hanging,
and so does a grid over CUDA's limits (``GRID_LIMITS``).
Kernels run with fp32 flush-to-zero (FTZ and DAZ in MXCSR, FPCR.FZ on aarch64, set and
restored around each launch) whenever CuPy compiles them with ``-ftz=true``
(``kernel_sources.CUPY_OPTIONS``), as a GPU runs them: a kernel that computes through an fp32
subnormal fails here as it would there.

``emulated_launch(dtype, head_dim)`` returns a ``launch(name, grid, block, args)`` callable
with the calling convention of ``cuda_ops.kernel_launcher`` (CuPy): pointer arguments are
Python ints (``tensor.data_ptr()`` of CPU tensors), scalars numpy scalars. Every argument is
checked against the C signature parsed from the source (a ``np.int64`` passed for an ``int``
fails here, while on a GPU it would silently read the low half).

``CountingLaunch`` counts a launcher's kernels by name; ``fused_runner`` builds a CPU model
runner whose kernels are all emulated (the fused decode step of a GPU, without one) and
``fused_and_torch_steps`` runs it beside a torch-path runner, step by step.

This checks the kernels' indexing, softmax, split-K and reduction logic and the backend's
launch code without a GPU. It does not check GPU-only properties (memory model, alignment
faults, performance); the ``gpu`` tests do.
"""

import ctypes
import hashlib
from pathlib import Path
import re
import shutil
import subprocess
import tempfile

import numpy as np
import torch

from orin_llm_node.kernels import kernel_sources as ks
from orin_llm_node.kernels.cuda_ops import LaunchCounter

HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <ucontext.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct dim3 { unsigned int x = 1, y = 1, z = 1; };
static dim3 threadIdx, blockIdx, gridDim, blockDim;

// The threads of one CTA are fibers on this OS thread: each runs until it reaches a barrier,
// then yields to the scheduler, which resumes it once every thread the barrier waits for
// (the CTA, or the warp for a shuffle) has arrived.
struct Barrier { int n = 0, count = 0; long gen = 0; };
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
  Barrier* waiting = nullptr;
  long wait_gen = 0;
};
static ucontext_t g_sched;
static std::vector<Fiber> g_fibers;
static Fiber* g_cur = nullptr;
static void (*g_body)(void*) = nullptr;
static void* g_body_arg = nullptr;
static Barrier g_block;
static Barrier g_warps[32];
static float g_shfl[1024];

static void arrive(Barrier& b) {
  if (++b.count == b.n) {
    b.count = 0;
    ++b.gen;
    return;
  }
  g_cur->waiting = &b;
  g_cur->wait_gen = b.gen;
  swapcontext(&g_cur->ctx, &g_sched);
}
static inline void __syncthreads() { arrive(g_block); }
static inline float __shfl_xor_sync(unsigned int, float v, int offset) {
  const int t = threadIdx.x;
  g_shfl[t] = v;
  arrive(g_warps[t / 32]);
  const float r = g_shfl[(t & ~31) | ((t & 31) ^ offset)];
  arrive(g_warps[t / 32]);
  return r;
}
#if KV_DTYPE_ID == 0 || KV_DTYPE_ID == 1
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.f32, warp-collective. Each lane leaves its
// fragments in this call's buffer and waits for its warp; then it computes its own four
// accumulators from the fragments of all 32 lanes. Two buffers, alternated per call: a lane
// can only write a buffer again two calls later, after every lane of its warp has arrived at
// the call in between, i.e. has finished reading it.
static unsigned int g_mma_a[2][1024][4], g_mma_b[2][1024][2];
static int g_mma_parity[1024];
static long long g_mma_ops = 0;  // warp-wide mma operations since the library was loaded

static inline float mma_input(unsigned int reg, int upper) {  // element 0: the low half
  const unsigned short bits = (unsigned short)(upper ? reg >> 16 : reg & 0xffffu);
#if KV_DTYPE_ID == 0
  return (float)__builtin_bit_cast(_Float16, bits);
#else
  unsigned int u = (unsigned int)bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// With g = lane / 4, t = lane % 4 (PTX ISA): A element a_i (i = 0..7, two per register, a_i in
// register i / 2) of lane (g, t) is A[g + 8 * ((i / 2) % 2)][2t + i % 2 + 8 * (i / 4)]; B
// element b_i (i = 0..3, register i / 2) is B[2t + i % 2 + 8 * (i / 2)][g]; accumulator c_i
// (i = 0..3) is C[g + 8 * (i / 2)][2t + i % 2]. Inverted: who holds A[row][k] and B[k][col].
static inline float mma_a(int base, int parity, int row, int k) {
  const int lane = (row % 8) * 4 + (k % 8) / 2;
  const int reg = (row / 8) + 2 * (k / 8);
  return mma_input(g_mma_a[parity][base + lane][reg], k % 2);
}
static inline float mma_b(int base, int parity, int k, int col) {
  const int lane = col * 4 + (k % 8) / 2;
  return mma_input(g_mma_b[parity][base + lane][k / 8], k % 2);
}

static inline void emu_mma_m16n8k16(float (&acc)[4], const unsigned int (&a)[4],
                                    const unsigned int (&b)[2]) {
  const int tid = threadIdx.x, base = tid & ~31, lane = tid & 31;
  const int p = g_mma_parity[tid];
  g_mma_parity[tid] ^= 1;
  for (int i = 0; i < 4; ++i) g_mma_a[p][tid][i] = a[i];
  for (int i = 0; i < 2; ++i) g_mma_b[p][tid][i] = b[i];
  arrive(g_warps[tid / 32]);
  if (lane == 0) ++g_mma_ops;
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
    float dot = 0.f;  // fp32 products and sums, k in order (the GPU's order is unspecified)
    for (int k = 0; k < 16; ++k) {
      dot = std::fma(mma_a(base, p, row, k), mma_b(base, p, k, col), dot);
    }
    acc[i] += dot;
  }
}
#endif

static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

@INCLUDES@

static void trampoline() {
  g_body(g_body_arg);
  g_cur->done = true;  // returning switches to uc_link, the scheduler
}

static int run_cta(int bx) {
#if KV_DTYPE_ID == 0 || KV_DTYPE_ID == 1
  std::memset(g_mma_parity, 0, sizeof(g_mma_parity));
#endif
  for (int t = 0; t < bx; ++t) {
    Fiber& f = g_fibers[t];
    f.done = false;
    f.waiting = nullptr;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &g_sched;
    makecontext(&f.ctx, trampoline, 0);
  }
  for (int finished = 0; finished < bx;) {
    bool progress = false;
    finished = 0;
    for (int t = 0; t < bx; ++t) {
      Fiber& f = g_fibers[t];
      if (f.done) { ++finished; continue; }
      if (f.waiting && f.waiting->gen == f.wait_gen) continue;
      f.waiting = nullptr;
      g_cur = &f;
      threadIdx = dim3{(unsigned)t, 0, 0};
      swapcontext(&g_sched, &f.ctx);
      progress = true;
    }
    if (!progress && finished < bx) {
      std::fprintf(stderr, "kernel emulator: deadlock (divergent __syncthreads/__shfl)\n");
      return -3;
    }
  }
  return 0;
}

template <class F>
static int launch(int gx, int gy, int gz, int bx, F& body) {
  gridDim = dim3{(unsigned)gx, (unsigned)gy, (unsigned)gz};
  blockDim = dim3{(unsigned)bx, 1, 1};
  if ((int)g_fibers.size() < bx) g_fibers.resize(bx);
  for (auto& f : g_fibers) f.stack.resize(256 * 1024);
  g_block = Barrier{bx};
  for (int w = 0; w < bx / 32; ++w) g_warps[w] = Barrier{32};
  g_body = [](void* p) { (*static_cast<F*>(p))(); };
  g_body_arg = &body;
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        blockIdx = dim3{(unsigned)x, (unsigned)y, (unsigned)z};
        const int rc = run_cta(bx);
        if (rc) return rc;
      }
  return 0;
}

#define ARG(i, T) (*reinterpret_cast<T*>(args[i]))

// fp32 subnormals as a GPU kernel built with -ftz=true sees them: read as zero (DAZ) and never
// produced (FTZ). The mode is this thread's (the fibers' contexts inherit it when they are made
// inside the launch) and is restored on return, so the caller's own arithmetic is untouched.
#if defined(__x86_64__)
struct FlushDenormals {
  const unsigned int saved = _mm_getcsr();
  explicit FlushDenormals(bool on) { if (on) _mm_setcsr(saved | 0x8040u); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved); }
};
#elif defined(__aarch64__)
struct FlushDenormals {  // FPCR.FZ flushes subnormal inputs and results alike
  unsigned long saved;
  explicit FlushDenormals(bool on) {
    asm volatile("mrs %0, fpcr" : "=r"(saved));
    if (on) asm volatile("msr fpcr, %0" : : "r"(saved | (1ul << 24)));
  }
  ~FlushDenormals() { asm volatile("msr fpcr, %0" : : "r"(saved)); }
};
#else
#error "kernel emulator: flush-to-zero control only for x86-64 and aarch64"
#endif

static int dispatch(const std::string& n, int gx, int gy, int gz, int bx, void** args) {
@DISPATCH@
  return -1;
}

extern "C" int emu_launch(const char* name, int gx, int gy, int gz, int bx, void** args,
                          int flush_denormals) {
  if (bx <= 0 || bx % 32 || bx > 1024 || gx <= 0 || gy <= 0 || gz <= 0) return -2;
  if (gy > 65535 || gz > 65535) return -4;  // CUDA's gridDim.y / gridDim.z limit
  FlushDenormals mode(flush_denormals != 0);
  return dispatch(name, gx, gy, gz, bx, args);
}

#if KV_DTYPE_ID == 0 || KV_DTYPE_ID == 1
#include "mma.cuh"

extern "C" long long emu_mma_ops() { return g_mma_ops; }

// One warp runs mma_m16n8k16 (cuda_kernels/mma.cuh) once on fragments given per lane:
// a [32][4], b [32][2] registers; acc [32][4] floats, read and written back.
extern "C" int emu_mma_probe(const unsigned int* a, const unsigned int* b, float* acc) {
  auto body = [&] {
    const int lane = threadIdx.x;
    const unsigned int fa[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
    const unsigned int fb[2] = {b[2 * lane], b[2 * lane + 1]};
    float d[4] = {acc[4 * lane], acc[4 * lane + 1], acc[4 * lane + 2], acc[4 * lane + 3]};
    mma_m16n8k16(d, fa, fb);
    for (int i = 0; i < 4; ++i) acc[4 * lane + i] = d[i];
  };
  FlushDenormals mode(true);
  return launch(1, 1, 1, 32, body);
}
#endif
"""

#: CUDA's grid limits (x, y, z): a launch beyond them fails on a GPU, and here.
GRID_LIMITS = (2**31 - 1, 65535, 65535)

_SIGNATURE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)'
)


def _c_params(params: str) -> list[str]:
    """The C types of a parameter list, ``__restrict__`` and names dropped."""
    return [' '.join(w for w in p.split()[:-1] if w != '__restrict__') for p in params.split(',')]


def kernel_signatures(directory: Path | None = None) -> dict[str, list[str]]:
    """``{kernel: [param kind]}`` parsed from the sources; kinds: ptr, int32, int64, float32."""
    sigs = {}
    for file in (*ks.KERNEL_FILES, *ks.QUANT_KERNEL_FILES):
        for name, params in _SIGNATURE.findall(ks.kernel_source(file, directory)):
            kinds = []
            for p, ctype in zip(params.split(','), _c_params(params), strict=True):
                if '*' in p:
                    kinds.append('ptr')
                elif ctype == 'long long':
                    kinds.append('int64')
                elif ctype == 'int':
                    kinds.append('int32')
                elif ctype == 'float':
                    kinds.append('float32')
                else:
                    raise ValueError(f'{name}: unsupported parameter {p.strip()!r}')
            if sigs.setdefault(name, kinds) != kinds:  # bodies under #if share one signature
                raise ValueError(f'{name}: two definitions with different C signatures')
    return sigs


_CTYPES = {'ptr': ctypes.c_void_p, 'int32': ctypes.c_int32, 'int64': ctypes.c_int64,
           'float32': ctypes.c_float}
_NUMPY = {'int32': np.int32, 'int64': np.int64, 'float32': np.float32}
_LIBS = {}


def compiler_available() -> bool:
    """Whether g++ (C++20) is on PATH."""
    return shutil.which('g++') is not None


def harness_source(directory: Path | None = None) -> str:
    """The harness with every kernel file included and one launch branch per kernel.

    A kernel defined once per element type under ``#if`` (paged_prefill) gets one branch.
    """
    includes, branches = [], {}
    for file in (*ks.KERNEL_FILES, *ks.QUANT_KERNEL_FILES):
        includes.append(f'#include "{file}"')
        for name, params in _SIGNATURE.findall(ks.kernel_source(file, directory)):
            args = ', '.join(f'ARG({i}, {t})' for i, t in enumerate(_c_params(params)))
            branches[name] = (f'  if (n == "{name}") {{\n'
                              f'    auto body = [&] {{ {name}({args}); }};\n'
                              f'    return launch(gx, gy, gz, bx, body);\n  }}')
    return HARNESS.replace('@INCLUDES@', '\n'.join(includes)).replace(
        '@DISPATCH@', '\n'.join(branches.values()))


def flushes_subnormals(dtype: str, head_dim: int) -> bool:
    """Whether a GPU runs this variant's kernels with fp32 flush-to-zero (CuPy's -ftz=true)."""
    return all('-ftz=true' in var.nvrtc_options(sm) for sm in ks.TARGET_SMS
               for var in (ks.variant('kv_write.cu', dtype, head_dim), ks.quant_variant(dtype)))


def _build(dtype: str, head_dim: int, directory: Path | None = None) -> ctypes.CDLL:
    options = dict.fromkeys((*ks.variant('kv_write.cu', dtype, head_dim).options,
                             *ks.quant_variant(dtype).options))
    src_dir = directory or ks.kernels_dir()
    harness = harness_source(directory)
    sources = ''.join(p.read_text() for p in sorted(src_dir.glob('*.cu*')))
    key = hashlib.sha256('\0'.join((harness, sources, *options)).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f'orin_llm_kernel_emulator_{key}'
    lib = cache / 'emu.so'
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cpp = cache / 'harness.cpp'
        cpp.write_text(harness)
        tmp = cache / f'emu.{id(cpp)}.so'
        defines = [o for o in options if o.startswith('-D')]
        cmd = ['g++', '-std=c++20', '-O2', '-shared', '-fPIC', '-w',
               f'-I{src_dir}', *defines, str(cpp), '-o', str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"emulator build failed:\n{' '.join(cmd)}\n{res.stderr}")
        tmp.replace(lib)
    so = ctypes.CDLL(str(lib))
    so.emu_launch.restype = ctypes.c_int
    so.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    return so


def _library(dtype: str, head_dim: int, directory: Path | None = None) -> ctypes.CDLL:
    key = (dtype, head_dim, None if directory is None else str(directory))
    if key not in _LIBS:
        _LIBS[key] = _build(dtype, head_dim, directory)
    return _LIBS[key]


def check_grid(name: str, grid) -> None:
    """Raise ``ValueError`` when ``grid`` exceeds CUDA's limits (``GRID_LIMITS``)."""
    for axis, size, limit in zip('xyz', grid, GRID_LIMITS, strict=True):
        if not 0 < size <= limit:
            raise ValueError(f'{name}: gridDim.{axis} = {size}, CUDA allows 1..{limit}')


def emulated_launch(dtype: str, head_dim: int, directory: Path | None = None):
    """A ``launch(name, grid, block, args)`` running the kernels of this variant on the CPU.

    ``directory``: kernel sources to build instead of ``cuda_kernels/`` (a mutated copy).
    """
    so = _library(dtype, head_dim, directory)
    sigs = kernel_signatures(directory)
    flush = int(flushes_subnormals(dtype, head_dim))

    def launch(name, grid, block, args):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        check_grid(name, grid)
        kinds = sigs[name]
        if len(args) != len(kinds):
            raise TypeError(f'{name}: {len(args)} arguments for {len(kinds)} parameters')
        values = []
        for i, (arg, kind) in enumerate(zip(args, kinds, strict=True)):
            if kind == 'ptr':
                ok = isinstance(arg, int) and not isinstance(arg, bool | np.generic)
            else:
                ok = type(arg) is _NUMPY[kind]
            if not ok:
                raise TypeError(f'{name}: argument {i} is {type(arg).__name__}, C wants {kind}')
            values.append(_CTYPES[kind](arg))
        argv = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        rc = so.emu_launch(name.encode(), *grid, block[0], argv, flush)
        if rc:
            raise RuntimeError(f'emu_launch({name}, grid={grid}, block={block}) -> {rc}')

    return launch


def mma_ops(dtype: str, head_dim: int) -> int:
    """Warp-wide tensor-core mma operations the ``(dtype, head_dim)`` kernels ran so far.

    Counted over this process, for the fp16 / bf16 builds.
    """
    so = _library(dtype, head_dim)
    so.emu_mma_ops.restype = ctypes.c_longlong
    return so.emu_mma_ops()


def mma_probe(dtype: str, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Run ``mma_m16n8k16`` (``cuda_kernels/mma.cuh``) once on one emulated warp.

    ``a`` uint32 ``[32, 4]`` and ``b`` uint32 ``[32, 2]``: each lane's fragment registers;
    ``acc`` float32 ``[32, 4]``: each lane's accumulators. Returns the accumulators after.
    """
    so = _library(dtype, ks.HEAD_DIMS[0])
    a, b = (np.ascontiguousarray(x, dtype=np.uint32) for x in (a, b))
    out = np.array(acc, dtype=np.float32, order='C')
    if a.shape != (32, 4) or b.shape != (32, 2) or out.shape != (32, 4):
        raise ValueError('fragments: a [32, 4], b [32, 2], acc [32, 4]')
    ptr = ctypes.c_void_p
    rc = so.emu_mma_probe(ptr(a.ctypes.data), ptr(b.ctypes.data), ptr(out.ctypes.data))
    if rc:
        raise RuntimeError(f'emu_mma_probe -> {rc}')
    return out


class CountingLaunch(LaunchCounter):
    """``cuda_ops.LaunchCounter`` that also keeps each kernel's last arguments."""

    def __init__(self, launch):
        super().__init__(launch)
        self.last_args = {}

    def __call__(self, name, grid, block, args):
        self.last_args[name] = args
        super().__call__(name, grid, block, args)


def fused_runner(model, num_blocks, block_size, max_len, launch):
    """A CPU ModelRunner whose attention runs the emulated kernels, and its ``FusedOps``.

    Install the ops with ``kernels.dispatch.installed("cpu", torch.float32, ops)`` around the
    runner's steps for the layers' fused kernels (quantized GEMVs included) to run too.
    """
    from orin_llm_node.attention.cuda_backend import CudaPagedAttention
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.kernels.cuda_ops import FusedOps

    tc = model.config.text
    runner = ModelRunner(model, num_blocks, block_size, max_len, torch.device('cpu'),
                         torch.float32)
    runner.attn = CudaPagedAttention(runner.kv_cache, tc.num_attention_heads, max_len,
                                     launch=launch)
    runner.attn.warmup()
    return runner, FusedOps(torch.float32, tc.head_dim, torch.device('cpu'), launch=launch)


def fused_and_torch_steps(ref, runner, ops, launch, prompt, table, decode_steps):
    """Prefill ``prompt``, then teacher-forced greedy decode steps, on both runners.

    ``ref`` runs the torch path, ``runner`` the emulated kernels with ``ops`` installed for
    its steps. Yields ``(want, got)`` logits for the prefill and then each decode step;
    ``launch`` (a :class:`CountingLaunch`) is cleared before each step, so at a yield its
    counts are that step's launches.
    """
    from orin_llm_node.kernels import dispatch

    pos = np.tile(np.arange(len(prompt)), (3, 1))
    launch.counts.clear()
    want = ref.prefill(prompt, pos, table, 0)
    with dispatch.installed(runner.device, torch.float32, ops):
        got = runner.prefill(prompt, pos, table, 0)
    yield want, got
    for step in range(decode_steps):
        token = int(want.argmax())
        context = len(prompt) + step + 1
        want = ref.decode(token, context - 1, table, context)
        launch.counts.clear()
        with dispatch.installed(runner.device, torch.float32, ops):
            got = runner.decode(token, context - 1, table, context)
        yield want, got
