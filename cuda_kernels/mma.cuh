// Copyright 2026 orin_llm_node developers
// SPDX-License-Identifier: Apache-2.0
//
// One warp-wide tensor-core multiply-accumulate: mma.sync.aligned.m16n8k16 (sm_80 and later:
// Orin is sm_87; nothing Hopper-only), fp16 or bf16 inputs, fp32 accumulators.
//
//   acc (16 x 8, fp32) += A (16 x 16, row-major) * B (16 x 8, column-major)
//
// Every lane of the warp must call it with its own fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"); with g = lane / 4 and t = lane % 4, and each 32-bit
// register holding two elements, the lower column (A) or row (B) index in the low 16 bits:
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   acc[0..1] = C[g][2t, 2t+1] acc[2..3] = C[g+8][2t, 2t+1]
// Host builds (test/kernel_emulator.py, no GPU) call the emulator's warp-collective
// emu_mma_m16n8k16 instead, which implements exactly these layouts: a kernel that loads its
// fragments any other way computes wrong results there as it would on a GPU.
#pragma once

#if !defined(KV_DTYPE_ID) || KV_DTYPE_ID == 2
#error "mma.cuh: tensor-core fragments are fp16 or bf16 (KV_DTYPE_ID 0 or 1)"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.cuh: mma.sync.aligned.m16n8k16 with fp32 accumulators needs sm_80 or later"
#endif

__device__ __forceinline__ void mma_m16n8k16(float (&acc)[4], const unsigned int (&a)[4],
                                             const unsigned int (&b)[2]) {
#ifdef __CUDA_ARCH__
#if KV_DTYPE_ID == 0
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
#else
  emu_mma_m16n8k16(acc, a, b);
#endif
}

// Two values rounded to scalar_t and packed as one fragment register (first in the low half).
__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
  return (unsigned int)from_float(lo) | ((unsigned int)from_float(hi) << 16);
}
