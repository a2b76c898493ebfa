// Rotary position embedding, rotate-half form, in place on the first n_rot dims of every head.
//
//   pos = pos0 + (t − offsets[r]) for token t of sequence r;  φ_i = pos · θ^(−2i/n_rot), i < n_rot/2;
//   (x_i, x_{i+n_rot/2}) ← (x_i cos φ_i − x_{i+n_rot/2} sin φ_i, x_{i+n_rot/2} cos φ_i + x_i sin φ_i).
//
// The angle and its cos/sin are computed in double, as the CPU does (device_math.cuh's rope_cos_sin).
// An rms_norm recorded right before a rope of its output runs as one launch (norms.cu's
// launch_norm_rope, the same arithmetic); this kernel serves every other rope.
// Layout: x [n, H, hd], token and head strides free, innermost contiguous; dims >= n_rot untouched.
// Launch: one thread per (token, group of kHeads = 4 heads, i < n_rot/2), i fastest (a warp's loads
// are contiguous within a head), 128 per block (grid.x = ceil(n·ceil(H/4)·n_rot/2 / 128)); the thread
// loads its pair in each of its heads before the angle (no dependence on it, and the in-place stores
// would otherwise order every head's loads after the previous head's stores), finds its sequence by
// binary search over the device offsets, computes cos/sin once for its heads and rotates them. The
// earlier thread per (token, i) walking all H heads ran as H dependent round trips on a grid of 32
// blocks for a 250-token pass (4B: 10.9 us under Nsight Compute).
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 128, kHeads = 4;

__host__ __device__ __forceinline__ int64_t head_groups(const RopeArgs& a) { return (a.H + kHeads - 1) / kHeads; }

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeArgs a) {
  const int64_t half = a.n_rot / 2, groups = head_groups(a);
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.n_tokens * groups * half) return;
  const int64_t i = idx % half, tg = idx / half, t = tg / groups, h0 = (tg % groups) * kHeads;
  float* p[kHeads];
  float x0[kHeads] = {}, x1[kHeads] = {};
#pragma unroll
  for (int u = 0; u < kHeads; ++u) {
    p[u] = a.x + t * a.stride_token + (h0 + u) * a.stride_head + i;
    if (h0 + u < a.H) x0[u] = p[u][0], x1[u] = p[u][half];
  }
  const int64_t pos = a.pos0 + (t - seq_start(a.offsets, a.n_seqs, t));
  float cs, sn;
  rope_cos_sin(pos, i, a.n_rot, a.theta, cs, sn);
#pragma unroll
  for (int u = 0; u < kHeads; ++u) {
    if (h0 + u < a.H) p[u][0] = rope_low(x0[u], x1[u], cs, sn), p[u][half] = rope_high(x0[u], x1[u], cs, sn);
  }
}

}  // namespace

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const int64_t total = a.n_tokens * head_groups(a) * (a.n_rot / 2);
  if (total == 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kev::cuda
