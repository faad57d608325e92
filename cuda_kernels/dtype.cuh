// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// The activation / KV element type (scalar_t), its exact conversions to and from float, its
// 16-byte vector loads / stores and the rounding helpers that make a kernel round where torch
// does; shared by every kernel. Header-free (see common.cuh for why); the !__CUDA_ARCH__ branches
// serve test/kernel_emulator.py's host build.
//
//   KV_DTYPE_ID  0 = float16, 1 = bfloat16, 2 = float32
//
// Flush-to-zero: CuPy compiles every kernel with -ftz=true (kernel_sources.CUPY_OPTIONS), so an
// fp32 subnormal operand reads as 0 and a subnormal result becomes 0. Where that shows: a bf16
// subnormal (|x| < 2^-126) converts to an fp32 subnormal and reads as 0; softmax weights and
// SiLU values below 2^-126 vanish -- all far below any result's rounding. fp16 values are
// normal in fp32. A path that must be exact never forms a subnormal (quant_linear.cu's FP8
// decode). The CPU emulator runs with FTZ|DAZ to match.
#pragma once

#if !defined(KV_DTYPE_ID)
#error "compile through orin_llm_node.kernel_sources: KV_DTYPE_ID"
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
