// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// qk_norm_rope_kv_write: one launch for everything between the qkv projection and attention.
//   q_out[t, h]                = rope(weight_q * dtype(rmsnorm(q[t, h])))        (every q head)
//   k_cache[slot[t], h]        = rope(weight_k * dtype(rmsnorm(k[t, h])))        (every KV head)
//   v_cache[slot[t], h]        = v[t, h]
// with rope(x) = dtype(dtype(x * cos[t]) + dtype(rotate_half(x) * sin[t])) -- the rounding
// points of the torch path (layers/layernorm.py, layers/rotary_embedding.py). cos/sin
// [tokens, HEAD_DIM] are the step's interleaved M-RoPE tables, computed once per model call
// from 1-D (decode) or 3-D (prefill) positions, so one kernel serves N = 1 and N > 1. Slot -1
// skips the KV write of that token (its q is still produced). The slot mapping is read from
// device memory: graph-safe.
//
// grid: (tokens), block: (NUM_THREADS). THREADS_PER_TOKEN lanes hold one head vector (VEC
// elements each, 16-byte loads); the rotate_half partner of a lane's elements sits in lane
// ^ (THREADS_PER_TOKEN / 2) of the same group, fetched with a warp shuffle.
// Layouts (elements): q [tokens, num_q_heads, HEAD_DIM], k/v [tokens, num_kv_heads, HEAD_DIM]
// with row strides (views into the merged qkv output are fine); q_out contiguous
// [tokens, num_q_heads, HEAD_DIM]; k_cache/v_cache [num_slots, num_kv_heads, HEAD_DIM] (one
// layer's planes); weights [HEAD_DIM].
#include "common.cuh"

#define HEAD_GROUPS (NUM_THREADS / THREADS_PER_TOKEN)

static_assert(THREADS_PER_TOKEN >= 2, "rotate_half pairs two lanes of a head vector");

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
qk_norm_rope_kv_write(scalar_t* __restrict__ q_out, scalar_t* __restrict__ k_cache,
                      scalar_t* __restrict__ v_cache, const scalar_t* __restrict__ q,
                      const scalar_t* __restrict__ k, const scalar_t* __restrict__ v,
                      const scalar_t* __restrict__ q_weight,
                      const scalar_t* __restrict__ k_weight, const scalar_t* __restrict__ cos,
                      const scalar_t* __restrict__ sin,
                      const long long* __restrict__ slot_mapping, int num_q_heads,
                      int num_kv_heads, long long q_row_stride, long long k_row_stride,
                      long long v_row_stride, float eps) {
  const int token = blockIdx.x;
  const long long slot = slot_mapping[token];
  const int group = threadIdx.x / THREADS_PER_TOKEN;
  const int glane = threadIdx.x % THREADS_PER_TOKEN;
  const int dim0 = glane * VEC;
  const bool first_half = dim0 < HEAD_DIM / 2;
  const int total = num_q_heads + 2 * num_kv_heads;

  float c[VEC], s[VEC];
  load_vec(cos + (long long)token * HEAD_DIM + dim0, c);
  load_vec(sin + (long long)token * HEAD_DIM + dim0, s);

  // Every lane runs the same number of iterations (masked), so the shuffles are legal.
  for (int base = 0; base < total; base += HEAD_GROUPS) {
    const int h = base + group;
    const bool valid = h < total;
    const bool is_q = h < num_q_heads;
    const bool is_k = !is_q && h < num_q_heads + num_kv_heads;
    const bool is_v = valid && !is_q && !is_k;
    float f[VEC];
    if (is_q) {
      load_vec(q + (long long)token * q_row_stride + (long long)h * HEAD_DIM + dim0, f);
    } else if (is_k) {
      load_vec(k + (long long)token * k_row_stride + (long long)(h - num_q_heads) * HEAD_DIM +
                   dim0, f);
    } else if (is_v) {
      load_vec(v + (long long)token * v_row_stride +
                   (long long)(h - num_q_heads - num_kv_heads) * HEAD_DIM + dim0, f);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += f[j] * f[j];
    ss = group_sum<THREADS_PER_TOKEN>(ss);
    const bool normed = is_q || is_k;
    if (normed) {
      const float inv = 1.f / sqrtf(ss / (float)HEAD_DIM + eps);
      float w[VEC];
      load_vec((is_q ? q_weight : k_weight) + dim0, w);
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = round_to_dtype(w[j] * round_to_dtype(f[j] * inv));
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float partner = __shfl_xor_sync(0xffffffffu, f[j], THREADS_PER_TOKEN / 2);
      if (normed) {
        const float rot = first_half ? -partner : partner;
        f[j] = add_rn(round_to_dtype(mul_rn(f[j], c[j])), round_to_dtype(mul_rn(rot, s[j])));
      }
    }
    if (is_q) {
      store_vec(q_out + ((long long)token * num_q_heads + h) * HEAD_DIM + dim0, f);
    } else if (slot >= 0 && is_k) {
      store_vec(k_cache + (slot * num_kv_heads + (h - num_q_heads)) * HEAD_DIM + dim0, f);
    } else if (slot >= 0 && is_v) {
      store_vec(v_cache + (slot * num_kv_heads + (h - num_q_heads - num_kv_heads)) * HEAD_DIM +
                    dim0, f);
    }
  }
}
