// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Shared helpers for the paged-attention and fused decode-step kernels.
//
// Header-free on purpose: no <cuda_fp16.h>/<cuda_bf16.h>. CuPy's NVRTC build, Jetson's
// toolkit and the pip NVRTC wheel each ship (or lack) different versions of those headers,
// and mixing them is a known source of compile errors at run time. The few conversions we need
// are a PTX instruction (fp16) or exact bit arithmetic (bf16), so every variant compiles with
// nothing on the include path -- the CPU NVRTC test compiles exactly what the runtime compiles.
// The !__CUDA_ARCH__ branches exist only for test/kernel_emulator.py, which builds these
// kernels as host C++ to check their results on machines without a GPU.
//
// Compile-time configuration, passed as -D options by orin_llm_node/kernel_sources.py (the one
// place that lists the variants):
//   KV_DTYPE_ID     0 = float16, 1 = bfloat16, 2 = float32 (activations and KV cache)
//   HEAD_DIM        head dimension (32, 64, 128)
//   PARTITION_SIZE  tokens per shared-memory pass of a decode split
//   SPLIT_MIN_TOKENS  fewest tokens worth a decode split of their own
//   MAX_GROUP       query heads (of one KV head) handled by one decode CTA
//   NUM_THREADS     threads per CTA of the kv_write / decode / per-head kernels
#pragma once

#if !defined(KV_DTYPE_ID) || !defined(HEAD_DIM) || !defined(PARTITION_SIZE) || \
    !defined(MAX_GROUP) || !defined(NUM_THREADS) || !defined(SPLIT_MIN_TOKENS)
#error "compile through orin_llm_node.kernel_sources: KV_DTYPE_ID, HEAD_DIM, PARTITION_SIZE, SPLIT_MIN_TOKENS, MAX_GROUP, NUM_THREADS"
#endif

#if KV_DTYPE_ID == 0 || KV_DTYPE_ID == 1
typedef unsigned short scalar_t;  // raw 16-bit storage of a half / bfloat16 value
#elif KV_DTYPE_ID == 2
typedef float scalar_t;
#else
#error "KV_DTYPE_ID must be 0 (float16), 1 (bfloat16) or 2 (float32)"
#endif

// One vectorised access moves 16 bytes: VEC elements of scalar_t.
#define VEC (16 / (int)sizeof(scalar_t))
// Lanes that together hold one head vector (one token of one KV head).
#define THREADS_PER_TOKEN (HEAD_DIM / VEC)
#define WARP_SIZE 32
#define NUM_WARPS (NUM_THREADS / WARP_SIZE)

static_assert(HEAD_DIM % VEC == 0, "HEAD_DIM must be a multiple of 16 bytes of elements");
static_assert(THREADS_PER_TOKEN <= WARP_SIZE && WARP_SIZE % THREADS_PER_TOKEN == 0,
              "a head vector must be covered by a power-of-two part of one warp");
static_assert(NUM_THREADS % WARP_SIZE == 0, "NUM_THREADS must be whole warps");
static_assert(HEAD_DIM <= NUM_THREADS, "the reduce kernel uses one thread per dimension");

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float to_float(scalar_t x) {
#if KV_DTYPE_ID == 0 && defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
#elif KV_DTYPE_ID == 0  // host build of the CPU emulation test (test/kernel_emulator.py)
  return (float)__builtin_bit_cast(_Float16, x);
#elif KV_DTYPE_ID == 1
  return __uint_as_float(((unsigned int)x) << 16);
#else
  return x;
#endif
}

__device__ __forceinline__ scalar_t from_float(float f) {
#if KV_DTYPE_ID == 0 && defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#elif KV_DTYPE_ID == 0
  return __builtin_bit_cast(unsigned short, (_Float16)f);
#elif KV_DTYPE_ID == 1
  // Round to nearest even, as torch's float -> bfloat16 cast does; NaN stays a quiet NaN.
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return (unsigned short)((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
#else
  return f;
#endif
}

// Unpack one 16-byte word into VEC floats (element 0 sits in the low bits: little endian).
__device__ __forceinline__ void unpack(uint4 r, float (&out)[VEC]) {
  const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#if KV_DTYPE_ID == 2
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = to_float((scalar_t)(w[i] & 0xffffu));
    out[2 * i + 1] = to_float((scalar_t)(w[i] >> 16));
  }
#endif
}

__device__ __forceinline__ void load_vec(const scalar_t* p, float (&out)[VEC]) {
  unpack(*reinterpret_cast<const uint4*>(p), out);
}

// Round VEC floats to scalar_t and store them as one 16-byte word.
__device__ __forceinline__ void store_vec(scalar_t* p, const float (&in)[VEC]) {
  uint4 r;
#if KV_DTYPE_ID == 2
  r.x = __float_as_uint(in[0]);
  r.y = __float_as_uint(in[1]);
  r.z = __float_as_uint(in[2]);
  r.w = __float_as_uint(in[3]);
#else
  unsigned int w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = (unsigned int)from_float(in[2 * i]) | ((unsigned int)from_float(in[2 * i + 1]) << 16);
  }
  r.x = w[0];
  r.y = w[1];
  r.z = w[2];
  r.w = w[3];
#endif
  *reinterpret_cast<uint4*>(p) = r;
}

// The value a torch op in the activation dtype would produce: round an fp32 result to scalar_t.
// The fused kernels round where the reference's separate torch ops round, so their results
// match the torch path (the parity oracle) up to fp32 summation order.
__device__ __forceinline__ float round_to_dtype(float x) { return to_float(from_float(x)); }

// Products and sums that must not be contracted into an FMA (a torch elementwise op rounds each
// of them on its own).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
#else
__device__ __forceinline__ float mul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
#endif

// Sum over the aligned group of WIDTH lanes this lane belongs to (every lane gets the sum).
// All 32 lanes of the warp must call it (full-mask shuffles).
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole CTA (blockDim.x threads, whole warps); every thread gets the same sum,
// added in warp order (deterministic). s_warp: WARP_SIZE floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* s_warp) {
  v = group_sum<WARP_SIZE>(v);
  if (threadIdx.x % WARP_SIZE == 0) s_warp[threadIdx.x / WARP_SIZE] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < (int)(blockDim.x / WARP_SIZE); ++w) total += s_warp[w];
  __syncthreads();  // s_warp may be reused right after
  return total;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
