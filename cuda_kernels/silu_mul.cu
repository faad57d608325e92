// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// silu_and_mul: out = dtype(silu(gate)) * up over the merged gate/up projection's output,
// x = [gate | up] per row. Rounds where torch's F.silu(gate) * up does (silu in fp32, cast,
// product cast). One launch instead of silu + mul (+ the chunk's copies).
//
// grid: (rows, ceil(n_cols / (VEC * NUM_THREADS))), block: (NUM_THREADS). n_cols (the
// intermediate size) a multiple of VEC; x row stride and out row stride in elements
// (multiples of VEC), 16-byte aligned bases.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
silu_and_mul(scalar_t* __restrict__ out, const scalar_t* __restrict__ x, int n_cols,
             long long x_row_stride, long long out_row_stride) {
  const int c = (blockIdx.y * NUM_THREADS + threadIdx.x) * VEC;
  if (c >= n_cols) return;
  const scalar_t* xr = x + (long long)blockIdx.x * x_row_stride;
  float g[VEC], u[VEC];
  load_vec(xr + c, g);
  load_vec(xr + n_cols + c, u);
#pragma unroll
  for (int j = 0; j < VEC; ++j) g[j] = round_to_dtype(g[j] / (1.f + expf(-g[j]))) * u[j];
  store_vec(out + (long long)blockIdx.x * out_row_stride + c, g);
}
