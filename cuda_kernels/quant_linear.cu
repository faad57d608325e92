// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Weight-only quantized linear layers (INT8, INT4, FP8 e4m3): a dequantising GEMV for decode
// and a dequantise-to-dense kernel for prefill (the caller then runs a cuBLAS matmul on the
// dense scratch weight).
//
// Layout (orin_llm_node/quantization/base.py): codes [n_out, k] bytes (int8, fp8 e4m3) or
// [n_out, k / 8] int32 (int4: nibble i of word w is column 8w + i, unsigned); scale
// [n_out, groups] fp32, group g covering columns [g * group_size, (g + 1) * group_size);
// zeros [n_out, groups] uint8 (asymmetric int4) or null (int4: 8, int8 / fp8: 0); bias
// [n_out] scalar_t or null. Weight (n, c) = (code(n, c) - zero(n, g)) * scale(n, g).
//
// quant_gemv_<fmt>: grid (ceil(n_out / GEMV_WARPS), rows), block (GEMV_WARPS * 32). One warp
//   per output feature and row; each lane reads 16 bytes of codes (CHUNK columns: 16 for
//   int8 / fp8, 32 for int4) and the matching activations per step, accumulates in fp32, and
//   the warp reduces with shuffles; one rounding to scalar_t. Needs k % CHUNK == 0 and
//   group_size % CHUNK == 0 (QuantLinear.kernel_supported; other shapes take the torch path).
//   Reads nothing but its arguments: graph-safe, no shared memory.
// quant_dequant_<fmt>: grid (ceil(n_out * k / CHUNK / (GEMV_WARPS * 32))), same block; one
//   thread per CHUNK columns of one row, written as (code - zero) * scale rounded once to
//   scalar_t -- bit-identical to the torch path's dequantize(dtype).
//
// FP8 is decoded without fp8 instructions (sm_87 has none) and without ever forming an fp32
// subnormal: CuPy compiles with -ftz=true (kernel_sources.CUPY_OPTIONS), so a subnormal read
// as an operand is 0. A normal e4m3 code (exponent field 1..15) has its exponent and mantissa
// bits moved into a float's fields and the exponent rebased by an integer add of 120 (the bias
// difference 127 - 7); a zero-exponent code is m * 2^-9, computed as the integer m converted
// to float times the normal 2^-9 (exact: m < 8). Both are exact, so decode matches torch's
// cast for every finite code. NaN codes are not produced by quantizers and are not
// special-cased. The decoded values times the fp32 scales stay normal for any real weight (a
// dequantised weight below 2^-126 would read as 0; quantizers never store one).
//
//   GEMV_WARPS  output features (warps) per CTA
#include "dtype.cuh"
#include "warp.cuh"

#if !defined(GEMV_WARPS)
#error "compile through orin_llm_node.kernel_sources: GEMV_WARPS"
#endif

#define GEMV_THREADS (GEMV_WARPS * WARP_SIZE)

struct Int8Codes {
  static constexpr int CHUNK = 16;
  static constexpr int BITS = 8;
  static constexpr float ZERO = 0.f;  // zero point when the layer stores none
  __device__ __forceinline__ static void decode(uint4 r, float (&c)[CHUNK]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) c[i] = (float)(signed char)((w[i / 4] >> (8 * (i % 4))) & 0xffu);
  }
};

struct Int4Codes {
  static constexpr int CHUNK = 32;
  static constexpr int BITS = 4;
  static constexpr float ZERO = 8.f;  // unsigned nibbles: symmetric int4 is centred on 8
  __device__ __forceinline__ static void decode(uint4 r, float (&c)[CHUNK]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 32; ++i) c[i] = (float)((w[i / 8] >> (4 * (i % 8))) & 0xfu);
  }
};

struct Fp8Codes {
  static constexpr int CHUNK = 16;
  static constexpr int BITS = 8;
  static constexpr float ZERO = 0.f;
  __device__ __forceinline__ static void decode(uint4 r, float (&c)[CHUNK]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
    const float two_pow_m9 = __uint_as_float(0x3b000000u);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const unsigned int b = (w[i / 4] >> (8 * (i % 4))) & 0xffu;
      const unsigned int magnitude = (b & 0x78u)
          ? ((b & 0x7fu) << 20) + (120u << 23)
          : __float_as_uint((float)(b & 0x7u) * two_pow_m9);
      c[i] = __uint_as_float(((b & 0x80u) << 24) | magnitude);
    }
  }
};

template <class Codes>
__device__ __forceinline__ void gemv(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                     const unsigned char* __restrict__ codes,
                                     const float* __restrict__ scale,
                                     const unsigned char* __restrict__ zeros,
                                     const scalar_t* __restrict__ bias, int n_out, int k,
                                     int groups, int group_size, long long x_stride,
                                     long long out_stride) {
  constexpr int CHUNK = Codes::CHUNK;
  const int lane = threadIdx.x % WARP_SIZE;
  const int n = blockIdx.x * GEMV_WARPS + (threadIdx.x / WARP_SIZE);
  if (n >= n_out) return;  // n is uniform per warp: the whole warp leaves together
  const scalar_t* xr = x + (long long)blockIdx.y * x_stride;
  const unsigned char* wr = codes + (long long)n * k * Codes::BITS / 8;
  const float* sr = scale + (long long)n * groups;
  const unsigned char* zr = zeros ? zeros + (long long)n * groups : nullptr;
  float acc = 0.f;
  for (int c0 = lane * CHUNK; c0 < k; c0 += WARP_SIZE * CHUNK) {
    float q[CHUNK];
    Codes::decode(*reinterpret_cast<const uint4*>(wr + (long long)c0 * Codes::BITS / 8), q);
    const int g = c0 / group_size;
    const float z = zr ? (float)zr[g] : Codes::ZERO;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < CHUNK; j += VEC) {
      float xv[VEC];
      load_vec(xr + c0 + j, xv);
#pragma unroll
      for (int t = 0; t < VEC; ++t) dot += xv[t] * (q[j + t] - z);
    }
    acc += dot * sr[g];
  }
  acc = group_sum<WARP_SIZE>(acc);
  if (lane == 0) {
    if (bias) acc += to_float(bias[n]);
    out[(long long)blockIdx.y * out_stride + n] = from_float(acc);
  }
}

template <class Codes>
__device__ __forceinline__ void dequant(scalar_t* __restrict__ out,
                                        const unsigned char* __restrict__ codes,
                                        const float* __restrict__ scale,
                                        const unsigned char* __restrict__ zeros, int n_out,
                                        int k, int groups, int group_size) {
  constexpr int CHUNK = Codes::CHUNK;
  const long long per_row = k / CHUNK;
  const long long i = (long long)blockIdx.x * GEMV_THREADS + threadIdx.x;
  if (i >= (long long)n_out * per_row) return;
  const long long n = i / per_row;
  const int c0 = (int)(i % per_row) * CHUNK;
  float q[CHUNK];
  Codes::decode(*reinterpret_cast<const uint4*>(codes + (n * k + c0) * Codes::BITS / 8), q);
  const int g = c0 / group_size;
  const float z = zeros ? (float)zeros[n * groups + g] : Codes::ZERO;
  const float s = scale[n * groups + g];
#pragma unroll
  for (int j = 0; j < CHUNK; ++j) out[n * k + c0 + j] = from_float((q[j] - z) * s);
}

// One spelled-out entry point per format and op (no macro): test/kernel_emulator.py parses
// these extern "C" signatures from the source text.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_gemv_int8(scalar_t* out, const scalar_t* x, const unsigned char* codes,
                const float* scale, const unsigned char* zeros, const scalar_t* bias,
                int n_out, int k, int groups, int group_size, long long x_stride,
                long long out_stride) {
  gemv<Int8Codes>(out, x, codes, scale, zeros, bias, n_out, k, groups, group_size, x_stride,
                  out_stride);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_dequant_int8(scalar_t* out, const unsigned char* codes, const float* scale,
                   const unsigned char* zeros, int n_out, int k, int groups, int group_size) {
  dequant<Int8Codes>(out, codes, scale, zeros, n_out, k, groups, group_size);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_gemv_int4(scalar_t* out, const scalar_t* x, const unsigned char* codes,
                const float* scale, const unsigned char* zeros, const scalar_t* bias,
                int n_out, int k, int groups, int group_size, long long x_stride,
                long long out_stride) {
  gemv<Int4Codes>(out, x, codes, scale, zeros, bias, n_out, k, groups, group_size, x_stride,
                  out_stride);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_dequant_int4(scalar_t* out, const unsigned char* codes, const float* scale,
                   const unsigned char* zeros, int n_out, int k, int groups, int group_size) {
  dequant<Int4Codes>(out, codes, scale, zeros, n_out, k, groups, group_size);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_gemv_fp8(scalar_t* out, const scalar_t* x, const unsigned char* codes,
               const float* scale, const unsigned char* zeros, const scalar_t* bias,
               int n_out, int k, int groups, int group_size, long long x_stride,
               long long out_stride) {
  gemv<Fp8Codes>(out, x, codes, scale, zeros, bias, n_out, k, groups, group_size, x_stride,
                 out_stride);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
quant_dequant_fp8(scalar_t* out, const unsigned char* codes, const float* scale,
                  const unsigned char* zeros, int n_out, int k, int groups, int group_size) {
  dequant<Fp8Codes>(out, codes, scale, zeros, n_out, k, groups, group_size);
}
