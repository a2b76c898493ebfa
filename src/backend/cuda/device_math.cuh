// Helpers shared by the CUDA backend's kernels: overflow-free activations (the same forms as the
// CPU's vec.h), warp sums, strided row addressing, sequence lookup in a packed layout, bit-exact BF16
// conversion (round to nearest even, NaN kept quiet — as common/bf16.h), the GDN gates of one (token,
// head), an l2 norm's sum and factor, and the launchers' host-side alignment checks.
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

// gdn_gates of (token, head) pair i of the [n, Hv] space (elementwise.cu's kernel and norms.cu's fused
// GDN prep launch, which must give the same bits).
__device__ __forceinline__ void gdn_gate(const GatesArgs& a, int64_t i) {
  const int64_t t = i / a.Hv, h = i % a.Hv;
  const float bv = a.b[t * a.b_stride + h];
  const float av = a.a[t * a.a_stride + h];
  a.beta[t * a.beta_stride + h] = sigmoidf_stable(bv);
  a.g[t * a.g_stride + h] = -expf(a.a_log[h]) * softplusf(av + a.dt_bias[h]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// An l2 norm's pieces (norms.cu, and the conv with a Gated DeltaNet layer's prep joined in, in
// causal_conv1d.cu, which must keep norms.cu's bits): a float4's squares summed in lane order, and the
// row's factor scale / sqrt(Σx² + eps) from the warp's sum.
__device__ __forceinline__ float sum_squares(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float l2_factor(float ss, float scale, float eps) { return scale / sqrtf(ss + eps); }

// Host side, for the launchers' vector-path choice: 16-byte alignment of a base pointer, and row
// strides that keep every row of a view float4-aligned.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline bool rows_vec4(const Rows& r) {
  for (int i = 0; i < r.n_outer; ++i) {
    if (r.shape[i] > 1 && r.stride[i] % 4 != 0) return false;
  }
  return true;
}

// Index math in 32 bits: the backend refuses views with 2^31 or more rows (check_rows), and a 64-bit
// division costs ~70 instructions, which dominated the short-row element-wise kernels.
__device__ __forceinline__ int64_t row_offset(const Rows& r, int64_t row64) {
  uint32_t row = static_cast<uint32_t>(row64);
  int64_t off = 0;
  // Unrolled over the fixed three slots so the struct is indexed statically (a dynamic index would
  // copy the kernel parameter to local memory).
#pragma unroll
  for (int i = 2; i >= 0; --i) {
    if (i < r.n_outer) {
      const uint32_t n = static_cast<uint32_t>(r.shape[i]), q = row / n;
      off += static_cast<int64_t>(row - q * n) * r.stride[i];
      row = q;
    }
  }
  return off;
}

// Index r of the sequence holding token t: offsets[r] <= t < offsets[r + 1] (empty sequences skipped).
__device__ __forceinline__ int seq_index(const int32_t* offsets, int n_seqs, int64_t t) {
  int lo = 0, hi = n_seqs;  // invariant: offsets[lo] <= t < offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Start of the sequence holding token t.
__device__ __forceinline__ int32_t seq_start(const int32_t* offsets, int n_seqs, int64_t t) {
  return offsets[seq_index(offsets, n_seqs, t)];
}

// RoPE (rope.cu, and the rms_norm + rope launch in norms.cu, which must keep rope.cu's bits): the cos and
// sin of φ_i = pos · θ^(−2i/n_rot), computed in double (positions reach 10^5, where an FP32 angle is off
// by ~10^-2 rad), and the rotation of the pair (x0, x1) = (x_i, x_{i+n_rot/2}) by φ_i.
__device__ __forceinline__ void rope_cos_sin(int64_t pos, int64_t i, int64_t n_rot, double theta, float& cs,
                                             float& sn) {
  const double phi = static_cast<double>(pos) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
  double s, c;
  sincos(phi, &s, &c);
  cs = static_cast<float>(c);
  sn = static_cast<float>(s);
}
__device__ __forceinline__ float rope_low(float x0, float x1, float cs, float sn) { return x0 * cs - x1 * sn; }
__device__ __forceinline__ float rope_high(float x0, float x1, float cs, float sn) { return x1 * cs + x0 * sn; }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace kev::cuda
