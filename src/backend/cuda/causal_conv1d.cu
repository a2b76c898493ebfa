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
// Joined (launch_causal_conv1d_silu_joined; cuda_backend.cpp joins a fused state + score pass's two
// conv segments, and the q and k l2 norms and the gates recorded right after the conv):
// conv_run_prep_kernel, the 4-token-run grid with V = 4, the x blocks of the second segment after the
// first's (its prefix is the first's state_out, which the state kernel writes before this launch); with
// norms C % 128 == 0, so each warp's 128 channels are one 128-float head of q̂ or k̂ where they lie in a
// norm's columns, and the warp normalises each of its tokens' head from registers (norms.cu's sum order
// and factor: the bits of the separate l2_norm) into the norm's out; the gates take ceil(n·Hv / (grid.x
// · 128)) extra rows of the grid, a thread per (token, head) pair, as elementwise.cu's kernel. One
// launch instead of up to four, and q̂ and k̂ are not read back. 72 registers (conv_run_prep_kernel's
// kSegs; the plain 4-wide run kernel: 64). H200, `KEV_CUDA_TRACE=ops`, per GDN layer, conv + the l2_norm x2 + gdn_gates launch →
// joined: 4B evaluation (220 question-row tokens) 16.0 + 7.9 → 17.5 us, 250-token prefill 18.1 + 8.1
// → 22.2; 0.8B evaluation 13.5 + 7.7 → 15.5, prefill 15.9 + 8.2 → 18.4; a fused pass's two segments
// and prep, 4B 17.3 + 17.3 + 10.0 → 35.1, 0.8B 14.4 + 14.4 + 10.1 → 30.7 (each traced command carries
// ~3 us of event overhead, so about half of each gain is the trace's own).
#include <climits>

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

// The joined launch (launch_causal_conv1d_silu_joined): besides the conv's segments (x blocks [0, xb0)
// run seg0, the rest seg1, whose tokens follow seg0's in x and out), the Gated DeltaNet prep
// joined in: the l2 norms of the q and k heads (norms[i] reads the joined out's columns [col0[i],
// col0[i] + 128·heads[i]) over all n_tokens rows) and the gates, whose (token, head) pairs take the
// blocks past the conv's conv_y rows of the grid.
struct ConvPrep {
  unsigned xb0 = 0, conv_y = 0;
  GdnPrepArgs p;
  int64_t col0[2] = {0, 0}, heads[2] = {0, 0};
};

// The kRun-token run `run` of V channels of one segment (conv_run_kernel, conv_run_prep_kernel). With
// kPrep (V = 4; with norms C is a multiple of 128, so a warp's 128 channels are one head when they lie
// in a norm's columns) each token's outputs are also normalised from registers, token t of the segment
// being row token_base + t of the norms: the warp's sum of squares as norms.cu's float4 row path sums a
// 128-float row (lane l: floats 4l..4l+3), the same factor, so the bits are those of the separate
// l2_norm launch.
template <int V, bool kPrep>
__device__ __forceinline__ void conv_run(const ConvArgs& a, const ConvPrep& cp, unsigned run, int64_t token_base) {
  constexpr int kRun = kRunTokens;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kRunThreads + threadIdx.x) * V;
  if (c >= a.C) return;
  const int K = static_cast<int>(a.K);
  const int64_t t0 = static_cast<int64_t>(run) * kRun;
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
  // kPrep: the norm whose columns hold this warp's head (-1: none), and the head.
  int norm = -1;
  int64_t head = 0;
  if constexpr (kPrep) {
    const int64_t c_warp = c - 4 * (threadIdx.x % 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (i < cp.p.n_norms && c_warp >= cp.col0[i] && c_warp < cp.col0[i] + 128 * cp.heads[i]) {
        norm = i;
        head = (c_warp - cp.col0[i]) / 128;
      }
    }
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
    if constexpr (kPrep) {
      const float4 o = make_float4(siluf(acc[0]), siluf(acc[1]), siluf(acc[2]), siluf(acc[3]));
      *reinterpret_cast<float4*>(a.out + t * a.out_stride + c) = o;
      if (norm >= 0) {  // warp-uniform
        const NormArgs& n = norm == 0 ? cp.p.norms[0] : cp.p.norms[1];
        float ss = 0.0f;
        ss += sum_squares(o);
        const float f = l2_factor(warp_sum(ss), n.scale, n.eps);
        float* dst = n.out + row_offset(n.out_rows, (token_base + t) * cp.heads[norm] + head) + 4 * (threadIdx.x % 32);
        *reinterpret_cast<float4*>(dst) = make_float4(o.x * f, o.y * f, o.z * f, o.w * f);
      }
    } else {
      store_silu<V>(a.out + t * a.out_stride + c, acc);
    }
  }
}

template <int V>
__global__ void __launch_bounds__(kRunThreads) conv_run_kernel(ConvArgs a) {
  conv_run<V, false>(a, ConvPrep{}, blockIdx.x, 0);
}

// kSegs: the segments (1 or 2). Each segment's code is inlined separately (a runtime-selected one
// copied its parameters to the stack); one segment keeps token_base = 0 and 72 registers without a
// bound (7 blocks of 128 threads per SM), two took 96 and are held to 72 (64 bytes spilled): in the
// traced 4B fused pass 35.1 µs a call against 36.8 at 96 (H200, 2026-12-03).
template <int kSegs>
__global__ void __launch_bounds__(kRunThreads, kSegs == 2 ? 7 : 0)
    conv_run_prep_kernel(ConvArgs seg0, ConvArgs seg1, ConvPrep cp) {
  if (blockIdx.y >= cp.conv_y) {
    const int64_t i = (static_cast<int64_t>(blockIdx.y - cp.conv_y) * gridDim.x + blockIdx.x) * kRunThreads + threadIdx.x;
    if (i < cp.p.gates.n * cp.p.gates.Hv) gdn_gate(cp.p.gates, i);
    return;
  }
  if (kSegs == 1 || blockIdx.x < cp.xb0) {
    conv_run<4, true>(seg0, cp, blockIdx.x, 0);
  } else {
    conv_run<4, true>(seg1, cp, blockIdx.x - cp.xb0, seg0.n_tokens);
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

namespace {

// float4 access: C, the row strides and the x / out base pointers allow it.
bool conv_vec4(const ConvArgs& a) {
  return a.C % 4 == 0 && (a.n_tokens == 1 || (a.x_stride % 4 == 0 && a.out_stride % 4 == 0)) && aligned16(a.x) &&
         aligned16(a.out);
}

dim3 run_grid(const ConvArgs& a, int V) {
  return dim3(static_cast<unsigned>((a.n_tokens + kRunTokens - 1) / kRunTokens),
              static_cast<unsigned>((a.C + V * kRunThreads - 1) / (V * kRunThreads)));
}

cudaError_t launch_conv_state(const ConvArgs& a, cudaStream_t stream) {
  const unsigned cblocks = static_cast<unsigned>((a.C + kThreads - 1) / kThreads);
  if (a.state_out) conv_state_kernel<<<cblocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Gate rows of the joined grid: n·Hv pairs over rows of grid_x · kRunThreads threads.
int64_t gate_rows(const GdnPrepArgs& p, unsigned grid_x) {
  const int64_t pairs = p.gates.n * p.gates.Hv, per_row = static_cast<int64_t>(grid_x) * kRunThreads;
  return (pairs + per_row - 1) / per_row;
}

}  // namespace

cudaError_t launch_causal_conv1d_silu(const ConvArgs& a, cudaStream_t stream) {
  if (a.C == 0) return cudaSuccess;
  if (a.n_tokens > 0) {
    const bool vec4 = conv_vec4(a);
    const int V = vec4 ? 4 : 1;
    if (a.K <= kMaxRunK) {
      const dim3 grid = run_grid(a, V);
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
  return launch_conv_state(a, stream);
}

bool conv_prep_fusable(const ConvJoin& cj, const GdnPrepArgs& p) {
  if (cj.n_segs < 1 || cj.n_segs > 2 || p.n_norms < 0 || p.n_norms > 2) return false;
  const ConvArgs& a = cj.seg[0];
  int64_t n = 0, xb = 0;
  for (int i = 0; i < cj.n_segs; ++i) {
    const ConvArgs& s = cj.seg[i];
    if (s.n_tokens <= 0 || s.K > kMaxRunK || !conv_vec4(s)) return false;
    n += s.n_tokens;
    xb += run_grid(s, 4).x;
  }
  if (cj.n_segs == 2) {
    // seg[1]: the rows right after seg[0]'s, from seg[0]'s final state, which is written first, so
    // seg[0] must not read it (its prefix elsewhere or none).
    const ConvArgs& b = cj.seg[1];
    const int64_t state = a.C * a.K;
    if (b.C != a.C || b.K != a.K || b.w != a.w || b.x_stride != a.x_stride || b.out_stride != a.out_stride ||
        b.x != a.x + a.n_tokens * a.x_stride || b.out != a.out + a.n_tokens * a.out_stride || !a.state_out ||
        b.prefix != a.state_out || b.state_out ||
        (a.prefix && a.prefix < a.state_out + state && a.state_out < a.prefix + state)) {
      return false;
    }
  }
  if (p.n_norms > 0 && a.C % 128 != 0) return false;
  int64_t lo[2] = {0, 0}, hi[2] = {0, 0};
  for (int i = 0; i < p.n_norms; ++i) {
    const NormArgs& m = p.norms[i];
    const Rows& x = m.x_rows;
    const Rows& o = m.out_rows;
    if (m.kind != NormKind::L2 || m.half != nullptr || m.d != 128 || x.n_outer != 2 || x.shape[0] != n ||
        x.stride[0] != a.out_stride || (x.shape[1] > 1 && x.stride[1] != 128) || m.x < a.out || o.n_outer != 2 ||
        o.shape[0] != n || o.shape[1] != x.shape[1] || !rows_vec4(o) || !aligned16(m.out)) {
      return false;
    }
    lo[i] = m.x - a.out;
    hi[i] = lo[i] + 128 * x.shape[1];
    if (lo[i] % 128 != 0 || hi[i] > a.C) return false;
  }
  if (p.n_norms == 2 && lo[0] < hi[1] && lo[1] < hi[0]) return false;  // overlapping columns
  return xb <= INT_MAX && run_grid(a, 4).y + gate_rows(p, static_cast<unsigned>(xb)) <= 65535;
}

cudaError_t launch_causal_conv1d_silu_joined(const ConvJoin& cj, const GdnPrepArgs& p, cudaStream_t stream) {
  if (!conv_prep_fusable(cj, p)) return cudaErrorInvalidValue;
  ConvPrep cp;
  cp.p = p;
  const ConvArgs& a = cj.seg[0];
  for (int i = 0; i < p.n_norms; ++i) {
    cp.col0[i] = p.norms[i].x - a.out;
    cp.heads[i] = p.norms[i].x_rows.shape[1];
  }
  cp.xb0 = run_grid(a, 4).x;
  const unsigned xb = cp.xb0 + (cj.n_segs == 2 ? run_grid(cj.seg[1], 4).x : 0);
  cp.conv_y = run_grid(a, 4).y;
  if (cj.n_segs == 2) {
    const cudaError_t err = launch_conv_state(a, stream);  // seg[1]'s prefix
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(xb, cp.conv_y + static_cast<unsigned>(gate_rows(p, xb)));
  if (cj.n_segs == 2) {
    conv_run_prep_kernel<2><<<grid, kRunThreads, 0, stream>>>(a, cj.seg[1], cp);
  } else {
    conv_run_prep_kernel<1><<<grid, kRunThreads, 0, stream>>>(a, ConvArgs{}, cp);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || cj.n_segs == 2) return err;
  return launch_conv_state(a, stream);
}

}  // namespace kev::cuda
