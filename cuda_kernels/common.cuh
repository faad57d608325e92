// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Shared helpers for the paged-attention and fused decode-step kernels. The element type, its
// conversions and the torch-matching rounding helpers are in dtype.cuh, the warp reductions in
// warp.cuh: both are shared with the quantized GEMV kernels (quant_linear.cu).
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
//   NUM_THREADS     threads per CTA of the kv_write / decode / prefill / per-head kernels
//   PREFILL_ROWS_PER_WARP  query rows each warp of an fp32 paged_prefill CTA scores
//   PREFILL_TC_ROWS, PREFILL_TC_KV_TILE  query rows per CTA, keys per shared-memory tile of the
//                   fp16/bf16 (tensor-core) paged_prefill
#pragma once

#if !defined(KV_DTYPE_ID) || !defined(HEAD_DIM) || !defined(PARTITION_SIZE) || \
    !defined(MAX_GROUP) || !defined(NUM_THREADS) || !defined(SPLIT_MIN_TOKENS)
#error "compile through orin_llm_node.kernel_sources: KV_DTYPE_ID, HEAD_DIM, PARTITION_SIZE, SPLIT_MIN_TOKENS, MAX_GROUP, NUM_THREADS"
#endif

#include "dtype.cuh"
#include "warp.cuh"

// Lanes that together hold one head vector (one token of one KV head).
#define THREADS_PER_TOKEN (HEAD_DIM / VEC)
#define NUM_WARPS (NUM_THREADS / WARP_SIZE)

static_assert(HEAD_DIM % VEC == 0, "HEAD_DIM must be a multiple of 16 bytes of elements");
static_assert(THREADS_PER_TOKEN <= WARP_SIZE && WARP_SIZE % THREADS_PER_TOKEN == 0,
              "a head vector must be covered by a power-of-two part of one warp");
static_assert(NUM_THREADS % WARP_SIZE == 0, "NUM_THREADS must be whole warps");
static_assert(HEAD_DIM <= NUM_THREADS, "the reduce kernel uses one thread per dimension");

#define NEG_INF (-__int_as_float(0x7f800000))

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
