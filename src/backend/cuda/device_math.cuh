// Device helpers shared by the CUDA backend's kernels: overflow-free activations (the same forms as
// the CPU's vec.h), warp sums, strided row addressing, sequence lookup in a packed layout, and
// bit-exact BF16 conversion (round to nearest even, NaN kept quiet — as common/bf16.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kev::cuda {

__device__ __forceinline__ float sigmoidf_stable(float u) {
  if (u >= 0.0f) return 1.0f / (1.0f + expf(-u));
  const float e = expf(u);
  return e / (1.0f + e);
}

__device__ __forceinline__ float siluf(float u) { return u * sigmoidf_stable(u); }

__device__ __forceinline__ float softplusf(float u) { return fmaxf(u, 0.0f) + log1pf(expf(-fabsf(u))); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int64_t row_offset(const Rows& r, int64_t row) {
  int64_t off = 0;
  for (int i = r.n_outer - 1; i >= 0; --i) {
    const int64_t idx = row % r.shape[i];
    row /= r.shape[i];
    off += idx * r.stride[i];
  }
  return off;
}

// Start of the sequence holding token t: the largest offsets[r] <= t with offsets[r+1] > t.
__device__ __forceinline__ int32_t seq_start(const int32_t* offsets, int n_seqs, int64_t t) {
  int lo = 0, hi = n_seqs;  // invariant: offsets[lo] <= t < offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return offsets[lo];
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace kev::cuda
