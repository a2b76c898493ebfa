// Rotary position embedding, rotate-half form, in place on the first n_rot dims of every head.
//
//   pos = pos0 + (t − offsets[r]) for token t of sequence r;  φ_i = pos · θ^(−2i/n_rot), i < n_rot/2;
//   (x_i, x_{i+n_rot/2}) ← (x_i cos φ_i − x_{i+n_rot/2} sin φ_i, x_{i+n_rot/2} cos φ_i + x_i sin φ_i).
//
// The angle and its cos/sin are computed in double, as the CPU does: positions reach 10^5 and an FP32
// angle of that size has an absolute error near 10^-2 rad.
// Layout: x [n, H, hd], token and head strides free, innermost contiguous; dims >= n_rot untouched.
// Launch: one thread per (token, i < n_rot/2), 256 per block (grid.x = ceil(n·n_rot/2 / 256)); the
// thread finds its sequence by binary search over the device offsets, computes cos/sin once and
// rotates that pair in all H heads.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(RopeArgs a) {
  const int64_t half = a.n_rot / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.n_tokens * half) return;
  const int64_t t = idx / half, i = idx % half;
  const int64_t pos = a.pos0 + (t - seq_start(a.offsets, a.n_seqs, t));
  const double phi =
      static_cast<double>(pos) * pow(a.theta, -2.0 * static_cast<double>(i) / static_cast<double>(a.n_rot));
  double s, c;
  sincos(phi, &s, &c);
  const float cs = static_cast<float>(c), sn = static_cast<float>(s);
  for (int64_t h = 0; h < a.H; ++h) {
    float* p = a.x + t * a.stride_token + h * a.stride_head;
    const float x0 = p[i], x1 = p[i + half];
    p[i] = x0 * cs - x1 * sn;
    p[i + half] = x1 * cs + x0 * sn;
  }
}

}  // namespace

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const int64_t total = a.n_tokens * (a.n_rot / 2);
  if (total == 0 || a.H == 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kev::cuda
