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
// Two bodies behind one C signature, chosen by the element type:
// * fp16 / bf16: tensor cores (mma.sync m16n8k16 through mma.cuh, fp32 accumulators), flash-
//   attention-2 style. Each warp owns 16 query rows, its Q fragments and its O accumulators in
//   registers for the whole walk; the CTA reads a tile of PREFILL_TC_KV_TILE keys through the
//   block table into shared memory once for all its warps. The softmax weights P are rounded
//   to the element type to multiply V on the tensor cores (as flash attention does).
// * fp32: CUDA cores (tensor cores would need TF32, which rounds the inputs and changes
//   results). Warp w owns rows w*ROWS_PER_WARP..., lane j scores key j of a 32-key tile, so
//   the softmax bookkeeping is warp shuffles; then every thread accumulates P.V for a fixed
//   head dimension and a few rows.
// Both keep an online softmax (fp32 logits, running max and sum in the log2 domain).
//
// grid: (ceil(num_q * group_size / rows per CTA), num_kv_heads), block: (NUM_THREADS). The
//   query rows of one KV head are (token, head-in-group) pairs, token-major, so the query
//   heads of a KV head share each K/V tile; row tiles are on gridDim.x (up to 2^31 - 1: a
//   262k-token prefill at GQA 4 has more than gridDim.y's 65,535 tiles) and are handed out
//   last tile first: the tiles that walk the most keys start first, the short ones fill in.
// seq_info [2] int32 (device): num_prefix (tokens cached before the new ones) and num_new (real
//   new tokens). Query token i (< num_new) sees keys 0 .. num_prefix + i. Rows of tokens at or
//   past num_new are padding of a bucket: their output is zeros (a CTA made only of them exits
//   at once; inside a mixed CTA they are scored too, then dropped).
//
// Layouts (elements): q [num_q, num_kv_heads * group_size, HEAD_DIM] (row stride q_row_stride,
// head vectors contiguous); out likewise (out_row_stride); k_cache / v_cache [num_slots,
// num_kv_heads, HEAD_DIM] (one layer's K / V plane); block_table [*] int64, the sequence's
// block ids in order. Query head h uses KV head h / group_size. Accumulation is fp32 and in a
// fixed order: results do not depend on the launch, so graph replay equals eager.
#include "common.cuh"

#if !defined(PREFILL_ROWS_PER_WARP) || !defined(PREFILL_TC_ROWS) || !defined(PREFILL_TC_KV_TILE)
#error "compile through orin_llm_node.kernel_sources: PREFILL_ROWS_PER_WARP, PREFILL_TC_ROWS, PREFILL_TC_KV_TILE"
#endif

// Zeros for the rows row0 .. row0 + rows - 1 (those below num_rows) of a CTA made only of
// padding tokens.
__device__ __forceinline__ void zero_rows(scalar_t* __restrict__ out, int row0, int rows,
                                          int num_rows, int group_size, int kv_head,
                                          long long out_row_stride) {
  for (int i = threadIdx.x; i < rows * HEAD_DIM; i += NUM_THREADS) {
    const int r = row0 + i / HEAD_DIM;
    if (r < num_rows) {
      const int token = r / group_size;
      const int qh = kv_head * group_size + r % group_size;
      out[(long long)token * out_row_stride + (long long)qh * HEAD_DIM + i % HEAD_DIM] =
          from_float(0.f);
    }
  }
}

#if KV_DTYPE_ID == 2  // fp32: CUDA cores

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

  const int kv_head = blockIdx.y;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * PREFILL_ROWS;
  const int num_prefix = seq_info[0];
  const int num_new = seq_info[1];
  const int num_rows = num_q * group_size;
  const int tid = threadIdx.x;
  const int warp = tid / WARP_SIZE;
  const int lane = tid % WARP_SIZE;
  const long long slot_stride = (long long)num_kv_heads * HEAD_DIM;

  // Padding-only CTA (uniform: depends on blockIdx only).
  if (row0 / group_size >= num_new) {
    zero_rows(out, row0, PREFILL_ROWS, num_rows, group_size, kv_head, out_row_stride);
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

#else  // fp16 / bf16: tensor cores

#include "mma.cuh"

#define TC_WARP_ROWS 16  // one m16 tile of query rows per warp
// Row strides of the shared tiles in elements: 16 bytes of padding put the 32-bit fragment
// loads of a warp (8 rows x 4 consecutive words) into 32 different banks.
#define K_STRIDE (HEAD_DIM + 8)
#define VT_STRIDE (PREFILL_TC_KV_TILE + 8)
#define K_STEPS (HEAD_DIM / 16)            // k-steps of Q.K^T over the head dimension
#define S_TILES (PREFILL_TC_KV_TILE / 8)   // n-tiles of S (8 keys each)
#define P_STEPS (PREFILL_TC_KV_TILE / 16)  // k-steps of P.V over the keys of a tile
#define O_TILES (HEAD_DIM / 8)             // n-tiles of O (8 head dimensions each)

static_assert(PREFILL_TC_ROWS == NUM_WARPS * TC_WARP_ROWS, "kernel_sources: 16 rows per warp");
static_assert(HEAD_DIM % 16 == 0 && PREFILL_TC_KV_TILE % 16 == 0, "whole mma k-steps");
static_assert((K_STRIDE * 2) % 16 == 0, "16-byte stores into the K tile");

// Two consecutive elements (the lower index in the low half) as one fragment register.
__device__ __forceinline__ unsigned int ld_pair(const scalar_t* p) {
  return *reinterpret_cast<const unsigned int*>(p);
}

// Maximum over the 4 lanes that hold one row of an mma accumulator (lanes 4g .. 4g+3).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS)
paged_prefill(scalar_t* __restrict__ out, const scalar_t* __restrict__ q,
              const scalar_t* __restrict__ k_cache, const scalar_t* __restrict__ v_cache,
              const long long* __restrict__ block_table, const int* __restrict__ seq_info,
              int num_q, int num_kv_heads, int group_size, int block_size,
              long long q_row_stride, long long out_row_stride, float scale_log2) {
  // K tile key-major (B of Q.K^T: a key's dimension pair is one word); V tile transposed,
  // dimension-major (B of P.V: a dimension's key pair is one word).
  __shared__ __align__(16) scalar_t s_k[PREFILL_TC_KV_TILE * K_STRIDE];
  __shared__ __align__(16) scalar_t s_vt[HEAD_DIM * VT_STRIDE];

  const int kv_head = blockIdx.y;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * PREFILL_TC_ROWS;
  const int num_prefix = seq_info[0];
  const int num_new = seq_info[1];
  const int num_rows = num_q * group_size;
  const int tid = threadIdx.x;
  const int warp = tid / WARP_SIZE;
  const int g = (tid % WARP_SIZE) / 4;  // fragment row group
  const int t = tid % 4;                // thread in the group
  const long long slot_stride = (long long)num_kv_heads * HEAD_DIM;
  const long long kv_head_off = (long long)kv_head * HEAD_DIM;

  if (row0 / group_size >= num_new) {  // padding-only CTA (uniform)
    zero_rows(out, row0, PREFILL_TC_ROWS, num_rows, group_size, kv_head, out_row_stride);
    return;
  }

  // This lane's two rows, g and g + 8 of its warp's 16 (h = 0, 1), and the last key each may
  // see. Padding rows (and rows past num_rows) get zero queries and see the prefix, so their
  // softmax stays finite; they are dropped at the end.
  const int warp_row0 = row0 + warp * TC_WARP_ROWS;
  long long q_off[2];
  int limit[2];
  bool real[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp_row0 + g + 8 * h;
    const int token = r / group_size;
    real[h] = r < num_rows && token < num_new;
    limit[h] = real[h] ? num_prefix + token : num_prefix;
    q_off[h] = (long long)token * q_row_stride +
               (long long)(kv_head * group_size + r % group_size) * HEAD_DIM;
  }
  // Keys the CTA needs (up to its last real token) and the last key any real row of this
  // warp sees (-1: none of its rows is real); tiles past it are loaded for the other warps
  // but not scored.
  const int last_row = min(row0 + PREFILL_TC_ROWS, num_rows) - 1;
  const int num_keys = num_prefix + min(last_row / group_size, num_new - 1) + 1;
  const int warp_last_row = min(warp_row0 + TC_WARP_ROWS, num_rows) - 1;
  const int warp_last_key = warp_row0 < num_rows && warp_row0 / group_size < num_new
                                ? num_prefix + min(warp_last_row / group_size, num_new - 1)
                                : -1;

  // Q fragments for the whole walk (A of Q.K^T): a[h + 2 * half] = Q[row h][16kk + 2t + 8half].
  unsigned int qf[K_STEPS][4];
#pragma unroll
  for (int kk = 0; kk < K_STEPS; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i % 2, col = 16 * kk + 2 * t + 8 * (i / 2);
      qf[kk][i] = real[h] ? ld_pair(q + q_off[h] + col) : 0u;
    }
  }

  float o[O_TILES][4];
#pragma unroll
  for (int n = 0; n < O_TILES; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {NEG_INF, NEG_INF};
  float l[2] = {0.f, 0.f};  // this lane's share of each row's sum (its 2 of every 8 keys)

  for (int kv0 = 0; kv0 < num_keys; kv0 += PREFILL_TC_KV_TILE) {
    // The K/V tile through the block table, 16 bytes per access; consecutive threads take
    // consecutive keys, so the transposed V stores of a warp fall into different banks. Keys
    // past num_keys are zeros (their p is 0, and 0 * a stale NaN would not be).
    for (int i = tid; i < PREFILL_TC_KV_TILE * (HEAD_DIM / VEC); i += NUM_THREADS) {
      const int j = i % PREFILL_TC_KV_TILE;
      const int d0 = i / PREFILL_TC_KV_TILE * VEC;
      const int key = kv0 + j;
      uint4 kw = {0u, 0u, 0u, 0u}, vw = {0u, 0u, 0u, 0u};
      if (key < num_keys) {
        const long long slot = block_table[key / block_size] * block_size + key % block_size;
        const long long off = slot * slot_stride + kv_head_off + d0;
        kw = *reinterpret_cast<const uint4*>(k_cache + off);
        vw = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      *reinterpret_cast<uint4*>(s_k + j * K_STRIDE + d0) = kw;
      const unsigned int w[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s_vt[(d0 + 2 * e) * VT_STRIDE + j] = (scalar_t)(w[e] & 0xffffu);
        s_vt[(d0 + 2 * e + 1) * VT_STRIDE + j] = (scalar_t)(w[e] >> 16);
      }
    }
    __syncthreads();

    if (kv0 <= warp_last_key) {  // uniform within the warp
      // S = Q.K^T for 16 rows x PREFILL_TC_KV_TILE keys: s[n] holds keys kv0 + 8n + 2t, +1
      // of rows g (s[n][0..1]) and g + 8 (s[n][2..3]).
      float s[S_TILES][4];
#pragma unroll
      for (int n = 0; n < S_TILES; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < K_STEPS; ++kk) {
#pragma unroll
        for (int n = 0; n < S_TILES; ++n) {
          const scalar_t* kp = s_k + (8 * n + g) * K_STRIDE + 16 * kk + 2 * t;
          const unsigned int b[2] = {ld_pair(kp), ld_pair(kp + 8)};
          mma_m16n8k16(s[n], qf[kk], b);
        }
      }
      // Online softmax in the log2 domain. Key 0 is visible to every row and the first tile
      // is scored by every warp with rows, so m is finite from then on.
      float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int n = 0; n < S_TILES; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kv0 + 8 * n + 2 * t + e % 2;
          s[n][e] = key <= limit[e / 2] ? s[n][e] * scale_log2 : NEG_INF;
          mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
        }
      }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], quad_max(mx[h]));
        corr[h] = exp2f(m[h] - m_new);  // 0 on the first tile (m = -inf)
        m[h] = m_new;
        l[h] *= corr[h];
      }
#pragma unroll
      for (int n = 0; n < S_TILES; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = exp2f(s[n][e] - m[e / 2]);  // masked: exp2(-inf) = 0
          l[e / 2] += s[n][e];
        }
      }
#pragma unroll
      for (int n = 0; n < O_TILES; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= corr[e / 2];
      }
      // O += P.V: the accumulator layout of S is the A layout of P (keys 16kk .. 16kk + 15
      // are S tiles 2kk and 2kk + 1).
#pragma unroll
      for (int kk = 0; kk < P_STEPS; ++kk) {
        const unsigned int a[4] = {pack2(s[2 * kk][0], s[2 * kk][1]),
                                   pack2(s[2 * kk][2], s[2 * kk][3]),
                                   pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < O_TILES; ++n) {
          const scalar_t* vp = s_vt + (8 * n + g) * VT_STRIDE + 16 * kk + 2 * t;
          const unsigned int b[2] = {ld_pair(vp), ld_pair(vp + 8)};
          mma_m16n8k16(o[n], a, b);
        }
      }
    }
    __syncthreads();  // the next tile overwrites s_k and s_vt
  }

  // Normalise and store: o[n][2h], o[n][2h + 1] are dimensions 8n + 2t, +1 of row h.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = group_sum<4>(l[h]);  // every lane of the warp takes part
    const int r = warp_row0 + g + 8 * h;
    if (r < num_rows) {
      scalar_t* dst = out + (long long)(r / group_size) * out_row_stride +
                      (long long)(kv_head * group_size + r % group_size) * HEAD_DIM + 2 * t;
#pragma unroll
      for (int n = 0; n < O_TILES; ++n) {
        *reinterpret_cast<unsigned int*>(dst + 8 * n) =
            real[h] ? pack2(o[n][2 * h] / sum, o[n][2 * h + 1] / sum) : 0u;
      }
    }
  }
}
#endif
