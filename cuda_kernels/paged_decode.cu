// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Paged decode attention of one query token (batch-1 decode), split-K ("flash decoding").
//
// paged_decode_split: grid (num_kv_heads * chunks, num_splits), block (NUM_THREADS).
//   One CTA serves one KV head and up to MAX_GROUP of its query heads (GQA: K/V are read once
//   for the whole group; chunks = ceil(group_size / MAX_GROUP)) and one split. The grid
//   is fixed when a graph is captured (num_splits sized for max_model_len and the SM count);
//   the work is spread from the context length read from device memory at run time: the
//   context is cut into decode_splits(ctx) contiguous ranges of equal size (at least
//   SPLIT_MIN_TOKENS tokens each, at most num_splits ranges), so a 128-token context keeps
//   8x as many CTAs busy as one 256-token partition per head would, and a 32k context uses
//   the whole grid. Splits past the used ones return at once. A range is walked in passes
//   of PARTITION_SIZE tokens with an online softmax, and each split writes an unnormalised
//   partial result (acc, running max, running sum) for the reduce kernel. Shared memory
//   depends only on compile-time constants, never on the context length.
// paged_decode_reduce: grid (num_q_heads), block (HEAD_DIM). Combines the splits in
//   index order (deterministic: graph replay and eager decode give identical bits).
//
// Layouts (elements): q [num_q_heads, HEAD_DIM]; k_cache/v_cache [num_slots, num_kv_heads,
// HEAD_DIM] (one layer's K / V plane); block_table [*] int64; context_len [1] int32 (tokens
// to attend, the new token included); part_acc [num_q_heads, num_splits, HEAD_DIM] fp32;
// part_ml [num_q_heads, num_splits, 2] fp32 (max and sum, log2 domain); out [num_q_heads,
// HEAD_DIM].
// Query head h uses KV head h / group_size (the repeat_interleave convention of HF GQA).
#include "common.cuh"

#define NUM_TOKEN_GROUPS (NUM_THREADS / THREADS_PER_TOKEN)

// Tokens per split for a context of ctx tokens on a grid of num_splits splits (the split and
// reduce kernels must agree). Every used split starts inside the context.
__device__ __forceinline__ int decode_split_tokens(int ctx, int num_splits) {
  const int wanted = min(num_splits, (ctx + SPLIT_MIN_TOKENS - 1) / SPLIT_MIN_TOKENS);
  return wanted > 0 ? (ctx + wanted - 1) / wanted : 1;
}

__device__ __forceinline__ int decode_splits(int ctx, int num_splits) {
  const int per = decode_split_tokens(ctx, num_splits);
  return (ctx + per - 1) / per;
}

static_assert((NUM_TOKEN_GROUPS & (NUM_TOKEN_GROUPS - 1)) == 0, "tree reduction needs 2^k");
static_assert(PARTITION_SIZE % NUM_TOKEN_GROUPS == 0, "partition must fill all token groups");

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
paged_decode_split(float* __restrict__ part_acc, float* __restrict__ part_ml,
                   const scalar_t* __restrict__ q, const scalar_t* __restrict__ k_cache,
                   const scalar_t* __restrict__ v_cache,
                   const long long* __restrict__ block_table,
                   const int* __restrict__ context_len, int num_kv_heads, int group_size,
                   int block_size, float scale_log2) {
  const int chunks = (group_size + MAX_GROUP - 1) / MAX_GROUP;
  const int kv_head = blockIdx.x / chunks;
  const int g0 = (blockIdx.x % chunks) * MAX_GROUP;
  const int ng = min(MAX_GROUP, group_size - g0);
  const int split = blockIdx.y;
  const int num_splits = gridDim.y;

  const int ctx = *context_len;
  if (split >= decode_splits(ctx, num_splits)) return;  // unused split (uniform over the CTA)
  const int per_split = decode_split_tokens(ctx, num_splits);
  const int begin = split * per_split;
  const int end = min(ctx, begin + per_split);

  __shared__ __align__(16) float s_q[MAX_GROUP][HEAD_DIM];
  __shared__ float s_p[MAX_GROUP][PARTITION_SIZE];  // logits, then probabilities
  __shared__ int s_slot[PARTITION_SIZE];
  __shared__ float s_m[MAX_GROUP], s_l[MAX_GROUP], s_scale[MAX_GROUP];
  __shared__ __align__(16) float s_red[NUM_TOKEN_GROUPS / 2][MAX_GROUP][HEAD_DIM];

  const int tid = threadIdx.x;
  const int warp = tid / WARP_SIZE;
  const int lane = tid % WARP_SIZE;
  const int group = tid / THREADS_PER_TOKEN;      // token slot of this thread
  const int glane = tid % THREADS_PER_TOKEN;      // which VEC-chunk of the head vector
  const int dim0 = glane * VEC;

  // Query (pre-scaled by softmax_scale * log2(e), so exp2 gives the softmax) into fp32 smem.
  for (int i = tid; i < MAX_GROUP * HEAD_DIM; i += NUM_THREADS) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float val = 0.f;
    if (g < ng) {
      const int qh = kv_head * group_size + g0 + g;
      val = to_float(q[(long long)qh * HEAD_DIM + d]) *
            scale_log2;
    }
    s_q[g][d] = val;
  }
  if (tid < MAX_GROUP) {
    s_m[tid] = NEG_INF;
    s_l[tid] = 0.f;
    s_scale[tid] = 1.f;
  }
  __syncthreads();

  float acc[MAX_GROUP][VEC];
#pragma unroll
  for (int g = 0; g < MAX_GROUP; ++g)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[g][j] = 0.f;

  const long long* bt = block_table;
  const long long kv_head_off = (long long)kv_head * HEAD_DIM + dim0;
  const long long slot_stride = (long long)num_kv_heads * HEAD_DIM;

  for (int start = begin; start < end; start += PARTITION_SIZE) {
    const int n = min(PARTITION_SIZE, end - start);

    // Phase 1: logits q.k for every token of the partition. The trip count is the same for
    // every lane (masked loads), so the full-warp shuffles below are legal.
    for (int base = 0; base < n; base += NUM_TOKEN_GROUPS) {
      const int i = base + group;
      const bool valid = i < n;
      float kf[VEC];
      if (valid) {
        const int t = start + i;
        const int slot = (int)bt[t / block_size] * block_size + t % block_size;
        if (glane == 0) s_slot[i] = slot;
        load_vec(k_cache + (long long)slot * slot_stride + kv_head_off, kf);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) kf[j] = 0.f;
      }
#pragma unroll
      for (int g = 0; g < MAX_GROUP; ++g) {
        if (g < ng) {  // uniform over the CTA
          float dot = 0.f;
#pragma unroll
          for (int j = 0; j < VEC; j += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(&s_q[g][dim0 + j]);
            dot += qv.x * kf[j] + qv.y * kf[j + 1] + qv.z * kf[j + 2] + qv.w * kf[j + 3];
          }
          dot = group_sum<THREADS_PER_TOKEN>(dot);
          if (valid && glane == 0) s_p[g][i] = dot;
        }
      }
    }
    __syncthreads();

    // Online softmax bookkeeping: warp w owns query heads w, w + NUM_WARPS, ...
    for (int g = warp; g < ng; g += NUM_WARPS) {
      float mx = NEG_INF;
      for (int i = lane; i < n; i += WARP_SIZE) mx = fmaxf(mx, s_p[g][i]);
      mx = warp_max(mx);
      const float m_old = s_m[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int i = lane; i < n; i += WARP_SIZE) {
        const float e = exp2f(s_p[g][i] - m_new);
        s_p[g][i] = e;
        sum += e;
      }
      sum = group_sum<WARP_SIZE>(sum);
      if (lane == 0) {
        const float sc = exp2f(m_old - m_new);  // 0 on the first partition (m_old = -inf)
        s_scale[g] = sc;
        s_l[g] = s_l[g] * sc + sum;
        s_m[g] = m_new;
      }
    }
    __syncthreads();

    // Phase 2: acc = acc * rescale + sum_i p_i * v_i over this thread's tokens and dims.
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g) {
      if (g < ng) {
        const float sc = s_scale[g];
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[g][j] *= sc;
      }
    }
    for (int i = group; i < n; i += NUM_TOKEN_GROUPS) {
      float vf[VEC];
      load_vec(v_cache + (long long)s_slot[i] * slot_stride + kv_head_off, vf);
#pragma unroll
      for (int g = 0; g < MAX_GROUP; ++g) {
        if (g < ng) {
          const float p = s_p[g][i];
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[g][j] += p * vf[j];
        }
      }
    }
    __syncthreads();  // s_p / s_slot are rewritten by the next partition
  }

  // Deterministic tree reduction of the token groups' partial sums.
  for (int active = NUM_TOKEN_GROUPS; active > 1; active /= 2) {
    const int half = active / 2;
    if (group >= half && group < active) {
#pragma unroll
      for (int g = 0; g < MAX_GROUP; ++g) {
        if (g < ng) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) s_red[group - half][g][dim0 + j] = acc[g][j];
        }
      }
    }
    __syncthreads();
    if (group < half) {
#pragma unroll
      for (int g = 0; g < MAX_GROUP; ++g) {
        if (g < ng) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[g][j] += s_red[group][g][dim0 + j];
        }
      }
    }
    __syncthreads();
  }

  if (group == 0) {
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g) {
      if (g < ng) {
        const int qh = kv_head * group_size + g0 + g;
        float* dst = part_acc + ((long long)qh * num_splits + split) *
                                    HEAD_DIM + dim0;
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
          *reinterpret_cast<float4*>(dst + j) =
              make_float4(acc[g][j], acc[g][j + 1], acc[g][j + 2], acc[g][j + 3]);
        }
      }
    }
  }
  if (tid < ng) {
    const int qh = kv_head * group_size + g0 + tid;
    float* ml = part_ml + ((long long)qh * num_splits + split) * 2;
    ml[0] = s_m[tid];
    ml[1] = s_l[tid];
  }
}

extern "C" __global__ void __launch_bounds__(HEAD_DIM)
paged_decode_reduce(scalar_t* __restrict__ out, const float* __restrict__ part_acc,
                    const float* __restrict__ part_ml, const int* __restrict__ context_len,
                    int num_splits) {
  const int qh = blockIdx.x;
  const int d = threadIdx.x;
  const int ctx = *context_len;
  const int n = decode_splits(ctx, num_splits);
  scalar_t* o = out + (long long)qh * HEAD_DIM + d;
  if (n <= 0) {
    *o = from_float(0.f);
    return;
  }
  const long long base = (long long)qh * num_splits;
  float m = NEG_INF;
  for (int s = 0; s < n; ++s) m = fmaxf(m, part_ml[(base + s) * 2]);
  float l = 0.f, acc = 0.f;
  for (int s = 0; s < n; ++s) {
    const float w = exp2f(part_ml[(base + s) * 2] - m);
    l += part_ml[(base + s) * 2 + 1] * w;
    acc += part_acc[(base + s) * HEAD_DIM + d] * w;
  }
  *o = from_float(acc / l);
}
