// Depthwise causal convolution over each packed sequence, then SiLU (the GDN pre-mixer).
//
//   out[t,c] = SiLU( Σ_{j<K} w[c,j] · in(τ−(K−1)+j, c) ),  τ = t − offsets[r] for t in sequence r,
//   in(i, c) = x[offsets[r]+i, c] for i >= 0; for i < 0: prefix[c, K+i] (state_in, when the pass
//   continues a prefix; column 0 is never read) or 0 (fresh pass).
//   state_out[c, j] = in(L−K+j, c), j < K, for the single sequence of length L = n_tokens.
//
// Layout: x, out [n, C] (row strides free), w / prefix / state_out [C, K] contiguous.
// Launch, K <= 4: conv_run_kernel<V, R>, grid (ceil(n / R), ceil(C / (V·128))), 128 threads; a thread
// owns V consecutive channels (V = 4, float4 loads and stores, when C, the row strides and the x / out
// base pointers allow; else V = 1) and a run of R tokens, loads the run's inputs and the 3 rows before
// it into registers in one unrolled burst (rows of another sequence are loaded but never used), finds
// the run's first sequence by binary search and steps to the next one at each boundary inside the run.
// R = 4 (7 input rows per run, each row fetched 7/4 times, mostly from L2): a few hundred tokens still
// give ~1,000 blocks (4B, 250 tokens: 63 x 16), 64 registers (8 blocks of 128 threads per SM) with
// 7 independent float4 loads per thread in flight. Measured on the H200 (4B, C = 8192): 2,187 tokens
// 108 us with 16-token runs against 165 with a thread per (token, 4 channels); 220 question-row tokens
// 26 us per (token, 4 channels) thread (each input row loaded K times, the weights once per token)
// against 31.5 with 16-token runs (224 blocks: too few threads). 16-token runs (120 registers: 4
// blocks per SM, each thread's 19 loads, then its 16 outputs) then lost to 4-token runs on long passes
// too (2026-12-02, `CudaGdnOps.DISABLED_Timing`, 2,187 tokens from zero with state_out, x a view of the
// in_proj output): 0.8B 75.9 / 75.1 -> 60.4 us, 4B 94.6 / 93.3 -> 75.9 us; 8-token runs (90 registers)
// timed the same as 4 (60.2 / 78.7; channel-major block order 58.9 / 76.8), and 16-token runs with the
// next 4 or 8 rows' loads issued before each group's outputs (a compiler fence between) 71-74 / 88-92.
// K > 4: conv_kernel, grid (n, ceil(C / (V·256))), 256 threads, a thread per token and V channels,
// finding its sequence by binary search. All accumulate the K taps in FP32 in tap order, so a token's
// result does not depend on the kernel or run length; the grids depend only on n and C, never on the
// offsets.
// state_out: one thread per channel (ceil(C/256) blocks) loading its K values (4 at a time) before
// storing them — state_out may be the identical view of state_in, and column j reads column L+j >= j of
// the same channel, which no earlier store of that thread has written, so it is race-free (the loads
// first: one memory round trip instead of K dependent ones, which aliasing forced on the compiler). It
// runs after the conv kernel in stream order, so the conv has read the prefix before it changes.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;

// V consecutive channels as one access: float4 when V = 4.
template <int V>
struct Lanes {
  float v[V];
};

template <int V>
__device__ __forceinline__ Lanes<V> load_lanes(const float* p) {
  Lanes<V> r;
  if constexpr (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}

template <int V>
__device__ __forceinline__ void store_silu(float* o, const float (&acc)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(o) = make_float4(siluf(acc[0]), siluf(acc[1]), siluf(acc[2]), siluf(acc[3]));
  } else {
    *o = siluf(acc[0]);
  }
}

template <int V>
__global__ void conv_kernel(ConvArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (c >= a.C) return;
  const int64_t begin = seq_start(a.offsets, a.n_seqs, t);
  const int64_t tau = t - begin;
  float acc[V] = {};
  for (int64_t j = 0; j < a.K; ++j) {
    const int64_t i = tau - (a.K - 1) + j;  // position in the sequence; < 0 reads the prefix
    Lanes<V> in{};
    if (i >= 0) {
      in = load_lanes<V>(a.x + (begin + i) * a.x_stride + c);
    } else if (a.prefix) {
#pragma unroll
      for (int l = 0; l < V; ++l) in.v[l] = a.prefix[(c + l) * a.K + a.K + i];
    }
#pragma unroll
    for (int l = 0; l < V; ++l) acc[l] += a.w[(c + l) * a.K + j] * in.v[l];
  }
  store_silu<V>(a.out + t * a.out_stride + c, acc);
}

// A thread walks kRun consecutive tokens of V channels with the run's inputs (and the K − 1 rows
// before it) in registers, so each input row is fetched once per run instead of K times.
constexpr int kRunThreads = 128, kMaxRunK = 4, kRunTokens = 4;

template <int V>
__global__ void __launch_bounds__(kRunThreads) conv_run_kernel(ConvArgs a) {
  constexpr int kRun = kRunTokens;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kRunThreads + threadIdx.x) * V;
  if (c >= a.C) return;
  const int K = static_cast<int>(a.K);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRun;
  // in[u] holds input row t0 − (kMaxRunK − 1) + u; rows outside [0, n) are zero (never used).
  Lanes<V> in[kRun + kMaxRunK - 1];
#pragma unroll
  for (int u = 0; u < kRun + kMaxRunK - 1; ++u) {
    const int64_t t = t0 - (kMaxRunK - 1) + u;
    if (t >= 0 && t < a.n_tokens) {
      in[u] = load_lanes<V>(a.x + t * a.x_stride + c);
    } else {
#pragma unroll
      for (int l = 0; l < V; ++l) in[u].v[l] = 0.0f;
    }
  }
  // Taps right-aligned in kMaxRunK slots (slot s = tap s − (kMaxRunK − K); leading slots zero) so that
  // every in[] index below is a compile-time constant and in[] stays in registers.
  const int lead = kMaxRunK - K;
  float w[V][kMaxRunK];
#pragma unroll
  for (int l = 0; l < V; ++l) {
#pragma unroll
    for (int s = 0; s < kMaxRunK; ++s) w[l][s] = s >= lead ? a.w[(c + l) * K + s - lead] : 0.0f;
  }
  int r = seq_index(a.offsets, a.n_seqs, t0);
  int64_t begin = a.offsets[r];
#pragma unroll
  for (int u = 0; u < kRun; ++u) {
    const int64_t t = t0 + u;
    if (t >= a.n_tokens) break;
    while (a.offsets[r + 1] <= t) begin = a.offsets[++r];  // a boundary inside the run (empty sequences skipped)
    float acc[V] = {};
#pragma unroll
    for (int s = 0; s < kMaxRunK; ++s) {
      if (s >= lead) {
        const int64_t i = t - begin - (kMaxRunK - 1) + s;  // position in the sequence; < 0 reads the prefix
#pragma unroll
        for (int l = 0; l < V; ++l) {
          float x = 0.0f;
          if (i >= 0) {
            x = in[u + s].v[l];  // token t − (kMaxRunK − 1) + s
          } else if (a.prefix) {
            x = a.prefix[(c + l) * K + K + i];
          }
          acc[l] += w[l][s] * x;
        }
      }
    }
    store_silu<V>(a.out + t * a.out_stride + c, acc);
  }
}

__global__ void conv_state_kernel(ConvArgs a) {
  constexpr int kBurst = 4;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.C) return;
  const int64_t L = a.n_tokens;
  for (int64_t j0 = 0; j0 < a.K; j0 += kBurst) {
    float v[kBurst];
#pragma unroll
    for (int u = 0; u < kBurst; ++u) {
      const int64_t j = j0 + u, i = L - a.K + j;
      v[u] = 0.0f;
      if (j >= a.K) continue;
      if (i >= 0) {
        v[u] = a.x[i * a.x_stride + c];
      } else if (a.prefix) {
        v[u] = a.prefix[c * a.K + a.K + i];
      }
    }
#pragma unroll
    for (int u = 0; u < kBurst; ++u) {
      if (j0 + u < a.K) a.state_out[c * a.K + j0 + u] = v[u];
    }
  }
}

}  // namespace

cudaError_t launch_causal_conv1d_silu(const ConvArgs& a, cudaStream_t stream) {
  if (a.C == 0) return cudaSuccess;
  if (a.n_tokens > 0) {
    const bool vec4 = a.C % 4 == 0 && (a.n_tokens == 1 || (a.x_stride % 4 == 0 && a.out_stride % 4 == 0)) &&
                      aligned16(a.x) && aligned16(a.out);
    const int V = vec4 ? 4 : 1;
    if (a.K <= kMaxRunK) {
      const dim3 grid(static_cast<unsigned>((a.n_tokens + kRunTokens - 1) / kRunTokens),
                      static_cast<unsigned>((a.C + V * kRunThreads - 1) / (V * kRunThreads)));
      if (vec4) {
        conv_run_kernel<4><<<grid, kRunThreads, 0, stream>>>(a);
      } else {
        conv_run_kernel<1><<<grid, kRunThreads, 0, stream>>>(a);
      }
    } else {
      const dim3 grid(static_cast<unsigned>(a.n_tokens),
                      static_cast<unsigned>((a.C + V * kThreads - 1) / (V * kThreads)));
      if (vec4) {
        conv_kernel<4><<<grid, kThreads, 0, stream>>>(a);
      } else {
        conv_kernel<1><<<grid, kThreads, 0, stream>>>(a);
      }
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const unsigned cblocks = static_cast<unsigned>((a.C + kThreads - 1) / kThreads);
  if (a.state_out) conv_state_kernel<<<cblocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kev::cuda
