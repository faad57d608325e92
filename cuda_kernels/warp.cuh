// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Warp-shuffle reductions shared by the attention, fused decode-step and quantized GEMV
// kernels. Header-free like the rest (see common.cuh); test/kernel_emulator.py provides
// __shfl_xor_sync for its host build.
#pragma once

#define WARP_SIZE 32

// Sum over the aligned group of WIDTH lanes this lane belongs to (every lane gets the sum).
// All 32 lanes of the warp must call it (full-mask shuffles).
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
