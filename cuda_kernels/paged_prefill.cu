// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// Paged prefill attention: the N new tokens of one sequence attend to its cached prefix and to
// themselves, reading K/V straight through the block table (no gather of the context into a
// contiguous copy), bottom-right causal, GQA.
//
// Why a kernel of our own: a robot's every question has a new length, and attention backends
// that plan per shape (or kernels specialised on the sequence lengths) stall on each new one.
// This kernel has one code path for every length: the grid follows the number of query rows,
// shared memory depends only on compile-time constants, and the lengths are read from device
// memory, so a prefill padded to a bucket can be captured in a CUDA graph and replayed for any
// real length up to the bucket.
//
// grid: (num_kv_heads, ceil(num_q * group_size / PREFILL_ROWS)), block: (NUM_THREADS).
//   The query rows of one KV head are (token, head-in-group) pairs, token-major; one CTA takes
//   PREFILL_ROWS consecutive rows and walks the keys they may see in tiles of PREFILL_KV_TILE
//   tokens with an online softmax (fp32 logits, running max and sum in the log2 domain). Warp w
//   owns rows w*ROWS_PER_WARP..., lane j scores key j of the tile, so the softmax bookkeeping is
//   warp shuffles; then every thread accumulates P.V for a fixed head dimension and a few rows.
// seq_info [2] int32 (device): num_prefix (tokens cached before the new ones) and num_new (real
//   new tokens). Query token i (< num_new) sees keys 0 .. num_prefix + i. Rows of tokens at or
//   past num_new are padding of a bucket: their output is zeros (a CTA made only of them exits
//   at once; inside a mixed CTA they are scored like the last real token, then dropped).
//
// Layouts (elements): q [num_q, num_kv_heads * group_size, HEAD_DIM] (row stride q_row_stride,
// head vectors contiguous); out likewise (out_row_stride); k_cache / v_cache [num_slots,
// num_kv_heads, HEAD_DIM] (one layer's K / V plane); block_table [*] int64, the sequence's
// block ids in order. Query head h uses KV head h / group_size. Accumulation is fp32 and in a
// fixed order: results do not depend on the launch, so graph replay equals eager.
#include "common.cuh"

#ifndef PREFILL_ROWS_PER_WARP
#error "compile through orin_llm_node.kernel_sources: PREFILL_ROWS_PER_WARP"
#endif
#define ROWS_PER_WARP PREFILL_ROWS_PER_WARP
#define PREFILL_ROWS (NUM_WARPS * ROWS_PER_WARP)
#define PREFILL_KV_TILE WARP_SIZE
// Rows of one thread in the P.V phase (thread t owns head dim t % HEAD_DIM).
#define PV_ROWS (PREFILL_ROWS * HEAD_DIM / NUM_THREADS)

static_assert(NUM_THREADS % HEAD_DIM == 0, "P.V assigns whole head vectors to threads");
static_assert((PREFILL_ROWS * HEAD_DIM) % NUM_THREADS == 0, "P.V rows must split evenly");

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
paged_prefill(scalar_t* __restrict__ out, const scalar_t* __restrict__ q,
              const scalar_t* __restrict__ k_cache, const scalar_t* __restrict__ v_cache,
              const long long* __restrict__ block_table, const int* __restrict__ seq_info,
              int num_q, int num_kv_heads, int group_size, int block_size,
              long long q_row_stride, long long out_row_stride, float scale_log2) {
  // +1 column: lanes reading one dimension of 32 different keys hit 32 different banks.
  __shared__ float s_q[PREFILL_ROWS][HEAD_DIM];
  __shared__ float s_k[PREFILL_KV_TILE][HEAD_DIM + 1];
  __shared__ float s_v[PREFILL_KV_TILE][HEAD_DIM + 1];
  __shared__ float s_p[PREFILL_ROWS][PREFILL_KV_TILE];
  __shared__ float s_scale[PREFILL_ROWS];
  __shared__ float s_l[PREFILL_ROWS];

  const int kv_head = blockIdx.x;
  const int row0 = blockIdx.y * PREFILL_ROWS;
  const int num_prefix = seq_info[0];
  const int num_new = seq_info[1];
  const int num_rows = num_q * group_size;
  const int tid = threadIdx.x;
  const int warp = tid / WARP_SIZE;
  const int lane = tid % WARP_SIZE;
  const long long slot_stride = (long long)num_kv_heads * HEAD_DIM;

  // Padding-only CTA (uniform: depends on blockIdx only).
  if (row0 / group_size >= num_new) {
    for (int i = tid; i < PREFILL_ROWS * HEAD_DIM; i += NUM_THREADS) {
      const int r = row0 + i / HEAD_DIM;
      if (r < num_rows) {
        const int token = r / group_size;
        const int qh = kv_head * group_size + r % group_size;
        out[(long long)token * out_row_stride + (long long)qh * HEAD_DIM + i % HEAD_DIM] =
            from_float(0.f);
      }
    }
    return;
  }

  // Queries of this CTA's rows, pre-scaled so that exp2 of a logit difference is the softmax.
  for (int i = tid; i < PREFILL_ROWS * HEAD_DIM; i += NUM_THREADS) {
    const int lr = i / HEAD_DIM, d = i % HEAD_DIM;
    const int r = row0 + lr;
    float val = 0.f;
    if (r < num_rows) {
      const int token = r / group_size;
      const int qh = kv_head * group_size + r % group_size;
      val = to_float(q[(long long)token * q_row_stride + (long long)qh * HEAD_DIM + d]) *
            scale_log2;
    }
    s_q[lr][d] = val;
  }

  // Last key (inclusive) each of this warp's rows may see; rows past the end see key 0 only.
  int limit[ROWS_PER_WARP];
  float m[ROWS_PER_WARP], l[ROWS_PER_WARP];
#pragma unroll
  for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
    const int r = row0 + warp * ROWS_PER_WARP + rr;
    limit[rr] = r < num_rows ? num_prefix + min(r / group_size, num_new - 1) : 0;
    m[rr] = NEG_INF;
    l[rr] = 0.f;
  }
  // Keys the CTA needs: up to the last real token among its rows.
  const int last_row = min(row0 + PREFILL_ROWS, num_rows) - 1;
  const int num_keys = num_prefix + min(last_row / group_size, num_new - 1) + 1;

  float acc[PV_ROWS];
#pragma unroll
  for (int i = 0; i < PV_ROWS; ++i) acc[i] = 0.f;
  const int pv_dim = tid % HEAD_DIM;
  const int pv_row0 = tid / HEAD_DIM;  // rows pv_row0, pv_row0 + NUM_THREADS / HEAD_DIM, ...
  const long long kv_head_off = (long long)kv_head * HEAD_DIM;

  for (int kv0 = 0; kv0 < num_keys; kv0 += PREFILL_KV_TILE) {
    // K/V tile through the block table; keys past num_keys are zeros (their p is 0, and 0 * a
    // stale NaN would not be).
    for (int i = tid; i < PREFILL_KV_TILE * THREADS_PER_TOKEN; i += NUM_THREADS) {
      const int j = i / THREADS_PER_TOKEN;
      const int d0 = (i % THREADS_PER_TOKEN) * VEC;
      const int t = kv0 + j;
      float kf[VEC], vf[VEC];
      if (t < num_keys) {
        const long long slot = block_table[t / block_size] * block_size + t % block_size;
        load_vec(k_cache + slot * slot_stride + kv_head_off + d0, kf);
        load_vec(v_cache + slot * slot_stride + kv_head_off + d0, vf);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) kf[e] = vf[e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s_k[j][d0 + e] = kf[e];
        s_v[j][d0 + e] = vf[e];
      }
    }
    __syncthreads();

    // Logits of this warp's rows against key `lane`, then the online-softmax step per row.
    const int key = kv0 + lane;
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
      const int lr = warp * ROWS_PER_WARP + rr;
      float s = 0.f;
#pragma unroll 8
      for (int d = 0; d < HEAD_DIM; ++d) s += s_q[lr][d] * s_k[lane][d];
      s = key <= limit[rr] ? s : NEG_INF;
      // Key kv0 + 0 <= limit always holds on the first tile, so m is finite from then on.
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float p = key <= limit[rr] ? exp2f(s - m_new) : 0.f;
      const float sc = exp2f(m[rr] - m_new);  // 0 on the first tile (m = -inf)
      l[rr] = l[rr] * sc + group_sum<WARP_SIZE>(p);
      m[rr] = m_new;
      s_p[lr][lane] = p;
      if (lane == 0) s_scale[lr] = sc;
    }
    __syncthreads();

    // acc = acc * rescale + P.V for this thread's (row, dim) pairs.
#pragma unroll
    for (int i = 0; i < PV_ROWS; ++i) {
      const int lr = pv_row0 + i * (NUM_THREADS / HEAD_DIM);
      float a = acc[i] * s_scale[lr];
#pragma unroll 8
      for (int j = 0; j < PREFILL_KV_TILE; ++j) a += s_p[lr][j] * s_v[j][pv_dim];
      acc[i] = a;
    }
    __syncthreads();  // the next tile overwrites s_k, s_v, s_p, s_scale
  }

  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) s_l[warp * ROWS_PER_WARP + rr] = l[rr];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < PV_ROWS; ++i) {
    const int lr = pv_row0 + i * (NUM_THREADS / HEAD_DIM);
    const int r = row0 + lr;
    if (r < num_rows) {
      const int token = r / group_size;
      const int qh = kv_head * group_size + r % group_size;
      const float val = token < num_new ? acc[i] / s_l[lr] : 0.f;
      out[(long long)token * out_row_stride + (long long)qh * HEAD_DIM + pv_dim] =
          from_float(val);
    }
  }
}
