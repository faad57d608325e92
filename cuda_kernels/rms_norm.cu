// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// RMSNorm over rows of the hidden state, alone or fused with the residual add before it.
//
// rms_norm:      out = weight * dtype(x * rsqrt(mean(x^2) + eps))
// add_rms_norm:  residual = dtype(residual + x)          (written in place)
//                out = weight * dtype(residual * rsqrt(mean(residual^2) + eps))
// The rounding points are the reference's (layers/layernorm.py): the residual add happens in
// the activation dtype, the normalisation in fp32, then the cast, then the weight multiply
// (itself rounded to the dtype). One launch replaces torch's add + ~8 elementwise kernels.
//
// grid: (rows), block: (threads) with threads a multiple of 32, at most 1024 -- the wrapper
// picks about one 16-byte vector per thread. Rows are n_cols elements (a multiple of VEC),
// 16-byte aligned, with row strides in elements (multiples of VEC).
#include "common.cuh"

// out = weight * dtype(x * inv) over this thread's vectors of one row.
__device__ __forceinline__ void scale_row(scalar_t* __restrict__ out,
                                          const scalar_t* __restrict__ x,
                                          const scalar_t* __restrict__ weight, int n_cols,
                                          float inv) {
  for (int c = threadIdx.x * VEC; c < n_cols; c += blockDim.x * VEC) {
    float f[VEC], w[VEC];
    load_vec(x + c, f);
    load_vec(weight + c, w);
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = w[j] * round_to_dtype(f[j] * inv);
    store_vec(out + c, f);
  }
}

extern "C" __global__ void __launch_bounds__(1024)
rms_norm(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
         const scalar_t* __restrict__ weight, int n_cols, long long x_row_stride,
         long long out_row_stride, float eps) {
  __shared__ float s_warp[WARP_SIZE];
  const scalar_t* xr = x + (long long)blockIdx.x * x_row_stride;
  scalar_t* orow = out + (long long)blockIdx.x * out_row_stride;
  const int step = blockDim.x * VEC;
  float ss = 0.f;
  for (int c = threadIdx.x * VEC; c < n_cols; c += step) {
    float f[VEC];
    load_vec(xr + c, f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += f[j] * f[j];
  }
  scale_row(orow, xr, weight, n_cols, 1.f / sqrtf(block_sum(ss, s_warp) / (float)n_cols + eps));
}

extern "C" __global__ void __launch_bounds__(1024)
add_rms_norm(scalar_t* __restrict__ out, scalar_t* __restrict__ residual,
             const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight, int n_cols,
             long long x_row_stride, long long residual_row_stride, long long out_row_stride,
             float eps) {
  __shared__ float s_warp[WARP_SIZE];
  const scalar_t* xr = x + (long long)blockIdx.x * x_row_stride;
  scalar_t* rr = residual + (long long)blockIdx.x * residual_row_stride;
  scalar_t* orow = out + (long long)blockIdx.x * out_row_stride;
  const int step = blockDim.x * VEC;
  float ss = 0.f;
  for (int c = threadIdx.x * VEC; c < n_cols; c += step) {
    float f[VEC], r[VEC];
    load_vec(xr + c, f);
    load_vec(rr + c, r);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      r[j] = round_to_dtype(r[j] + f[j]);
      ss += r[j] * r[j];
    }
    store_vec(rr + c, r);  // exact: r already holds dtype values
  }
  // Each thread re-reads only the residual vectors it wrote itself: no barrier needed.
  scale_row(orow, rr, weight, n_cols, 1.f / sqrtf(block_sum(ss, s_warp) / (float)n_cols + eps));
}
