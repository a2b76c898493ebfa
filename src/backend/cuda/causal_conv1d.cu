// Depthwise causal convolution over each packed sequence, then SiLU (the GDN pre-mixer).
//
//   out[t,c] = SiLU( Σ_{j<K} w[c,j] · in(τ−(K−1)+j, c) ),  τ = t − offsets[r] for t in sequence r,
//   in(i, c) = x[offsets[r]+i, c] for i >= 0; for i < 0: prefix[c, K+i] (state_in, when the pass
//   continues a prefix; column 0 is never read) or 0 (fresh pass).
//   state_out[c, j] = in(L−K+j, c), j < K, for the single sequence of length L = n_tokens.
//
// Layout: x, out [n, C] (row strides free), w / prefix / state_out [C, K] contiguous.
// Launch: conv: grid (n, ceil(C/256)), 256 threads; a thread owns (token, channel), finds its sequence by
// binary search over the device offsets (so the grid depends only on n, never on the offsets), and
// accumulates K taps in FP32. state_out: one thread per channel (ceil(C/256) blocks) walking j upwards —
// state_out may be the identical view of state_in, and column j reads column L+j > j of the same channel
// before that column is overwritten, so one thread per channel is race-free. It runs after the conv
// kernel in stream order, so the conv has read the prefix before it changes.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void conv_kernel(ConvArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= a.C) return;
  const int64_t begin = seq_start(a.offsets, a.n_seqs, t);
  const int64_t tau = t - begin;
  const float* w = a.w + c * a.K;
  float acc = 0.0f;
  for (int64_t j = 0; j < a.K; ++j) {
    const int64_t i = tau - (a.K - 1) + j;
    float in = 0.0f;
    if (i >= 0) {
      in = a.x[(begin + i) * a.x_stride + c];
    } else if (a.prefix) {
      in = a.prefix[c * a.K + a.K + i];
    }
    acc += w[j] * in;
  }
  a.out[t * a.out_stride + c] = siluf(acc);
}

__global__ void conv_state_kernel(ConvArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.C) return;
  const int64_t L = a.n_tokens;
  for (int64_t j = 0; j < a.K; ++j) {
    const int64_t i = L - a.K + j;
    float v = 0.0f;
    if (i >= 0) {
      v = a.x[i * a.x_stride + c];
    } else if (a.prefix) {
      v = a.prefix[c * a.K + a.K + i];
    }
    a.state_out[c * a.K + j] = v;
  }
}

}  // namespace

cudaError_t launch_causal_conv1d_silu(const ConvArgs& a, cudaStream_t stream) {
  if (a.C == 0) return cudaSuccess;
  const unsigned cblocks = static_cast<unsigned>((a.C + kThreads - 1) / kThreads);
  if (a.n_tokens > 0) {
    conv_kernel<<<dim3(static_cast<unsigned>(a.n_tokens), cblocks), kThreads, 0, stream>>>(a);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (a.state_out) conv_state_kernel<<<cblocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kev::cuda
