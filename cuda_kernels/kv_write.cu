// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// kv_write: scatter the K/V of N new tokens into one layer of the paged KV cache.
//
// KV tensor: [layers, 2, num_blocks, block_size, kv_heads, HEAD_DIM]; the caller passes the
// K and V planes of one layer (kv[layer, 0] and kv[layer, 1]), each [num_slots, kv_heads,
// HEAD_DIM] with slot = block_id * block_size + offset. slot_mapping[i] == -1 skips token i
// (padding). The slot mapping (int64, torch's index dtype) is read from device memory, so the
// launch is graph-safe.
#include "common.cuh"

// grid: (num_tokens), block: (NUM_THREADS)
// k, v: [num_tokens, kv_heads, HEAD_DIM], head vectors contiguous, row strides in elements
// (multiples of VEC, 16-byte aligned base).
extern "C" __global__ void __launch_bounds__(NUM_THREADS)
kv_write(scalar_t* __restrict__ k_cache, scalar_t* __restrict__ v_cache,
         const scalar_t* __restrict__ k, const scalar_t* __restrict__ v,
         const long long* __restrict__ slot_mapping, int num_kv_heads,
         long long k_row_stride, long long v_row_stride) {
  const int token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  const int row_vecs = num_kv_heads * (HEAD_DIM / VEC);
  const long long dst = slot * num_kv_heads * HEAD_DIM;
  const scalar_t* ks = k + (long long)token * k_row_stride;
  const scalar_t* vs = v + (long long)token * v_row_stride;
  for (int i = threadIdx.x; i < row_vecs; i += NUM_THREADS) {
    const long long off = (long long)i * VEC;
    *reinterpret_cast<uint4*>(k_cache + dst + off) = *reinterpret_cast<const uint4*>(ks + off);
    *reinterpret_cast<uint4*>(v_cache + dst + off) = *reinterpret_cast<const uint4*>(vs + off);
  }
}
