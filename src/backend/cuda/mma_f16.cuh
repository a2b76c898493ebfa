// FP16 tensor-core building blocks (sm_80+): ldmatrix fragment loads from shared memory and the
// mma.sync.m16n8k16 FP16 product with FP32 accumulation (attention's 16-bit path).
// Fragments (PTX ISA, m16n8k16 .f16; lane = 4g + t): A (16 × 16, row-major) in four registers of two
// halves, {A[g][2t..2t+1]}, {A[g+8][2t..]}, {A[g][2t+8..]}, {A[g+8][2t+8..]}; B (16 × 8) in two,
// {B[2t..2t+1][g]}, {B[2t+8..2t+9][g]}; C/D (16 × 8, FP32) c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][..].
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kev::cuda {

// Four 8 × 8 matrices of 16-bit elements: lane i gives the shared address of row i % 8 of matrix i / 8
// (16 contiguous bytes); register j receives matrix j, lane (g, t) holding row g, elements 2t, 2t + 1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// As ldmatrix_x4, each matrix transposed: lane (g, t) receives elements (2t, g) and (2t + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// d += a·b for one m16n8k16 tile, FP16 operands, FP32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to FP16 (nearest even), x in the low half: one register of an A fragment.
__device__ __forceinline__ uint32_t pack_f16x2(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The two FP16 values of a packed register, widened (exactly) and summed.
__device__ __forceinline__ float sum_f16x2(uint32_t bits) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
  return f.x + f.y;
}

}  // namespace kev::cuda
