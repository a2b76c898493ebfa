// Gated delta rule for short sequences (GdnArgs::short_seqs: every sequence at most one chunk of 64
// tokens; Kev's question rows, and a state of up to 64 tokens): the token recurrence itself, with the
// state in registers. The math, layout and gate / q-scaling conventions are gated_delta_rule.cu's:
// per token, with α_t = e^{g_t},
//   S̄ = α_t S;  S = S̄ + k_t (β_t (v_t − S̄ᵀk_t))ᵀ;  o_t = Sᵀq_t.
// Why here and not the chunked form: a one-chunk sequence gains nothing from the chunk's parallel
// products, which become one long chain of small dependent steps (products, T_b, the substitution's
// bands, Q̃, then Q̃ S₀; gated_delta_rule_rows.cu, ~30 µs on the H200 however few rows there are),
// while the recurrence walks a row's ~40 tokens in short steps of independent FMAs over a state that
// never leaves the registers. It costs three FMAs per state element and token on the CUDA cores, where
// the chunked form's bulk ([Q;K]·S₀, two per element and token) runs on tensor cores, so it loses once
// its grid exceeds about two blocks per SM (short_pass, below).
//
// Scaled state. The block keeps S = σ S̃ with a scalar σ (the product of the α_t since the last fold),
// so that a token costs three FMAs per state element (its two reductions and the rank-1 update) and no
// separate decay multiply:
//   σ' = σ α_t;  u = v_t − σ' S̃ᵀk_t;  S̃ += k_t (β_t u / σ')ᵀ;  o_t = σ' S̃ᵀq_t (the updated S̃).
// When σ' falls below 2⁻³² it is folded into S̃ (S̃ ← σ' S̃, σ' = 1; α_t = 0 folds to exactly zero) before
// the update, so S̃'s entries stay within 2³² of S's. o_t's reduction runs one token late, together with
// token t + 1's S̃ᵀk (both read the same S̃): four sums a step and no extra pass for k_t·q_t.
//
// Launch: grid (n_seqs, Hv, ceil(dv / 64)), 128 threads; block (r, h, z) runs sequence r, value head h
// (key head h / (Hv / Hk)), state columns 64z.. . Lane 4c + p of warp w holds columns j = 64z + 16w + 2c
// and j + 1 of the rows i = 16m + 4p + e (m < dk / 16, e < 4): dk / 2 floats, and the float4 reads of a
// k or q row by the 8 lanes of a quarter-warp hit 16 distinct banks (or share an address). A sum over i
// is the lane's partial sum (two FMA chains per sum, even and odd e, added before the shuffles), then
// two xor shuffles over p. The sequence's k and q rows (up to 64 tokens) are staged in shared memory
// by cp.async in two groups, tokens 0–7 and the rest, so the walk starts when the first eight have
// arrived; q is stored one row down (row 0 zero, so the first step's late o-sum is an empty one). The
// loop has no barrier: shared memory is read-only once staged. v is read from global memory one token
// ahead; out is written by lanes p = 0, 1 (one column each).
// Shared memory: (129 · dk + 128) floats, 64.5 KiB at dk = 128; three blocks per SM (148 registers at
// dk = 128, no spill). The grid depends on n_seqs, Hv and dv only.
//
// state_out (only with one sequence; may be state_in itself: each lane reads its state elements before
// the walk and writes the same ones after it) gets σ S̃. An empty sequence writes nothing to out and
// copies its initial state to state_out.
//
// Dtypes: FP32 throughout. Global accesses are 16-byte (k, q), 8-byte (v, state) when vectorizable(a)
// and state_out is 16-byte aligned, scalar otherwise.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gdn_common.cuh"

namespace kev::cuda::gdn {

namespace {

constexpr int kShortThreads = 128;
constexpr int kShortCols = 64;  // state columns per block: 4 warps × 8 lane quads × 2
constexpr int kQuad = 4;        // lanes sharing a column pair, each with dk / 4 of its rows
constexpr int kPair = 2;        // columns per lane
constexpr int kFirstTokens = 8;  // tokens in the first cp.async group
constexpr float kFoldBelow = 0x1p-32f;  // σ is folded into S̃ below this

template <int DK>
struct GdnShortLayout {
  static constexpr int kK = 0;                          // [kChunk, DK] k rows
  static constexpr int kQ = kK + kChunk * DK;           // [kChunk + 1, DK] q rows, one down
  static constexpr int kAlpha = kQ + (kChunk + 1) * DK;  // α_t
  static constexpr int kBeta = kAlpha + kChunk;
  static constexpr size_t kBytes = static_cast<size_t>(kBeta + kChunk) * sizeof(float);
};

// Tokens [first, last) of the sequence's k and q rows (key head at q/k + kh·DK) into shared memory;
// q goes one row down.
template <int DK>
__device__ __forceinline__ void stage_rows(const GdnArgs& a, int64_t row0, int first, int last, bool vec,
                                           float* Ks, float* Qs, int tid) {
  if (vec) {
    constexpr int kPerRow = DK / 4;
    for (int idx = first * kPerRow + tid; idx < last * kPerRow; idx += kShortThreads) {
      const int t = idx / kPerRow, j = 4 * (idx % kPerRow);
      const int64_t src = row0 + t * a.qk_token_stride + j;
      cp_async<16>(Ks + t * DK + j, a.k + src, true);
      cp_async<16>(Qs + (t + 1) * DK + j, a.q + src, true);
    }
  } else {
    for (int idx = first * DK + tid; idx < last * DK; idx += kShortThreads) {
      const int t = idx / DK, j = idx % DK;
      const int64_t src = row0 + t * a.qk_token_stride + j;
      cp_async<4>(Ks + t * DK + j, a.k + src, true);
      cp_async<4>(Qs + (t + 1) * DK + j, a.q + src, true);
    }
  }
}

// Columns j, j + 1 of a row of a [.., dv] matrix starting at p (zero past dv).
__device__ __forceinline__ void load_pair(const float* p, int j, int dv, bool vec, float (&x)[kPair]) {
  if (vec && j < dv) {
    const float2 f = *reinterpret_cast<const float2*>(p + j);
    x[0] = f.x, x[1] = f.y;
    return;
  }
#pragma unroll
  for (int c = 0; c < kPair; ++c) x[c] = j + c < dv ? p[j + c] : 0.0f;
}

// The sum over a lane quad (lanes 4c .. 4c + 3) of x, in each of them.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The quad sums of a lane's partial o-sums over its rows: the one of column j + p (lanes p < kPair
// write it), 0 in the other lanes.
__device__ __forceinline__ float own_column_sum(const float (&aq)[kPair], int p) {
  float mine = 0.0f;
#pragma unroll
  for (int c = 0; c < kPair; ++c) {
    const float sum = quad_sum(aq[c]);
    if (p == c) mine = sum;
  }
  return mine;
}

// State column slices of 64 (grid z).
inline int short_slices(const GdnArgs& a) { return (a.dv + kShortCols - 1) / kShortCols; }

template <int DK>
__global__ void __launch_bounds__(kShortThreads, 3) gdn_short_kernel(GdnArgs a, bool vec) {
  using Lay = GdnShortLayout<DK>;
  constexpr int G = kQuad, C = kPair, M = DK / (4 * G);
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem + Lay::kK;
  float* Qs = smem + Lay::kQ;
  float* alpha = smem + Lay::kAlpha;
  float* beta = smem + Lay::kBeta;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, p = lane % G;
  const int r = blockIdx.x, h = blockIdx.y, kh = h / (a.Hv / a.Hk);
  const int j = kShortCols * blockIdx.z + 16 * warp + C * (lane / G);
  const int t0 = a.offsets[r], cn = a.offsets[r + 1] - t0;
  const int64_t row0 = static_cast<int64_t>(t0) * a.qk_token_stride + static_cast<int64_t>(kh) * DK;

  stage_rows<DK>(a, row0, 0, min(cn, kFirstTokens), vec, Ks, Qs, tid);
  cp_async_commit();
  stage_rows<DK>(a, row0, min(cn, kFirstTokens), cn, vec, Ks, Qs, tid);
  cp_async_commit();
  if (tid < DK) Qs[tid] = 0.0f;
  if (tid < cn) {
    const int64_t gi = static_cast<int64_t>(t0 + tid) * a.gate_token_stride + h;
    alpha[tid] = expf(a.g[gi]);
    beta[tid] = a.beta[gi];
  }
  // The lane's state elements: s[m][e][c] = S̃[4G·m + 4p + e][j + c].
  float s[M][4][C];
  const float* s0 = a.state_in != nullptr ? a.state_in + static_cast<int64_t>(h) * DK * a.dv : nullptr;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (s0 != nullptr) {
        load_pair(s0 + static_cast<int64_t>(4 * G * m + 4 * p + e) * a.dv, j, a.dv, vec, s[m][e]);
      } else {
#pragma unroll
        for (int c = 0; c < C; ++c) s[m][e][c] = 0.0f;
      }
    }
  }
  const float* vrow = a.v + static_cast<int64_t>(t0) * a.v_token_stride + static_cast<int64_t>(h) * a.dv;
  float* orow = a.out + static_cast<int64_t>(t0) * a.out_token_stride + static_cast<int64_t>(h) * a.dv + j + p;
  const bool writer = p < C && j + p < a.dv;
  float vnext[C] = {};
  if (cn > 0) load_pair(vrow, j, a.dv, vec, vnext);
  float sigma = 1.0f;
  cp_async_wait<1>();  // the first group
  __syncthreads();

  for (int t = 0; t < cn; ++t) {
    if (t == kFirstTokens) {
      cp_async_wait_all();
      __syncthreads();
    }
    float vt[C];
#pragma unroll
    for (int c = 0; c < C; ++c) vt[c] = vnext[c];
    if (t + 1 < cn) load_pair(vrow + static_cast<int64_t>(t + 1) * a.v_token_stride, j, a.dv, vec, vnext);
    const float* kt = Ks + t * DK + 4 * p;
    const float* qt = Qs + t * DK + 4 * p;  // q_{t−1}
    // Each of the four sums in two halves (even and odd e), so a chain is dk / 8 FMAs long, not dk / 4.
    float4 k4[M];
    float akh[2][C] = {}, aqh[2][C] = {};
#pragma unroll
    for (int m = 0; m < M; ++m) {
      k4[m] = ld4(kt + 4 * G * m);
      const float4 q4 = ld4(qt + 4 * G * m);
      const float kv[4] = {k4[m].x, k4[m].y, k4[m].z, k4[m].w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          akh[e % 2][c] = fmaf(s[m][e][c], kv[e], akh[e % 2][c]);
          aqh[e % 2][c] = fmaf(s[m][e][c], qv[e], aqh[e % 2][c]);
        }
      }
    }
    float ak[C], aq[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      ak[c] = quad_sum(akh[0][c] + akh[1][c]);
      aq[c] = aqh[0][c] + aqh[1][c];
    }
    const float mine = own_column_sum(aq, p);
    if (t > 0 && writer) orow[static_cast<int64_t>(t - 1) * a.out_token_stride] = sigma * mine;
    float s1 = sigma * alpha[t];
    const float b = beta[t];
    float w[C];
#pragma unroll
    for (int c = 0; c < C; ++c) w[c] = b * (vt[c] - s1 * ak[c]);
    if (s1 < kFoldBelow) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#pragma unroll
          for (int c = 0; c < C; ++c) s[m][e][c] *= s1;
        }
      }
      s1 = 1.0f;
    }
    sigma = s1;
    const float inv = __frcp_rn(s1);
#pragma unroll
    for (int c = 0; c < C; ++c) w[c] *= inv;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float kv[4] = {k4[m].x, k4[m].y, k4[m].z, k4[m].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int c = 0; c < C; ++c) s[m][e][c] = fmaf(kv[e], w[c], s[m][e][c]);
      }
    }
  }
  if (cn > 0) {  // the last token's o
    const float* qt = Qs + cn * DK + 4 * p;
    float aq[C] = {};
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 q4 = ld4(qt + 4 * G * m);
      const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int c = 0; c < C; ++c) aq[c] = fmaf(s[m][e][c], qv[e], aq[c]);
      }
    }
    const float mine = own_column_sum(aq, p);
    if (writer) orow[static_cast<int64_t>(cn - 1) * a.out_token_stride] = sigma * mine;
  }
  if (a.state_out != nullptr) {
    float* so = a.state_out + static_cast<int64_t>(h) * DK * a.dv;
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float* row = so + static_cast<int64_t>(4 * G * m + 4 * p + e) * a.dv;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (j + c < a.dv) row[j + c] = sigma * s[m][e][c];
        }
      }
    }
  }
}

template <int DK>
cudaError_t launch_short_dk(const GdnArgs& a, cudaStream_t stream) {
  constexpr size_t bytes = GdnShortLayout<DK>::kBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(gdn_short_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>(a.Hv),
                  static_cast<unsigned>(short_slices(a)));
  const bool vec = vectorizable(a) && (a.state_out == nullptr || aligned16(a.state_out));
  gdn_short_kernel<DK><<<grid, kShortThreads, bytes, stream>>>(a, vec);
  return cudaGetLastError();
}

}  // namespace

// The token recurrence takes every short pass with state_out (one sequence: Hv · ceil(dv / 64) blocks)
// and question rows whose grid fits two blocks per SM; more rows take the rows kernels. H200,
// `DISABLED_Perf.GatedDeltaRuleCuda*` (2026-12-03, µs a call, the rows kernels or, at up to one wave of
// their recurrence, the products kernel and the chunked recurrence → this kernel): 0.8B 6 × 37 rows
// (192 blocks) 30.5 → 26.0, 4B 4 × 37 (256) 29.8 → 26.2, 4B 1 × 37 with state_out (64) 21.0 → 19.4,
// 0.8B 2 × 37 (64) 17.6 → 18.9 (the one loss: a lone block per SM is latency-bound); 4B 6 × 37
// (384 blocks, three per SM) 31.4 → 32.3, which keeps the rows kernels. With the split sums
// (2026-12-03, seventeenth session, same binary, one chain → two, two rounds): 0.8B 6 × 37 25.1 / 26.1
// → 24.5 / 24.5, 4B 4 × 37 25.3 / 26.1 → 24.5 / 24.5, 0.8B 2 × 37 18.0 / 18.9 → 17.3 / 17.3, 4B 1 × 37
// 19.0 / 19.9 → 18.3 / 18.3; 4B 6 × 37 through this kernel 31.2 / 31.7 against the rows kernels' 30.8 /
// 31.8 (and 4B cached evaluation 6.28 / 6.27 / 6.03 against 6.21 / 6.21 / 6.20 ms), so the rule stays.
// Eight lanes per column pair (256-thread blocks, dk / 8 rows a lane, a third shuffle) was slower at
// every shape (0.8B 2 × 37 20.5, 6 × 37 29.6; 4B 4 × 37 29.5 µs). Four columns a lane over groups of
// eight lanes (dk / 8 rows each: a row's k and q read by 16 lane groups a block instead of 32, then a
// reduce-scatter of the 8 sums over three shuffles and the update weights broadcast by four; 114
// registers) was no faster (2026-12-07, H100, two rounds against this kernel in one run, µs: 0.8B
// 6 × 37 25.3 / 24.2 → 25.9 / 25.7, 4B 4 × 37 25.5 / 24.4 → 26.0 / 25.9, 0.8B 2 × 37 18.0 / 18.2 →
// 18.5 / 18.4, 4B 1 × 37 19.2 / 19.4 → 19.8 / 19.8; 4B 6 × 37 through it 33.2 / 33.1 against the rows
// kernels' 32.6 / 30.9), so halving the shared-memory reads is not what this kernel waits on. Depends
// on shapes, n_seqs and the SM count only (CUDA graph replay).
bool short_pass(const GdnArgs& a) {
  if (!a.short_seqs) return false;
  if (a.state_out != nullptr) return true;
  const int64_t blocks = static_cast<int64_t>(a.n_seqs) * a.Hv * short_slices(a);
  return blocks <= 2 * static_cast<int64_t>(device_traits().sms);
}

cudaError_t launch_short(const GdnArgs& a, cudaStream_t stream) {
  switch (a.dk) {
    case 32:
      return launch_short_dk<32>(a, stream);
    case 64:
      return launch_short_dk<64>(a, stream);
    default:
      return launch_short_dk<128>(a, stream);
  }
}

}  // namespace kev::cuda::gdn
