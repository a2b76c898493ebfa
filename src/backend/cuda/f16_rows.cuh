// The FP16 row rule of matmul's F16-weight inputs, shared by the kernels that write such a copy
// (elementwise.cu's f32_to_f16_rows_scaled, and norms.cu when a norm writes the copy for the matmul
// recorded right after it): a row of x is stored as FP16(x / s) with s a power of two, 1 unless
// max|x| lies outside [2^-10, 2^15] (then max|x| / s lies in [2^14, 2^15]); the GEMM's row is
// multiplied by s afterwards. Every writer takes the row max with fmaxf (NaN ignored, order-free) and
// rounds with these functions, so the copies are bit-identical whichever kernel wrote them.
// The producers whose GEMM row spans several warps (norms.cu's warp-per-row kernels: a token's heads;
// elementwise.cu's binary maps) write the copy optimistically instead of taking a block-wide max
// first: they store FP16(v) as if s = 1 and raise their GEMM row's slot of the scales (zeroed before)
// to their largest |value| (raise_row_max); then launch_f16_rows_fixup turns each slot into the row's
// scale and rewrites the rare rows whose max lies outside [2^-10, 2^15]. Same bits as converting after
// the max (v · 1 rounds as v does), without holding a GEMM row in one block. Only passes of
// kOptimisticMinGemmRows GEMM rows or more take it: in shorter ones the slots' memset and the fix-up
// launch cost more than a block-wide max (docs/backends.md).
// Where the op recorded right after the matmul consumes exactly its out (add_rms_norm's y, swiglu's
// gate and up), the backend drops the GEMM's rescale and that op's kernel multiplies each input row
// by s as it reads it (row_scale, rescaled below) and stores the product back where s != 1, so both
// its result and the matmul's out keep the bits of the separate rescale.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kev::cuda {

constexpr int64_t kOptimisticMinGemmRows = 1024;

__device__ __forceinline__ float abs_max(float v) { return fabsf(v); }
__device__ __forceinline__ float abs_max(const float4& v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// 1 / s for a row whose max |value| is mx. Larger rows would overflow FP16 and smaller ones would
// lose bits to its subnormals. A row holding inf keeps s = 1, so the product is inf / NaN as the
// FP32 GEMM's would be.
__device__ __forceinline__ float f16_row_inverse_scale(float mx) {
  if (isfinite(mx) && (mx > 32768.0f || (mx > 0.0f && mx < 0x1p-10f))) {
    int e = 0;
    frexpf(mx, &e);  // mx < 2^e
    return ldexpf(1.0f, 15 - e);
  }
  return 1.0f;
}

__device__ __forceinline__ void store_f16(__half* d, float v, float inv) { *d = __float2half_rn(v * inv); }
__device__ __forceinline__ void store_f16(__half* d, const float4& v, float inv) {
  const __half2 lo = __floats2half2_rn(v.x * inv, v.y * inv), hi = __floats2half2_rn(v.z * inv, v.w * inv);
  uint2 bits;
  bits.x = *reinterpret_cast<const uint32_t*>(&lo);
  bits.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(d) = bits;
}

// The scale of input row r of an op that took over a matmul's rescale (1 when none did: scales null).
__device__ __forceinline__ float row_scale(const float* scales, int64_t r) { return scales ? scales[r] : 1.0f; }

// v · s as the rescale kernel stores it. __fmul_rn is never contracted into an FMA with the consumer's
// next add, so the consumer computes with the rounded FP32 product, exactly as when it reads it back.
__device__ __forceinline__ float rescaled(float v, float s) { return __fmul_rn(v, s); }
__device__ __forceinline__ float4 rescaled(const float4& v, float s) {
  return make_float4(__fmul_rn(v.x, s), __fmul_rn(v.y, s), __fmul_rn(v.z, s), __fmul_rn(v.w, s));
}

// Max of v over the block (every thread gets it); `part` holds one float per warp (blockDim.x / 32
// <= 32). Ends with a barrier-separated read, so `part` may be reused after a further __syncthreads.
__device__ __forceinline__ float block_max(float v, float* part) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = part[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) v = fmaxf(v, part[w]);
  return v;
}

// Raises a GEMM row's max slot (scales[r] before launch_f16_rows_fixup) to mx, the largest |value| a
// thread wrote: float bits of non-negative values order as integers. NaN (and 0) leave it, as fmaxf
// from 0 ignores NaN in the block-wide rule.
__device__ __forceinline__ void raise_row_max(float* slot, float mx) {
  if (mx > 0.0f) atomicMax(reinterpret_cast<int*>(slot), __float_as_int(mx));
}

// raise_row_max for a whole warp (all 32 lanes present) whose lanes hold GEMM row grow (~0u: nothing):
// one atomic per warp when its lanes share a row (the common case), else one per lane.
__device__ __forceinline__ void raise_row_max_warp(float* scales, uint32_t grow, float mx) {
  const uint32_t first = __shfl_sync(0xffffffffu, grow, 0);
  if (__all_sync(0xffffffffu, grow == first || grow == ~0u)) {
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0 && first != ~0u) raise_row_max(scales + first, mx);
  } else if (grow != ~0u) {
    raise_row_max(scales + grow, mx);
  }
}

}  // namespace kev::cuda
