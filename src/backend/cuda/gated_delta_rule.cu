// Chunked gated delta rule (the GatedDeltaRule op, KEV_SPEC.md §5.4) for packed sequences.
//
// Math. Per sequence and value head h (key head kh = h / (Hv/Hk)), S ∈ R^{dk×dv} starts from
// state_in[h] (null: zero) and for each token t, with α_t = e^{g_t}:
//   S̄ = α_t S;  S = S̄ + k_t (β_t (v_t − S̄ᵀk_t))ᵀ;  o_t = Sᵀq_t.
// q arrives L2-normalised and already scaled by 1/sqrt(dk) (the l2_norm op applies the scale), so
// this kernel applies no q scale. g is the natural-log decay (g <= 0) and β ∈ (0, 1), both per token
// and value head, as the gdn_gates op produces them.
// Chunked (WY / UT) form, chunks of C = 64 tokens, S₀ the state entering the chunk:
//   Γ_i = Σ_{t<=i} g_t (within the chunk, in double), γ_i = e^{Γ_i}, D_ij = e^{Γ_i−Γ_j} (j <= i);
//   L = I + M, M_ij = β_i (k_i·k_j) D_ij (j < i), unit lower triangular;
//   Δ = L⁻¹ R with R = diag(β)(V − diag(γ) K S₀)          (forward substitution, no inverse formed)
//   O = diag(γ) Q S₀ + P Δ with P_ij = (q_i·k_j) D_ij (j <= i);
//   S₀ ← γ_{C−1} S₀ + Σ_j D_{C−1,j} k_j Δ_jᵀ.
// This equals the CPU FAST form (L [U | W] = [diag(β)V | diag(βγ)K], Δ = U − W S₀) because
// Δ = L⁻¹ diag(β) V − L⁻¹ diag(βγ) K S₀; solving for Δ directly avoids the [C, dk] W solve.
// A ragged last chunk is zero-padded (q = k = v = 0, β = 0, g = 0): padded rows add nothing to M, R,
// Δ or the state and leave Γ_{C−1} = Γ_{cn−1}, exactly as in the CPU reference.
// Why Γ in double: a spiky gate (g down to −1000, the op test's spiky_log_decay) makes Γ large, and
// FP32 partial sums would then lose the small differences Γ_i − Γ_j that D needs (ulp(1000) ≈ 6e-5);
// the double sum keeps them exact, and each difference is rounded to FP32 only before its exp, which
// never overflows (exponent <= 0).
//
// Layout. q, k [n, Hk, dk] with row stride qk_token_stride; v, out [n, Hv, dv] with row strides
// v_token_stride / out_token_stride; g, beta [n, Hv] with row stride gate_token_stride; state_in,
// state_out [Hv, dk, dv] contiguous, key-major (S[h][i][j], i over dk, j over dv). Sequence r is rows
// [offsets[r], offsets[r+1]) and starts from state_in (shared, read-only); state_out (only with one
// sequence) gets the final state and may be the identical view of state_in (every block reads its
// slice before writing it, and slices are disjoint).
//
// Launch. Two kernels. (1) gdn_chunk_products_kernel: the state-independent C×C products
// P_ij = (q_i·k_j) D_ij (j <= i) and M_ij = β_i (k_i·k_j) D_ij (j < i) of every chunk, once per chunk
// and value head (not once per state slice, and off the sequential path): grid (max_chunks, Hv, 2)
// (z: P or M), 256 threads, 8 warps over the 10 lower 16×16 blocks; chunks are numbered sequence
// by sequence and a block past the pass's last chunk returns. They go to the workspace,
// [max_chunks, Hv, 2, C, C] floats with max_chunks = (n_tokens + (C − 1)·n_seqs) / C >= Σ ceil(len_r / C)
// (blocks above the diagonal written as zero). Shared memory: Q, K and Γ, 66.5 KiB at dk = 128.
// (2) gdn_chunked_kernel, the recurrence. Column j of S evolves using only column j of S and v (q, k,
// g, β are shared), so the dv columns are split into slices of 32: grid (ceil(dv/32), Hv, n_seqs),
// 256 threads, one block walking its sequence's chunks in order with its [dk, 32] state slice in
// registers (and a shared-memory copy for the chunk products). The 4B model (Hv = 32, dv = 128) gives
// 128 blocks for one sequence, the 0.8B (Hv = 16) 64. Each block reads its q/k/v/g/β rows once and
// writes its out columns once. Per chunk: load (Q, K, V slice, g, β; Γ by a warp scan in double) |
// P and M from the workspace into registers, [Q;K]·S₀ | store P and M over the dead Q and S₀ copy |
// forward substitution (warp w owns 4 columns, 8 lanes per column, right-looking with Δ in
// registers) | O = γQS₀ + PΔ to out, state update. Shared memory: 92.5 KiB at dk = 128 (68.75 at 64,
// 60.75 at 32), within the 99 KiB per-block limit of sm_86/sm_89. Registers: the kernel fetches the
// next chunk's q/k/v rows during the current one, compiled for one block per SM (up to 255
// registers); when every sequence fits one chunk (GdnArgs::short_seqs, a pass of question rows),
// there is nothing to fetch ahead, and a variant loading at the chunk's start is compiled for two
// blocks per SM (128 registers, a few spilled), so the many blocks of such a pass (4B, 6 rows: 768)
// run in half the waves. Both grids depend only on dv, Hv, n_tokens and n_seqs, never on the
// offsets' values (CUDA graph replay); the variant is part of the recorded command's signature.
// Work per chunk (dk = 128): ~0.65 M FMA for M and P (kernel 1), and per block of kernel 2 0.5 M for
// [Q;K]·S₀, 0.26 M for the state update, 0.13 M for PΔ and the substitution; the S₀ products are the
// inherently sequential part (3·dk·dv FMA per token and head). A short chunk (cn < 64: a Kev row of
// ~40 tokens is one) skips the 16-row blocks of M and P, the [Q;K]·S₀ row groups and the
// substitution steps that lie wholly in the zero padding, whose results are exactly zero.
// Dtypes: FP32 in, out and state; FP32 accumulation; double only for Γ. No TF32.
// Preconditions (gated_delta_rule_supported): dk ∈ {32, 64, 128}, dv >= 1, Hk >= 1 divides Hv,
// Hv <= 65535; at launch also 1 <= n_seqs <= 65535 and state_out only with n_seqs == 1. Global
// accesses are float4 when q/k/v/out are 16-byte aligned, their row strides multiples of 4 and
// dv % 4 == 0, scalar otherwise.
#include "backend/cuda/gated_delta_rule.cuh"

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kChunk = kGdnChunkTokens;
constexpr int kSlice = 32;    // state columns (of dv) per block
constexpr int kThreads = 256;
constexpr int kMaxGridYZ = 65535;

constexpr int cmax(int x, int y) { return x > y ? x : y; }

static_assert(kThreads == 8 * kSlice, "the substitution maps 8 lanes to each state column");

template <int DK>
struct GdnLayout {
  static constexpr int kLdQK = DK + 4;       // Q, K rows: +4 keeps float4 rows on distinct banks
  static constexpr int kLdCC = kChunk + 1;   // M, P rows
  static constexpr int kLdV = kSlice + 4;    // R/Δ, O rows (float4 aligned, conflict-free Δ stores)
  static constexpr int kRowsPerThread = DK / 32;  // state rows per thread in the update
  // Regions in floats after the double Γ[kChunk] block; each starts 16-byte aligned. Q is dead once
  // M, P and [Q;K]·S₀ are in registers, so P and O reuse its region; M reuses the S₀ copy's region
  // (S₀ lives in registers and is stored again by the state update, after M's last use).
  static constexpr int kQRegion = cmax(kChunk * kLdQK, kChunk * kLdCC + kChunk * kLdV);
  static constexpr int kSRegion = cmax(DK * kSlice, kChunk * kLdCC);
  static constexpr int kQ = 0;
  static constexpr int kP = kQ;
  static constexpr int kO = kP + kChunk * kLdCC;
  static constexpr int kK = kQ + kQRegion;
  static constexpr int kS = kK + kChunk * kLdQK;
  static constexpr int kM = kS;
  static constexpr int kR = kS + kSRegion;
  static constexpr int kGam = kR + kChunk * kLdV;
  static constexpr int kBeta = kGam + kChunk;
  static constexpr int kWLast = kBeta + kChunk;
  static constexpr int kFloats = kWLast + kChunk;
  static constexpr size_t kBytes = kChunk * sizeof(double) + kFloats * sizeof(float);
  static_assert(kO % 4 == 0 && kK % 4 == 0 && kS % 4 == 0 && kR % 4 == 0, "float4 alignment");
  // Fits the 99 KiB per-block limit of sm_86/sm_89 (sm_80: 163 KiB, sm_90: 227 KiB).
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// acc + a·b as four dependent FMAs (the plain expression compiles to a multiply, three FMAs and an add).
__device__ __forceinline__ float fma4(const float4& a, const float4& b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

__device__ __forceinline__ float comp(const float4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// g and β of chunk rows lane and lane + 32 of value head h (zero past the sequence end): gate[0..1] = g,
// gate[2..3] = β. Called by one warp.
__device__ __forceinline__ void fetch_gates(const GdnArgs& a, int h, int tf, int end, int lane, float gate[4]) {
  const int cf = min(kChunk, end - tf);
  const int64_t gs = a.gate_token_stride;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = lane + 32 * u;
    gate[u] = i < cf ? a.g[(tf + i) * gs + h] : 0.0f;
    gate[2 + u] = i < cf ? a.beta[(tf + i) * gs + h] : 0.0f;
  }
}

// Γ (inclusive scan of g, in double) and β of a chunk into shared memory; γ = e^Γ when gam is given.
// Called by one warp with fetch_gates' values.
__device__ __forceinline__ void scan_gates(const float gate[4], int lane, double* Gam, float* gam, float* bet) {
  double x0 = gate[0], x1 = gate[1];  // inclusive scans of both halves, in double
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y0 = __shfl_up_sync(0xffffffffu, x0, o);
    const double y1 = __shfl_up_sync(0xffffffffu, x1, o);
    if (lane >= o) {
      x0 += y0;
      x1 += y1;
    }
  }
  x1 += __shfl_sync(0xffffffffu, x0, 31);
  Gam[lane] = x0;
  Gam[lane + 32] = x1;
  if (gam != nullptr) {
    gam[lane] = static_cast<float>(exp(x0));
    gam[lane + 32] = static_cast<float>(exp(x1));
  }
  bet[lane] = gate[2];
  bet[lane + 32] = gate[3];
}

// Global index of sequence r's first chunk (chunks are numbered sequence by sequence).
__device__ __forceinline__ int first_chunk(const int32_t* offsets, int r) {
  int c = 0;
  for (int i = 0; i < r; ++i) c += (offsets[i + 1] - offsets[i] + kChunk - 1) / kChunk;
  return c;
}

// Upper bound of the chunks of a pass: Σ ceil(len_r / C) <= (n_tokens + (C − 1)·n_seqs) / C.
int64_t max_chunks(const GdnArgs& a) {
  return (static_cast<int64_t>(a.n_tokens) + static_cast<int64_t>(kChunk - 1) * a.n_seqs) / kChunk;
}

template <int DK>
struct GdnProductLayout {
  static constexpr int kLdQK = GdnLayout<DK>::kLdQK;
  static constexpr int kK = 0;
  static constexpr int kQ = kK + kChunk * kLdQK;
  static constexpr int kBeta = kQ + kChunk * kLdQK;
  static constexpr int kFloats = kBeta + kChunk;
  static constexpr size_t kBytes = kChunk * sizeof(double) + kFloats * sizeof(float);
  static_assert(kQ % 4 == 0, "float4 alignment");
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

// The state-independent chunk products (see the header comment): block (c, h, z) computes P (z = 0)
// or M (z = 1) of chunk c and value head h into products[c][h][z] (C×C, row-major; blocks above the
// diagonal written as zero). Blocks past the pass's last chunk return at once.
template <int DK>
__global__ void __launch_bounds__(kThreads) gdn_chunk_products_kernel(GdnArgs a, float* products) {
  using Lay = GdnProductLayout<DK>;
  constexpr int LQK = Lay::kLdQK;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* Gam = reinterpret_cast<double*>(smem_raw);
  float* base = reinterpret_cast<float*>(Gam + kChunk);
  float* Ks = base + Lay::kK;
  float* Qs = base + Lay::kQ;
  float* bet = base + Lay::kBeta;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c = blockIdx.x, h = blockIdx.y;
  const bool isP = blockIdx.z == 0;
  int t0 = -1, end = 0;
  for (int r = 0, first = 0; r < a.n_seqs; ++r) {
    const int b = a.offsets[r], e = a.offsets[r + 1], n = (e - b + kChunk - 1) / kChunk;
    if (c < first + n) {
      t0 = b + (c - first) * kChunk;
      end = e;
      break;
    }
    first += n;
  }
  if (t0 < 0) return;
  const int cn = min(kChunk, end - t0), kh = h / (a.Hv / a.Hk);
  for (int idx = tid; idx < kChunk * DK; idx += kThreads) {
    const int i = idx / DK, d = idx % DK;
    float kv = 0.0f, qv = 0.0f;
    if (i < cn) {
      const int64_t off = static_cast<int64_t>(t0 + i) * a.qk_token_stride + static_cast<int64_t>(kh) * DK + d;
      kv = a.k[off];
      if (isP) qv = a.q[off];
    }
    Ks[i * LQK + d] = kv;
    Qs[i * LQK + d] = qv;
  }
  if (warp == 0) {
    float gate[4];
    fetch_gates(a, h, t0, end, lane, gate);
    scan_gates(gate, lane, Gam, nullptr, bet);
  }
  __syncthreads();

  float* dst = products + (static_cast<int64_t>(c) * a.Hv + h) * 2 * kChunk * kChunk + (isP ? 0 : kChunk * kChunk);
  const float* A = isP ? Qs : Ks;
  // The 10 lower 16×16 blocks over 8 warps; lane: rows i0, i0 + 1, columns j0 + 4m.
  for (int b = warp; b < 10; b += 8) {
    const int bi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
    const int bj = b - bi * (bi + 1) / 2;
    const int i0 = bi * 16 + (lane >> 2) * 2, j0 = bj * 16 + (lane & 3);
    float acc[2][4] = {};
    // Rows past cn are zero padding (and bj <= bi): a block starting there is all zero.
    const bool live = bi * 16 < cn;
#pragma unroll 4
    for (int d = 0; d < (live ? DK : 0); d += 4) {
      const float4 a0 = ld4(A + i0 * LQK + d), a1 = ld4(A + (i0 + 1) * LQK + d);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float4 kv = ld4(Ks + (j0 + 4 * m) * LQK + d);
        acc[0][m] = fma4(a0, kv, acc[0][m]);
        acc[1][m] = fma4(a1, kv, acc[1][m]);
      }
    }
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
      const int i = i0 + ii;
      const double gi = Gam[i];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = j0 + 4 * m;
        float val = 0.0f;
        if (isP ? j <= i : j < i) {
          val = acc[ii][m] * expf(static_cast<float>(gi - Gam[j]));
          if (!isP) val *= bet[i];
        }
        dst[i * kChunk + j] = val;
      }
    }
  }
  for (int idx = tid; idx < kChunk * kChunk; idx += kThreads) {
    const int i = idx / kChunk, j = idx % kChunk;
    if (j / 16 > i / 16) dst[idx] = 0.0f;
  }
}

// kAhead: fetch the next chunk's q/k/v into registers during this one (a long sequence); without it
// (every sequence one chunk, GdnArgs::short_seqs) they are loaded at the chunk's start, which frees
// those registers for two resident blocks per SM.
template <int DK, bool kAhead>
__global__ void __launch_bounds__(kThreads, kAhead ? 1 : 2) gdn_chunked_kernel(GdnArgs a, bool vec,
                                                                               const float* products) {
  using Lay = GdnLayout<DK>;
  constexpr int LQK = Lay::kLdQK, LCC = Lay::kLdCC, LV = Lay::kLdV, RPT = Lay::kRowsPerThread;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* Gam = reinterpret_cast<double*>(smem_raw);
  float* base = reinterpret_cast<float*>(Gam + kChunk);
  float* Qs = base + Lay::kQ;
  float* Ks = base + Lay::kK;
  float* Ss = base + Lay::kS;
  float* Ms = base + Lay::kM;
  float* Ps = base + Lay::kP;
  float* Rs = base + Lay::kR;  // V slice, then R, then Δ (in place)
  float* Os = base + Lay::kO;
  float* gam = base + Lay::kGam;
  float* bet = base + Lay::kBeta;
  float* wlast = base + Lay::kWLast;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.x * kSlice;
  const int h = blockIdx.y, r = blockIdx.z;
  const int kh = h / (a.Hv / a.Hk);
  const int dv = a.dv;
  const int begin = a.offsets[r], end = a.offsets[r + 1];
  const int chunk0 = first_chunk(a.offsets, r);

  // State ownership in the update: rows [srow, srow + RPT) of dk, columns scol..scol+3 of the slice.
  const int scol = 4 * (tid & 7), srow = (tid >> 3) * RPT;
  const int64_t state_base = static_cast<int64_t>(h) * DK * dv;
  float s[RPT][4];
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = c0 + scol + c;
      s[ii][c] = (a.state_in != nullptr && col < dv) ? a.state_in[state_base + (srow + ii) * dv + col] : 0.0f;
      Ss[(srow + ii) * kSlice + scol + c] = s[ii][c];
    }
  }
  bool state_zero = a.state_in == nullptr;  // S₀ == 0 exactly: skip the S₀ products

  // Vector path: a chunk's q/k/v rows are fetched into registers one chunk ahead (issued before the
  // substitution, stored at the next chunk's start), so their latency overlaps the substitution and
  // the output / state phases. Rows past the sequence end are zero. (The scalar path loads in place.)
  constexpr int kQK4 = kChunk * DK / 4 / kThreads, kV4 = kChunk * kSlice / 4 / kThreads;
  float4 qr[kQK4], kr[kQK4], vr[kV4];
  auto fetch = [&](int tf) {
    const int cf = min(kChunk, end - tf);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < kQK4; ++u) {
      const int idx = tid + u * kThreads, i = idx / (DK / 4), d = 4 * (idx % (DK / 4));
      qr[u] = kr[u] = zero;
      if (i < cf) {
        const int64_t off = static_cast<int64_t>(tf + i) * a.qk_token_stride + static_cast<int64_t>(kh) * DK + d;
        qr[u] = ld4(a.q + off);
        kr[u] = ld4(a.k + off);
      }
    }
#pragma unroll
    for (int u = 0; u < kV4; ++u) {
      const int idx = tid + u * kThreads, i = idx / (kSlice / 4), c = 4 * (idx % (kSlice / 4));
      vr[u] = zero;
      if (i < cf && c0 + c < dv) {  // dv % 4 == 0 here, so the whole float4 is inside the row
        vr[u] = ld4(a.v + static_cast<int64_t>(tf + i) * a.v_token_stride + static_cast<int64_t>(h) * dv + c0 + c);
      }
    }
  };
  // Warp 0 fetches g and β the same way, a chunk ahead (both paths).
  float gate[4];
  if (begin < end) {
    if (vec && kAhead) fetch(begin);
    if (warp == 0) fetch_gates(a, h, begin, end, lane, gate);
  }

  for (int t0 = begin; t0 < end; t0 += kChunk) {
    const int cn = min(kChunk, end - t0);
    __syncthreads();  // the previous chunk's readers of K, R, O, P and the S₀ copy are done

    // ---- load the chunk (zero padded to kChunk rows) ----
    if (vec) {
      if constexpr (!kAhead) fetch(t0);
#pragma unroll
      for (int u = 0; u < kQK4; ++u) {
        const int idx = tid + u * kThreads, i = idx / (DK / 4), d = 4 * (idx % (DK / 4));
        *reinterpret_cast<float4*>(Qs + i * LQK + d) = qr[u];
        *reinterpret_cast<float4*>(Ks + i * LQK + d) = kr[u];
      }
#pragma unroll
      for (int u = 0; u < kV4; ++u) {
        const int idx = tid + u * kThreads, i = idx / (kSlice / 4), c = 4 * (idx % (kSlice / 4));
        *reinterpret_cast<float4*>(Rs + i * LV + c) = vr[u];
      }
    } else {
      for (int idx = tid; idx < kChunk * DK; idx += kThreads) {
        const int i = idx / DK, d = idx % DK;
        float qv = 0.0f, kv = 0.0f;
        if (i < cn) {
          const int64_t off = static_cast<int64_t>(t0 + i) * a.qk_token_stride + static_cast<int64_t>(kh) * DK + d;
          qv = a.q[off];
          kv = a.k[off];
        }
        Qs[i * LQK + d] = qv;
        Ks[i * LQK + d] = kv;
      }
      for (int idx = tid; idx < kChunk * kSlice; idx += kThreads) {
        const int i = idx / kSlice, c = idx % kSlice;
        float vv = 0.0f;
        if (i < cn && c0 + c < dv) {
          vv = a.v[static_cast<int64_t>(t0 + i) * a.v_token_stride + static_cast<int64_t>(h) * dv + c0 + c];
        }
        Rs[i * LV + c] = vv;
      }
    }
    if (warp == 0) scan_gates(gate, lane, Gam, gam, bet);
    __syncthreads();

    // ---- fetch this chunk's P and M (gdn_chunk_products_kernel) into registers; [Q;K]·S₀ ----
    // They are stored over Q and the S₀ copy once those are dead; the loads overlap [Q;K]·S₀.
    constexpr int kMP4 = 2 * kChunk * kChunk / 4 / kThreads;
    float4 mp[kMP4];
    {
      const float* src =
          products + (static_cast<int64_t>(chunk0 + (t0 - begin) / kChunk) * a.Hv + h) * 2 * kChunk * kChunk;
#pragma unroll
      for (int u = 0; u < kMP4; ++u) mp[u] = ld4(src + 4 * (tid + u * kThreads));
    }
    // Rows 4·rg.. of the stacked [Q; K] (rg < 16: Q, else K) times S₀'s columns xcol..xcol+3.
    const int xcol = 4 * (tid & 7), xrg = tid >> 3;
    const bool xq = xrg < 16;
    const int xi0 = 4 * (xrg & 15);
    float x[4][4] = {};
    if (!state_zero && xi0 < cn) {  // padded rows (>= cn) are zero
      const float* A = (xq ? Qs : Ks) + xi0 * LQK;
#pragma unroll 2
      for (int d = 0; d < DK; d += 4) {
        float4 av[4], sv[4];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) av[ii] = ld4(A + ii * LQK + d);
#pragma unroll
        for (int dd = 0; dd < 4; ++dd) sv[dd] = ld4(Ss + (d + dd) * kSlice + xcol);
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float4 sc4 = make_float4(comp(sv[0], c), comp(sv[1], c), comp(sv[2], c), comp(sv[3], c));
            x[ii][c] = fma4(av[ii], sc4, x[ii][c]);
          }
        }
      }
    }
    if (!xq) {  // R = diag(β)(V − diag(γ) K S₀), in place over V (not aliased with Q or S₀)
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
        const int i = xi0 + ii;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float* rv = Rs + i * LV + xcol + c;
          *rv = bet[i] * (*rv - gam[i] * x[ii][c]);
        }
      }
    }
    if (tid < kChunk) wlast[tid] = expf(static_cast<float>(Gam[kChunk - 1] - Gam[tid]));
    __syncthreads();  // Q and the S₀ copy are dead: store P, O and M over them
#pragma unroll
    for (int u = 0; u < kMP4; ++u) {
      const int e = 4 * (tid + u * kThreads), mat = e / (kChunk * kChunk), i = (e / kChunk) % kChunk, j = e % kChunk;
      float* dst = (mat == 0 ? Ps : Ms) + i * LCC + j;
      dst[0] = mp[u].x, dst[1] = mp[u].y, dst[2] = mp[u].z, dst[3] = mp[u].w;
    }
    if (xq) {  // O = diag(γ) Q S₀
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
        const int i = xi0 + ii;
#pragma unroll
        for (int c = 0; c < 4; ++c) Os[i * LV + xcol + c] = gam[i] * x[ii][c];
      }
    }
    __syncthreads();

    if (t0 + kChunk < end) {
      if (vec && kAhead) fetch(t0 + kChunk);
      if (warp == 0) fetch_gates(a, h, t0 + kChunk, end, lane, gate);
    }

    // ---- forward substitution L Δ = R: warp w owns columns 4w..4w+3, 8 lanes per column ----
    // Right-looking: lane `part` keeps the running sums of rows ≡ part (mod 8). Once row j's sum is
    // complete its owner finalises Δ_j, one shuffle hands it to the column's other lanes, and every
    // later row adds M_ij Δ_j. The dependent chain per row is one subtraction, one shuffle and one FMA.
    {
      const int part = lane & 7, col = 4 * warp + (lane >> 3), owner0 = lane & ~7;
      float acc[kChunk / 8], dl[kChunk / 8];  // row 8m + part: Σ_j M_ij Δ_j so far, then Δ
#pragma unroll
      for (int m = 0; m < kChunk / 8; ++m) acc[m] = dl[m] = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (j >= cn) break;  // padded rows: R = 0 and M = 0, so Δ stays 0 there
        float dj = 0.0f;
        if (part == (j & 7)) dj = dl[j >> 3] = Rs[j * LV + col] - acc[j >> 3];
        dj = __shfl_sync(0xffffffffu, dj, owner0 + (j & 7));
#pragma unroll
        for (int m = 0; m < kChunk / 8; ++m) {
          if (8 * m + 7 > j) {
            const int i = 8 * m + part;
            if (i > j) acc[m] = fmaf(Ms[i * LCC + j], dj, acc[m]);
          }
        }
      }
      // Each lane reads and writes only rows ≡ part (mod 8) of its column, so in place is safe.
#pragma unroll
      for (int m = 0; m < kChunk / 8; ++m) Rs[(8 * m + part) * LV + col] = dl[m];
    }
    __syncthreads();

    // ---- O = γQS₀ + PΔ, written to out ----
    {
      const int ocol = 4 * (tid & 7), i0 = 2 * (tid >> 3);
      float o[2][4];
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const float4 v = ld4(Os + (i0 + ii) * LV + ocol);
        o[ii][0] = v.x, o[ii][1] = v.y, o[ii][2] = v.z, o[ii][3] = v.w;
      }
      const int jend = min(i0 + 2, cn);  // P is zero above the diagonal and Δ is zero past cn
      for (int j = 0; j < jend; ++j) {
        const float4 dj = ld4(Rs + j * LV + ocol);
        const float p0 = Ps[i0 * LCC + j], p1 = Ps[(i0 + 1) * LCC + j];
        o[0][0] += p0 * dj.x, o[0][1] += p0 * dj.y, o[0][2] += p0 * dj.z, o[0][3] += p0 * dj.w;
        o[1][0] += p1 * dj.x, o[1][1] += p1 * dj.y, o[1][2] += p1 * dj.z, o[1][3] += p1 * dj.w;
      }
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int i = i0 + ii;
        if (i >= cn) continue;
        float* dst = a.out + static_cast<int64_t>(t0 + i) * a.out_token_stride + static_cast<int64_t>(h) * dv + c0;
        if (vec) {
          if (c0 + ocol < dv) *reinterpret_cast<float4*>(dst + ocol) = make_float4(o[ii][0], o[ii][1], o[ii][2], o[ii][3]);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (c0 + ocol + c < dv) dst[ocol + c] = o[ii][c];
          }
        }
      }
    }

    // ---- S₀ ← γ_{C−1} S₀ + Σ_j D_{C−1,j} k_j Δ_jᵀ (skipped after the last chunk unless wanted) ----
    if (t0 + kChunk < end || a.state_out != nullptr) {
      const float gl = gam[kChunk - 1];
#pragma unroll
      for (int ii = 0; ii < RPT; ++ii) {
#pragma unroll
        for (int c = 0; c < 4; ++c) s[ii][c] *= gl;
      }
      for (int j = 0; j < cn; ++j) {
        const float4 dj = ld4(Rs + j * LV + scol);
        const float w = wlast[j];
#pragma unroll
        for (int ii = 0; ii < RPT; ++ii) {
          const float kw = Ks[j * LQK + srow + ii] * w;
          s[ii][0] += kw * dj.x, s[ii][1] += kw * dj.y, s[ii][2] += kw * dj.z, s[ii][3] += kw * dj.w;
        }
      }
      // Overwrites M (dead since the substitution's barrier); the next chunk's [Q;K]·S₀ reads it.
#pragma unroll
      for (int ii = 0; ii < RPT; ++ii) {
#pragma unroll
        for (int c = 0; c < 4; ++c) Ss[(srow + ii) * kSlice + scol + c] = s[ii][c];
      }
      state_zero = false;
    }
  }

  if (a.state_out != nullptr) {
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = c0 + scol + c;
        if (col < dv) a.state_out[state_base + (srow + ii) * dv + col] = s[ii][c];
      }
    }
  }
}


// float4 loads of q/k/v rows and stores of out rows need 16-byte aligned rows and dv % 4 == 0 (a
// slice's float4 column groups then never straddle the end of a row).
bool vectorizable(const GdnArgs& a) {
  return aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) && a.qk_token_stride % 4 == 0 &&
         a.v_token_stride % 4 == 0 && a.out_token_stride % 4 == 0 && a.dv % 4 == 0;
}

// Opts the kernel into its dynamic shared memory once per process (before any graph capture that
// launches it, since the first launch happens eagerly); the result is remembered.
template <int DK>
cudaError_t launch_dk(const GdnArgs& a, float* products, cudaStream_t stream) {
  constexpr size_t bytes = GdnLayout<DK>::kBytes, product_bytes = GdnProductLayout<DK>::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      gdn_chunked_kernel<DK, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  static const cudaError_t short_attr = cudaFuncSetAttribute(
      gdn_chunked_kernel<DK, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (short_attr != cudaSuccess) return short_attr;
  static const cudaError_t product_attr = cudaFuncSetAttribute(
      gdn_chunk_products_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(product_bytes));
  if (product_attr != cudaSuccess) return product_attr;
  const int64_t chunks = max_chunks(a);
  if (chunks > 0) {
    gdn_chunk_products_kernel<DK><<<dim3(static_cast<unsigned>(chunks), a.Hv, 2), kThreads, product_bytes, stream>>>(
        a, products);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((a.dv + kSlice - 1) / kSlice, a.Hv, a.n_seqs);
  if (a.short_seqs) {
    gdn_chunked_kernel<DK, false><<<grid, kThreads, bytes, stream>>>(a, vectorizable(a), products);
  } else {
    gdn_chunked_kernel<DK, true><<<grid, kThreads, bytes, stream>>>(a, vectorizable(a), products);
  }
  return cudaGetLastError();
}

}  // namespace

bool gated_delta_rule_supported(int Hk, int Hv, int dk, int dv) {
  return Hk >= 1 && Hv >= Hk && Hv % Hk == 0 && Hv <= kMaxGridYZ && (dk == 32 || dk == 64 || dk == 128) && dv >= 1;
}

size_t gated_delta_rule_workspace_bytes(const GdnArgs& a) {
  if (a.n_seqs < 1 || a.n_tokens < 0 || a.Hv < 1) return 0;
  return static_cast<size_t>(max_chunks(a)) * static_cast<size_t>(a.Hv) * 2 * kChunk * kChunk * sizeof(float);
}

cudaError_t launch_gated_delta_rule(const GdnArgs& a, void* workspace, cudaStream_t stream) {
  if (!gated_delta_rule_supported(a.Hk, a.Hv, a.dk, a.dv) || a.n_seqs < 1 || a.n_seqs > kMaxGridYZ ||
      (a.state_out != nullptr && a.n_seqs != 1) || (max_chunks(a) > 0 && workspace == nullptr) ||
      max_chunks(a) > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  float* products = static_cast<float*>(workspace);
  switch (a.dk) {
    case 32:
      return launch_dk<32>(a, products, stream);
    case 64:
      return launch_dk<64>(a, products, stream);
    default:
      return launch_dk<128>(a, products, stream);
  }
}

}  // namespace kev::cuda
