// Tensor-core building blocks shared by the CUDA kernels that multiply FP32 operands at FP32
// accuracy (attention, the gated delta rule): cp.async staging (also attention's FP16 tiles), the
// 3xTF32 split and the mma.sync.m16n8k8 TF32 product with its fragment loads (sm_80+).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kev::cuda {

// Asynchronous global → shared copies of N = 16 or 4 bytes; fill = false writes zeros and reads
// nothing (src must still be a valid address).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool fill) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(fill ? 16 : 0) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(fill ? 4 : 0) : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// x = hi + lo (3xTF32): hi = x rounded to TF32 (add half an ulp of the 10-bit mantissa, then drop the
// 13 low bits: round to nearest, ties away from zero), lo = x − hi (exact), truncated to TF32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

// d += a·b for one m16n8k8 tile, TF32 operands, FP32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The 3xTF32 product: a_hi·b_hi into `big`, the cross terms into `lo_hi` and `hi_lo`. The tensor
// cores' FP32 accumulation truncates; keeping the cross terms (2^-11 of the total) apart takes them
// out of the large accumulator's rounding, and callers keep each accumulator short (see kCols) and
// add them in FP32. One accumulator per term keeps consecutive mma instructions independent.
__device__ __forceinline__ void mma_3xtf32(float (&big)[4], float (&lo_hi)[4], float (&hi_lo)[4],
                                           const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                           const uint32_t (&b_hi)[2], const uint32_t (&b_lo)[2]) {
  mma_tf32(lo_hi, a_lo, b_hi);
  mma_tf32(hi_lo, a_hi, b_lo);
  mma_tf32(big, a_hi, b_hi);
}

// The A fragment (16 × 8, row-major at m with stride ld) of lane (g, t) = (lane / 4, lane % 4):
// a0 = m[g][t], a1 = m[g+8][t], a2 = m[g][t+4], a3 = m[g+8][t+4] (PTX ISA, m16n8k8 .tf32).
__device__ __forceinline__ void load_a(const float* m, int ld, int g, int t, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  split_tf32(m[g * ld + t], hi[0], lo[0]);
  split_tf32(m[(g + 8) * ld + t], hi[1], lo[1]);
  split_tf32(m[g * ld + t + 4], hi[2], lo[2]);
  split_tf32(m[(g + 8) * ld + t + 4], hi[3], lo[3]);
}

// The B fragment (8 × 8) of lane (g, t): b0 = B[t][g] at p, b1 = B[t+4][g] at p + step.
__device__ __forceinline__ void load_b(const float* p, int step, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  split_tf32(p[0], hi[0], lo[0]);
  split_tf32(p[step], hi[1], lo[1]);
}

}  // namespace kev::cuda
