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
// R = 16 for passes of 1,024 tokens or more (each input row fetched 19/16 times, not K times), else
// R = 4: the grid of a few hundred tokens then still has ~1,000 blocks (4B, 250 tokens: 63 x 16) with
// 7 independent float4 loads per thread in flight. Measured on the H200 (4B, C = 8192): 2,187 tokens
// 108 us with 16-token runs against 165 with a thread per (token, 4 channels); 220 question-row tokens
// 26 us per (token, 4 channels) thread (each input row loaded K times, the weights once per token)
// against 31.5 with 16-token runs (224 blocks: too few threads). K > 4: conv_kernel, grid (n, ceil(C / (V·256))),
// 256 threads, a thread per token and V channels, finding its sequence by binary search. All accumulate
// the K taps in FP32 in tap order, so a token's result does not depend on the kernel or run length; the
// grids depend only on n and C, never on the offsets.
// state_out: one thread per channel (ceil(C/256) blocks) loading its K values (4 at a time) before
// storing them — state_out may be the identical view of state_in, and column j reads column L+j >= j of
// the same channel, which no earlier store of that thread has written, so it is race-free (the loads
// first: one memory round trip instead of K dependent ones, which aliasing forced on the compiler). It
// runs after the conv kernel in stream order, so the conv has read the prefix before it changes.
//
// Fused GDN prep (launch_conv_gdn_prep; the backend joins a Gated DeltaNet layer's conv, its q and k l2
// norms and its gates, recorded back to back, into one command — see kernels.h for the conditions):
//   q[t, h] = q̂[t, h] / sqrt(Σ q̂[t, h]² + eps) · scale over the 128 channels of head h (k likewise),
//   q̂ / k̂ heads of out; beta, g = gdn_gates(b, α) (device_math.cuh's gdn_gate).
// One launch of the run kernel, V = 4, with the same grid columns (runs) and, in front of the conv's
// rows, rows of 128-thread blocks for the small ops: one thread per (token, head) gate pair, then (with
// state_out) one thread per channel running the state_out code above — the fused launch takes only a
// state_out that does not overlap the prefix, which other blocks read meanwhile. With dk = 128 a warp's
// 32 lanes x 4 channels are exactly one q or k head when the norm's heads start at a multiple of 128
// channels, so after its run's tokens the warp normalises each token's head from the SiLU outputs it
// still holds: the lane's squares summed in order from 0, warp_sum, l2_factor, scaled (device_math.cuh)
// — norms.cu's float4 row arithmetic for a one-chunk row, so q and k have the bits of the separate
// launches, as do out, state_out, beta and g. The 4-token kernel is held to 64 registers (see
// run_min_blocks).
#include <climits>
#include <type_traits>

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

// Stores SiLU(acc) and returns it.
template <int V>
__device__ __forceinline__ Lanes<V> store_silu(float* o, const float (&acc)[V]) {
  Lanes<V> r;
#pragma unroll
  for (int l = 0; l < V; ++l) r.v[l] = siluf(acc[l]);
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(o) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
    *o = r.v[0];
  }
  return r;
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
constexpr int kRunThreads = 128, kMaxRunK = 4, kLongRun = 16, kShortRun = 4;
constexpr int64_t kLongRunMinTokens = 1024;
// The fused GDN prep's head: one warp's 32 lanes x 4 channels.
constexpr int64_t kHead = 32 * 4;

// state_out[c, j] = in(L − K + j, c) for channel c (K values loaded, 4 at a time, before any is stored;
// see the header on aliasing).
__device__ __forceinline__ void conv_state(const ConvArgs& a, int64_t c) {
  constexpr int kBurst = 4;
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

__global__ void conv_state_kernel(ConvArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < a.C) conv_state(a, c);
}

// The run kernel's second parameter when it runs the conv alone.
struct NoPrep {};

// The l2 norm of one token's head, its 128 values in the warp's registers (lane l: values 4l..4l+3),
// into out (the lane's 4 values of the head's output row): norms.cu's float4 row arithmetic for a
// one-chunk row (the lane's partial sum starts at 0, the warp's sum, the factor, the scaled values), so
// the same bits.
__device__ __forceinline__ void l2_head(const Lanes<4>& o, float scale, float eps, float* out) {
  const float4 v = make_float4(o.v[0], o.v[1], o.v[2], o.v[3]);
  float ss = 0.0f;
  ss += sum_squares(v);
  const float f = l2_factor(warp_sum(ss), scale, eps);
  *reinterpret_cast<float4*>(out) = scaled(v, f);
}

// Blocks per SM the run kernel is compiled for. The fused 4-token kernel left alone took 81 registers,
// 6 blocks of 128 threads per SM: 792 on 132 SMs, fewer than the short passes' 660–1,008 conv blocks need
// for one wave; held to 8 (64 registers, as the conv alone takes) it spills 16 bytes. 0: no bound (a
// bound of 1 changes ptxas's choices for the conv alone).
template <class Prep>
constexpr int run_min_blocks(int run) {
  return std::is_same_v<Prep, GdnPrepArgs> && run == kShortRun ? 8 : 0;
}

// Prep: NoPrep (the conv alone) or GdnPrepArgs (launch_conv_gdn_prep: the conv, a = args.conv, with its
// layer's q / k l2 norms, its gates and state_out in the same launch; V = 4). With a GdnPrepArgs the
// first extra_rows rows of the grid are 128-thread blocks of the small ops (block e = y · gridDim.x + x:
// the gate blocks, then state_out's), the conv's rows follow. The conv's operands are a parameter of
// their own: read through args.conv they are addressed through a pointer to the parameter space, which
// took 86 registers against 64.
template <int V, int kRun, class Prep = NoPrep>
__global__ void __launch_bounds__(kRunThreads, run_min_blocks<Prep>(kRun))
    conv_run_kernel(ConvArgs a, Prep args, unsigned extra_rows) {
  constexpr bool kPrep = std::is_same_v<Prep, GdnPrepArgs>;
  if constexpr (kPrep) {
    if (blockIdx.y < extra_rows) {
      const int64_t gate_blocks = (args.gates.n * args.gates.Hv + kRunThreads - 1) / kRunThreads;
      const int64_t e = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
      if (e < gate_blocks) {
        const int64_t i = e * kRunThreads + threadIdx.x;
        if (i < args.gates.n * args.gates.Hv) gdn_gate(args.gates, i);
      } else if (a.state_out) {
        const int64_t c = (e - gate_blocks) * kRunThreads + threadIdx.x;
        if (c < a.C) conv_state(a, c);
      }
      return;
    }
  }
  const unsigned row = kPrep ? blockIdx.y - extra_rows : blockIdx.y;
  const int64_t c = (static_cast<int64_t>(row) * kRunThreads + threadIdx.x) * V;
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
  [[maybe_unused]] Lanes<V> outs[kRun];  // kPrep: the run's outputs, for the norms after the conv
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
    const Lanes<V> o = store_silu<V>(a.out + t * a.out_stride + c, acc);
    if constexpr (kPrep) outs[u] = o;
  }
  if constexpr (kPrep) {
    // The l2 norms, after the conv (the run's inputs no longer live: 64 registers instead of 89 with the
    // norm inside the token loop). The host checked that every norm's heads start at a multiple of 128
    // channels, so this warp's 128 channels are one head of a norm or none.
    const int lane = threadIdx.x % 32;
    const int64_t cw = c - 4 * lane;
    float* out = nullptr;
    int64_t stride = 0;
    float scale = 0.0f, eps = 0.0f;
    // Each operand by a static index: a dynamic one would copy the kernel parameter to local memory.
    auto take = [&](const NormArgs& n) {
      const int64_t first = n.x - a.out, h = (cw - first) / kHead;
      if (cw < first || h >= n.x_rows.shape[1]) return false;
      out = n.out + h * n.out_rows.stride[1] + 4 * lane;
      stride = n.out_rows.stride[0];
      scale = n.scale;
      eps = n.eps;
      return true;
    };
    if (args.n_norms > 0 && !take(args.norms[0]) && args.n_norms > 1) take(args.norms[1]);
    if (out) {
#pragma unroll
      for (int u = 0; u < kRun; ++u) {
        if (t0 + u < a.n_tokens) l2_head(outs[u], scale, eps, out + (t0 + u) * stride);
      }
    }
  }
}

// The launch shape's choices, shared by the conv alone and the fused GDN prep launch.
bool conv_vec4(const ConvArgs& a) {
  return a.C % 4 == 0 && (a.n_tokens == 1 || (a.x_stride % 4 == 0 && a.out_stride % 4 == 0)) && aligned16(a.x) &&
         aligned16(a.out);
}

int conv_run_length(const ConvArgs& a) { return a.n_tokens >= kLongRunMinTokens ? kLongRun : kShortRun; }

// The fused launch's grid: `runs` runs of `run` tokens by the small ops' rows (gate blocks, then
// state_out's) and the conv's rows of 512 channels.
struct PrepGrid {
  int run;
  int64_t runs, extra_rows, conv_rows;
};

PrepGrid prep_grid(const GdnPrepArgs& p) {
  const ConvArgs& c = p.conv;
  PrepGrid g;
  g.run = conv_run_length(c);
  g.runs = (c.n_tokens + g.run - 1) / g.run;
  g.conv_rows = (c.C + 4 * kRunThreads - 1) / (4 * kRunThreads);
  const int64_t extra = (p.gates.n * p.gates.Hv + kRunThreads - 1) / kRunThreads +
                        (c.state_out ? (c.C + kRunThreads - 1) / kRunThreads : 0);
  g.extra_rows = (extra + g.runs - 1) / g.runs;
  return g;
}

// Whether the norm's x is exactly heads of the conv's output, whole warps of the run kernel's float4
// blocks, and its out rows [n_tokens, H] float4-aligned (see conv_gdn_prep_fusable).
bool norm_on_conv_heads(const NormArgs& n, const ConvArgs& c) {
  const Rows& x = n.x_rows;
  if (n.kind != NormKind::L2 || n.half != nullptr || n.d != kHead || x.n_outer != 2 || x.shape[0] != c.n_tokens ||
      x.shape[2] != 1 || (x.shape[0] > 1 && x.stride[0] != c.out_stride) || (x.shape[1] > 1 && x.stride[1] != kHead)) {
    return false;
  }
  const uintptr_t xa = reinterpret_cast<uintptr_t>(n.x), oa = reinterpret_cast<uintptr_t>(c.out);
  if (xa < oa || (xa - oa) % (kHead * sizeof(float)) != 0) return false;
  const uint64_t ch = (xa - oa) / sizeof(float);
  const Rows& o = n.out_rows;
  return ch + static_cast<uint64_t>(x.shape[1] * kHead) <= static_cast<uint64_t>(c.C) && o.n_outer == 2 &&
         o.shape[0] == x.shape[0] && o.shape[1] == x.shape[1] && o.shape[2] == 1 && aligned16(n.out) &&
         rows_vec4(o);
}

// Whether the [C, K] arrays at p and q overlap.
bool overlap(const float* p, const float* q, int64_t floats) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  const uintptr_t bytes = static_cast<uintptr_t>(floats) * sizeof(float);
  return a < b + bytes && b < a + bytes;
}

}  // namespace

bool conv_gdn_prep_fusable(const GdnPrepArgs& p) {
  const ConvArgs& c = p.conv;
  if (!p.with_conv || c.n_tokens <= 0 || c.C <= 0 || c.K > kMaxRunK || !conv_vec4(c)) return false;
  if (p.n_norms < 0 || p.n_norms > 2) return false;
  for (int i = 0; i < p.n_norms; ++i) {
    if (!norm_on_conv_heads(p.norms[i], c)) return false;
  }
  // Two norms on the same heads would both claim a warp.
  if (p.n_norms == 2) {
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(p.norms[0].x), a1 = reinterpret_cast<uintptr_t>(p.norms[1].x);
    const uintptr_t b0 = a0 + p.norms[0].x_rows.shape[1] * kHead * sizeof(float);
    const uintptr_t b1 = a1 + p.norms[1].x_rows.shape[1] * kHead * sizeof(float);
    if (a0 < b1 && a1 < b0) return false;
  }
  if (c.state_out && c.prefix && overlap(c.state_out, c.prefix, c.C * c.K)) return false;
  const PrepGrid g = prep_grid(p);
  return g.runs <= INT_MAX && g.extra_rows + g.conv_rows <= 65535;
}

cudaError_t launch_conv_gdn_prep(const GdnPrepArgs& p, cudaStream_t stream) {
  if (!conv_gdn_prep_fusable(p)) return cudaErrorInvalidValue;
  const PrepGrid g = prep_grid(p);
  const dim3 grid(static_cast<unsigned>(g.runs), static_cast<unsigned>(g.extra_rows + g.conv_rows));
  const unsigned extra = static_cast<unsigned>(g.extra_rows);
  if (g.run == kLongRun) {
    conv_run_kernel<4, kLongRun><<<grid, kRunThreads, 0, stream>>>(p.conv, p, extra);
  } else {
    conv_run_kernel<4, kShortRun><<<grid, kRunThreads, 0, stream>>>(p.conv, p, extra);
  }
  return cudaGetLastError();
}

cudaError_t launch_causal_conv1d_silu(const ConvArgs& a, cudaStream_t stream) {
  if (a.C == 0) return cudaSuccess;
  if (a.n_tokens > 0) {
    const bool vec4 = conv_vec4(a);
    const int V = vec4 ? 4 : 1;
    if (a.K <= kMaxRunK) {
      const int run = conv_run_length(a);
      const dim3 grid(static_cast<unsigned>((a.n_tokens + run - 1) / run),
                      static_cast<unsigned>((a.C + V * kRunThreads - 1) / (V * kRunThreads)));
      if (run == kLongRun) {
        if (vec4) {
          conv_run_kernel<4, kLongRun><<<grid, kRunThreads, 0, stream>>>(a, NoPrep{}, 0);
        } else {
          conv_run_kernel<1, kLongRun><<<grid, kRunThreads, 0, stream>>>(a, NoPrep{}, 0);
        }
      } else if (vec4) {
        conv_run_kernel<4, kShortRun><<<grid, kRunThreads, 0, stream>>>(a, NoPrep{}, 0);
      } else {
        conv_run_kernel<1, kShortRun><<<grid, kRunThreads, 0, stream>>>(a, NoPrep{}, 0);
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
