// Gated delta rule for short sequences (GdnArgs::short_seqs: every sequence at most one chunk of 64
// tokens; Kev's question rows, and a state of up to 64 tokens): the token recurrence itself, with the
// state in registers. The math, layout and gate / q-scaling conventions are gated_delta_rule.cu's:
// per token, with α_t = e^{g_t},
//   S̄ = α_t S;  S = S̄ + k_t (β_t (v_t − S̄ᵀk_t))ᵀ;  o_t = Sᵀq_t.
// Why not the chunked form here: a question row's chunk is one long chain of small dependent steps
// (products, T_b, the substitution's bands, Q̃, then Q̃ S₀; gated_delta_rule_rows.cu), ~30 µs on the
// H200 however few rows there are, while a row's 37 tokens cost the recurrence 37 short steps of
// independent FMAs over a state that never leaves the registers.
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
// is the lane's partial sum, then two xor shuffles over p. The sequence's k and q rows (up to 64
// tokens) are staged in shared memory by cp.async in two groups, tokens 0–7 and the rest, so the walk
// starts when the first eight have arrived; q is stored one row down (row 0 zero, so the first step's
// late o-sum is an empty one). The loop has no barrier: shared memory is read-only once staged. v is
// read from global memory one token ahead; out is written by lanes p = 0, 1 (one column each).
// Shared memory: (129 · dk + 128) floats, 64.5 KiB at dk = 128: three blocks per SM (the 4B's six
// rows: 384 blocks, one wave on the H200's 132 SMs). The grid depends on n_seqs, Hv and dv only.
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
constexpr int kShortCols = 64;    // state columns per block: 4 warps × 8 lane quads × 2
constexpr int kFirstTokens = 8;   // tokens in the first cp.async group
constexpr float kFoldBelow = 0x1p-32f;

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

// Columns j, j + 1 of row `row` of a [.., dv] matrix with row start p (zero past dv).
__device__ __forceinline__ float2 load_pair(const float* p, int j, int dv, bool vec) {
  if (vec) return j < dv ? *reinterpret_cast<const float2*>(p + j) : make_float2(0.0f, 0.0f);
  return make_float2(j < dv ? p[j] : 0.0f, j + 1 < dv ? p[j + 1] : 0.0f);
}

__device__ __forceinline__ void store_pair(float* p, int j, int dv, bool vec, float x, float y) {
  if (vec) {
    if (j < dv) *reinterpret_cast<float2*>(p + j) = make_float2(x, y);
  } else {
    if (j < dv) p[j] = x;
    if (j + 1 < dv) p[j + 1] = y;
  }
}

// The sum over p (lanes 4c .. 4c + 3) of x, in every one of those lanes.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int DK>
__global__ void __launch_bounds__(kShortThreads) gdn_short_kernel(GdnArgs a, bool vec) {
  using Lay = GdnShortLayout<DK>;
  constexpr int M = DK / 16;
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem + Lay::kK;
  float* Qs = smem + Lay::kQ;
  float* alpha = smem + Lay::kAlpha;
  float* beta = smem + Lay::kBeta;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, p = lane & 3;
  const int r = blockIdx.x, h = blockIdx.y, kh = h / (a.Hv / a.Hk);
  const int j = kShortCols * blockIdx.z + 16 * warp + 2 * (lane >> 2);
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
  // The lane's state elements: s[m][e] = S̃[16m + 4p + e][j, j + 1].
  float2 s[M][4];
  const float* s0 = a.state_in != nullptr ? a.state_in + static_cast<int64_t>(h) * DK * a.dv : nullptr;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[m][e] = s0 != nullptr ? load_pair(s0 + static_cast<int64_t>(16 * m + 4 * p + e) * a.dv, j, a.dv, vec)
                              : make_float2(0.0f, 0.0f);
    }
  }
  const float* vrow = a.v + static_cast<int64_t>(t0) * a.v_token_stride + static_cast<int64_t>(h) * a.dv;
  float* orow = a.out + static_cast<int64_t>(t0) * a.out_token_stride + static_cast<int64_t>(h) * a.dv;
  float2 vnext = cn > 0 ? load_pair(vrow, j, a.dv, vec) : make_float2(0.0f, 0.0f);
  float sigma = 1.0f;
  asm volatile("cp.async.wait_group 1;" ::: "memory");
  __syncthreads();

  for (int t = 0; t < cn; ++t) {
    if (t == kFirstTokens) {
      cp_async_wait_all();
      __syncthreads();
    }
    const float2 vt = vnext;
    if (t + 1 < cn) vnext = load_pair(vrow + static_cast<int64_t>(t + 1) * a.v_token_stride, j, a.dv, vec);
    const float* kt = Ks + t * DK + 4 * p;
    const float* qt = Qs + t * DK + 4 * p;  // q_{t−1}
    float4 k4[M];
    float ak0 = 0.0f, ak1 = 0.0f, aq0 = 0.0f, aq1 = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      k4[m] = ld4(kt + 16 * m);
      const float4 q4 = ld4(qt + 16 * m);
      const float kv[4] = {k4[m].x, k4[m].y, k4[m].z, k4[m].w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        ak0 = fmaf(s[m][e].x, kv[e], ak0);
        ak1 = fmaf(s[m][e].y, kv[e], ak1);
        aq0 = fmaf(s[m][e].x, qv[e], aq0);
        aq1 = fmaf(s[m][e].y, qv[e], aq1);
      }
    }
    ak0 = quad_sum(ak0);
    ak1 = quad_sum(ak1);
    aq0 = quad_sum(aq0);
    aq1 = quad_sum(aq1);
    if (t > 0 && p < 2 && j + p < a.dv) orow[static_cast<int64_t>(t - 1) * a.out_token_stride + j + p] = sigma * (p == 0 ? aq0 : aq1);
    float s1 = sigma * alpha[t];
    const float b = beta[t];
    float w0 = b * (vt.x - s1 * ak0), w1 = b * (vt.y - s1 * ak1);
    if (s1 < kFoldBelow) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[m][e].x *= s1;
          s[m][e].y *= s1;
        }
      }
      s1 = 1.0f;
    }
    sigma = s1;
    const float inv = 1.0f / s1;
    w0 *= inv;
    w1 *= inv;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float kv[4] = {k4[m].x, k4[m].y, k4[m].z, k4[m].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[m][e].x = fmaf(kv[e], w0, s[m][e].x);
        s[m][e].y = fmaf(kv[e], w1, s[m][e].y);
      }
    }
  }
  if (cn > 0) {  // the last token's o
    const float* qt = Qs + cn * DK + 4 * p;
    float aq0 = 0.0f, aq1 = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 q4 = ld4(qt + 16 * m);
      const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        aq0 = fmaf(s[m][e].x, qv[e], aq0);
        aq1 = fmaf(s[m][e].y, qv[e], aq1);
      }
    }
    aq0 = quad_sum(aq0);
    aq1 = quad_sum(aq1);
    if (p < 2 && j + p < a.dv) orow[static_cast<int64_t>(cn - 1) * a.out_token_stride + j + p] = sigma * (p == 0 ? aq0 : aq1);
  }
  if (a.state_out != nullptr) {
    float* so = a.state_out + static_cast<int64_t>(h) * DK * a.dv;
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        store_pair(so + static_cast<int64_t>(16 * m + 4 * p + e) * a.dv, j, a.dv, vec, sigma * s[m][e].x,
                   sigma * s[m][e].y);
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
                  static_cast<unsigned>((a.dv + kShortCols - 1) / kShortCols));
  const bool vec = vectorizable(a) && (a.state_out == nullptr || aligned16(a.state_out));
  gdn_short_kernel<DK><<<grid, kShortThreads, bytes, stream>>>(a, vec);
  return cudaGetLastError();
}

}  // namespace

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
