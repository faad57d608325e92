// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// The activation / KV element type (scalar_t) and its exact conversions to and from float,
// shared by every kernel. Header-free (see common.cuh for why); the !__CUDA_ARCH__ branches
// serve test/kernel_emulator.py's host build.
//
//   KV_DTYPE_ID  0 = float16, 1 = bfloat16, 2 = float32
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
