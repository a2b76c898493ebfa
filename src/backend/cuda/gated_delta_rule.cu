// Chunked gated delta rule (the GatedDeltaRule op, KEV_SPEC.md §5.4) for packed sequences, its
// products on tensor cores at FP32 accuracy (3xTF32).
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
//   Δ = L⁻¹ R with R = diag(β)(V − diag(γ) K S₀), by blocks of 16 rows b (L_bc = M_bc below the diagonal):
//     Δ_b = T_b (R_b − Σ_{c<b} M_bc Δ_c), T_b = L_bb⁻¹ (only the four 16×16 diagonal blocks are inverted);
//   O = diag(γ) Q S₀ + P Δ with P_ij = (q_i·k_j) D_ij (j <= i);
//   S₀ ← γ_{C−1} S₀ + (diag(w) K)ᵀ Δ, w_j = D_{C−1,j}.
// This equals the CPU FAST form (L [U | W] = [diag(β)V | diag(βγ)K], Δ = U − W S₀) because
// Δ = L⁻¹ diag(β) V − L⁻¹ diag(βγ) K S₀; solving for Δ directly avoids the [C, dk] W solve.
// A ragged last chunk is zero-padded (q = k = v = 0, β = 0, g = 0): padded rows add nothing to M, R,
// Δ or the state and leave Γ_{C−1} = Γ_{cn−1}, exactly as in the CPU reference.
// Why Γ in double: a spiky gate (g down to −1000, the op test's spiky_log_decay) makes Γ large, and
// FP32 partial sums would then lose the small differences Γ_i − Γ_j that D needs (ulp(1000) ≈ 6e-5);
// the double sum keeps them exact, and each difference is rounded to FP32 only before its exp, which
// never overflows (exponent <= 0).
//
// Tensor cores. Q Kᵀ, K Kᵀ, [Q;K]·S₀, P Δ and (diag(w) K)ᵀ Δ run as 3xTF32 on mma.sync.m16n8k8, as in
// attention.cu: each FP32 operand is split into TF32 hi + lo as its fragment is read from shared
// memory (split_tf32), and a_hi·b_hi, a_lo·b_hi, a_hi·b_lo go to three FP32 accumulators (relative
// error near 2^-21 per product; plain TF32 fails the op tests' 1e-9 NMSE). The tensor cores'
// accumulation truncates, so no accumulator runs over more than 64 products (kRun) from zero: the
// dk = 128 sums are flushed into an FP32 register sum halfway, and the state update adds its fresh
// chunk sum to γ_{C−1} S₀ in FP32. Fragment mapping (lane = 4g + t): A (16×8, row-major) a0..a3 =
// A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; B (8×8) b0, b1 = B[t][g], B[t+4][g]; the accumulator
// c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. The blocked substitution's products
// (M_bc Δ_c, T_b Y_b) run the same way; T_b itself comes from a scalar substitution in double.
//
// Layout. q, k [n, Hk, dk] with row stride qk_token_stride; v, out [n, Hv, dv] with row strides
// v_token_stride / out_token_stride; g, beta [n, Hv] with row stride gate_token_stride; state_in,
// state_out [Hv, dk, dv] contiguous, key-major (S[h][i][j], i over dk, j over dv). Sequence r is rows
// [offsets[r], offsets[r+1]) and starts from state_in (shared, read-only); state_out (only with one
// sequence) gets the final state and may be the identical view of state_in (every block reads its
// slice before writing it, and slices are disjoint).
//
// Launch (every pass with a sequence longer than one chunk). Two kernels. (1)
// gdn_chunk_products_kernel: the state-independent C×C products P_ij = (q_i·k_j) D_ij (j <= i) and
// M_ij = β_i (k_i·k_j) D_ij (j < i) of every chunk, off the sequential path: grid (max_chunks, Hk, 2)
// (z: Q Kᵀ or K Kᵀ), 256 threads; the raw product of a chunk and key head is formed once (warp w:
// m16n8 tiles w, w+8, w+16 of the 10 lower 16×16 blocks) and then scaled by each of the Hv/Hk value
// heads' decays (and β) in turn; for M, 64 threads then invert the diagonal blocks (I + M_bb, unit
// lower triangular; thread (b, col) solves for column col by forward substitution in double, off the
// sequential path), and T_b takes M_bb's place. They go to the workspace, [max_chunks, Hv, 2, C, C]
// floats (P, then M with T_b on its diagonal); only the rows < cn of the 10 lower 16×16 blocks are
// written, the only part the recurrence reads. Sequence r's chunks are numbered from r + offsets[r] /
// C (O(1) to find, never overlapping, at most one unused index per sequence), so max_chunks = n_seqs +
// n_tokens / C; a block finds its sequence by a binary search and returns when its index is unused. Q
// and K rows arrive by cp.async (all copies in flight at once), the value heads' g and β one head
// ahead (the first during those copies). Shared memory: Q, K and Γ, 66.5 KiB at dk = 128.
// (2) gdn_chunked_kernel, the recurrence. Column j of S evolves using only column j of S and v (q, k,
// g, β are shared), so the dv columns are split into slices of SL = 32 (masked past dv): grid
// (ceil(dv/SL), Hv, n_seqs), 256 threads, one block walking its sequence's chunks in order with its
// [dk, SL] state slice in an FP32 shared copy, the B operand of [Q;K]·S₀, which the state update
// rewrites in place (each thread the elements of its m16n8 accumulator tiles; warp w: dk·SL/1024
// tiles of one 16-row band). The 4B model (Hv = 32, dv = 128) gives 128 blocks for one sequence. A
// long pass whose 32-column grid would fill at most half the SMs (the 0.8B prefill, Hv = 16: 64
// blocks on the H200's 132) walks slices of SL = 16 instead (dk >= 64): twice the blocks, each with
// half the columns of every product (one n8 tile a warp where the text below says two) and 86.25 KiB
// of shared memory; the choice depends on dv, Hv, n_seqs and the SM count only. Each block reads its
// q/k/v/g/β rows once and writes its out columns once. Per chunk:
// load (Q, K, V slice, g, β; Γ by a warp scan in double) | P and M from the workspace into registers
// (only what the products kernel writes: 5 float4 a thread); [Q;K]·S₀ (warp w: rows 16·(w%4).. of Q
// and of K, columns SL/2·(w/4)..; R written over V, γQS₀ kept in registers) | P and M stored over the
// dead Q | blocked substitution (warp w < SL/8 owns the n8 column tile 8w.., which depends on no other
// column, so it needs only warp-level syncs; Y_b and Δ_b overwrite R in place; the other warps wait at
// the barrier) | O = γQS₀ + PΔ on the same tiles, written to out; state update. Shared memory (rows
// padded so that fragment reads hit 32 banks: Q, K, P, M by 4 floats, S₀ and V/R/Δ by 8): 98.25 KiB at
// dk = 128 (72.25 at 64, 59.25 at 32), within the 99 KiB per-block limit of sm_86/sm_89. The next
// chunk's q/k/v rows are fetched into registers during the current chunk; one block per SM (up to 255
// registers). Both grids depend only on dv, Hk, Hv, n_tokens and n_seqs, never on the offsets' values
// (CUDA graph replay). A short last chunk skips the 16-row tiles of M, P, [Q;K]·S₀ and PΔ, the k-steps
// and the substitution blocks that lie wholly in the zero padding, whose results are exactly zero: the
// rows past cn of a partly used block of P and M are loaded as zeros, so Y and Δ stay zero there.
//
// Passes whose sequences all fit one chunk (GdnArgs::short_seqs: Kev's question rows, a state of up to
// 64 tokens) take other kernels: the token recurrence with the state in registers
// (gated_delta_rule_short.cu) when its grid fits two blocks per SM, else the rows kernels
// (gated_delta_rule_rows.cu; question rows from one shared state, never with state_out).
//
// Dtypes: FP32 in, out and state; products 3xTF32 with FP32 accumulation; double only for Γ and T_b.
// Preconditions (gated_delta_rule_supported): dk ∈ {32, 64, 128}, dv >= 1, Hk >= 1 divides Hv,
// Hv <= 65535; at launch also 1 <= n_seqs <= 65535 and state_out only with n_seqs == 1; sm_80 or
// newer (TF32 mma, cp.async). Global accesses are 16-byte (out: 8-byte) when q/k/v/out and state_in
// are 16-byte aligned, their row strides multiples of 4 and dv % 4 == 0, scalar otherwise.
#include "backend/cuda/gated_delta_rule.cuh"

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/gdn_common.cuh"

namespace kev::cuda {

namespace gdn {

namespace {

template <int DK, int SL = kSlice>
struct GdnLayout {
  static_assert(SL == kSlice || SL == kNarrow, "the warp tilings below assume 32- or 16-column slices");
  // Row pitches: ≡ 4 (mod 32) for matrices read as A fragments (row g, column t: 32 banks), ≡ 8 for
  // those read as B fragments (row t, column g: 32 banks).
  static constexpr int kLdQK = DK + 4;      // Q, K rows
  static constexpr int kLdCC = kChunk + 4;  // P, M rows
  static constexpr int kLdS = SL + 8;   // S₀ copy rows
  static constexpr int kLdV = SL + 8;   // V / R / Δ rows
  // State tiles (m16n8) per warp: the [DK, SL] slice is (DK/16)·(SL/8) tiles over 8 warps.
  static constexpr int kTilesPerWarp = DK / 16 * (SL / 8) / 8;
  // Regions in floats after the double Γ[kChunk] block; each starts 16-byte aligned. Q is dead once
  // [Q;K]·S₀ is in registers, so P and M are stored over it.
  static constexpr int kQRegion = cmax(kChunk * kLdQK, 2 * kChunk * kLdCC);
  static constexpr int kQ = 0;
  static constexpr int kP = kQ;
  static constexpr int kM = kP + kChunk * kLdCC;
  static constexpr int kK = kQ + kQRegion;
  static constexpr int kS = kK + kChunk * kLdQK;
  static constexpr int kR = kS + DK * kLdS;
  static constexpr int kGam = kR + kChunk * kLdV;
  static constexpr int kBeta = kGam + kChunk;
  static constexpr int kWLast = kBeta + kChunk;
  static constexpr int kFloats = kWLast + kChunk;
  static constexpr size_t kBytes = kChunk * sizeof(double) + kFloats * sizeof(float);
  static_assert(kM % 4 == 0 && kK % 4 == 0 && kS % 4 == 0 && kR % 4 == 0, "float4 alignment");
  static_assert(kTilesPerWarp >= 1 && (SL / 8) % kTilesPerWarp == 0, "a warp's state tiles share one 16-row band");
  // Fits the 99 KiB per-block limit of sm_86/sm_89 (sm_80: 163 KiB, sm_90: 227 KiB).
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

template <int DK>
struct GdnProductLayout {
  static constexpr int kLdQK = GdnLayout<DK>::kLdQK;
  static constexpr int kK = 0;
  static constexpr int kQ = kK + kChunk * kLdQK;
  static constexpr int kBeta = kQ + kChunk * kLdQK;
  static constexpr int kFloats = kBeta + kChunk;
  static constexpr size_t kBytes = kChunk * sizeof(double) + kFloats * sizeof(float);
  static_assert(kQ % 4 == 0, "float4 alignment");
  static_assert(4 * kDiagPitch <= kChunk * kLdQK, "the diagonal blocks M_bb fit in Q's space");
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

// The state-independent chunk products (see the header comment): block (c, kh, z) computes Q Kᵀ
// (z = 0) or K Kᵀ (z = 1) of chunk c and key head kh once, then applies each of the key head's value
// heads' decays (and β for M) into products[c][h][z] (C×C, row-major; blocks above the diagonal
// written as zero). Blocks past the pass's last chunk return at once.
template <int DK>
__global__ void __launch_bounds__(kThreads) gdn_chunk_products_kernel(GdnArgs a, bool vec, float* products) {
  using Lay = GdnProductLayout<DK>;
  constexpr int LQK = Lay::kLdQK;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* Gam = reinterpret_cast<double*>(smem_raw);
  float* base = reinterpret_cast<float*>(Gam + kChunk);
  float* Ks = base + Lay::kK;
  float* Qs = base + Lay::kQ;
  float* bet = base + Lay::kBeta;
  // K Kᵀ blocks (z = 1) load no Q: its space holds the diagonal blocks M_bb (16×16 each) while they are inverted.
  float* Mdiag = Qs;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int c = blockIdx.x, kh = blockIdx.y;
  const bool isP = blockIdx.z == 0;
  const int r = chunk_seq(a.offsets, a.n_seqs, c), end = a.offsets[r + 1];
  const int t0 = a.offsets[r] + (c - first_chunk(a.offsets, r)) * kChunk;
  if (t0 >= end) return;  // a gap in the numbering, or past the pass's last chunk
  const int cn = min(kChunk, end - t0), group = a.Hv / a.Hk;
  // K (and Q for P) rows by cp.async, zero past cn: every copy is in flight at once (a plain load /
  // store loop waits out one global latency per iteration, since the stores may alias the loads).
  const int64_t row0 = static_cast<int64_t>(t0) * a.qk_token_stride + static_cast<int64_t>(kh) * DK;
  stage_tile<kChunk, DK>(Ks, LQK, a.k + row0, a.qk_token_stride, cn, DK, vec, tid);
  if (isP) stage_tile<kChunk, DK>(Qs, LQK, a.q + row0, a.qk_token_stride, cn, DK, vec, tid);
  cp_async_commit();
  // Warp 0 fetches each value head's g and β one head ahead, the first while Q and K arrive.
  float gate[4];
  if (warp == 0) fetch_gates(a, kh * group, t0, end, lane, gate);
  cp_async_wait_all();
  __syncthreads();

  // 20 m16n8 tiles (the 10 lower 16×16 blocks, two column halves each); warp w: tiles w, w + 8, w + 16.
  const float* const A[1] = {isP ? Qs : Ks};
  float acc[3][1][4] = {};
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    int bi, bj, col0;
    if (lower_tile(warp, u, cn, bi, bj, col0)) product_tile<DK, 1>(A, Ks, bi, col0, g, t, acc[u]);
  }

  for (int hh = 0; hh < group; ++hh) {
    const int h = kh * group + hh;
    __syncthreads();  // the previous head's readers of Γ and β are done
    if (warp == 0) {
      scan_gates(gate, lane, Gam, nullptr, bet);
      if (hh + 1 < group) fetch_gates(a, h + 1, t0, end, lane, gate);
    }
    __syncthreads();
    float* dst = products + (static_cast<int64_t>(c) * a.Hv + h) * 2 * kChunk * kChunk + (isP ? 0 : kChunk * kChunk);
    // Like gdn_rows_kernel's P and M, but exp only where the element is kept, and every tile (cn =
    // kChunk): the unconditional exp cost 24 registers at dk = 128 (80 → 104: two blocks per SM instead of
    // three), skipping the padding's tiles 22.
#pragma unroll
    for (int u = 0; u < 3; ++u) {
      int bi, bj, col0;
      if (!lower_tile(warp, u, kChunk, bi, bj, col0)) continue;
      const int j = col0 + 2 * t;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * bi + g + 8 * half;
        const double gi = Gam[i];
        float val[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          val[e] = 0.0f;
          if (isP ? j + e <= i : j + e < i) {
            val[e] = acc[u][0][2 * half + e] * expf(static_cast<float>(gi - Gam[j + e]));
            if (!isP) val[e] *= bet[i];
          }
        }
        if (!isP && bi == bj) {  // M_bb: inverted below
          *reinterpret_cast<float2*>(Mdiag + bi * kDiagPitch + (g + 8 * half) * 16 + j - 16 * bj) =
              make_float2(val[0], val[1]);
        } else if (i < cn) {
          *reinterpret_cast<float2*>(dst + i * kChunk + j) = make_float2(val[0], val[1]);
        }
      }
    }
    if (!isP) {
      // T_b = (I + M_bb)⁻¹, unit lower triangular, into M's diagonal block b: thread (b, col) solves
      // (I + M_bb) x = e_col by forward substitution in double (x_i = 0 above col comes out by itself);
      // row i needs only rows before it, so the solve stops at the chunk's end.
      __syncthreads();
      if (tid < 4 * 16 && 16 * (tid >> 4) < cn) {
        const int b = tid >> 4;
        invert_column(Mdiag + b * kDiagPitch, tid & 15, cn - 16 * b, dst + 16 * b * (kChunk + 1), kChunk);
      }
    }
  }
}

// The chunk's P and M as the recurrence reads them: the rows < cn of their 10 lower 16×16 blocks (what
// the products kernel writes; rows past cn are zero). Float4 u of thread tid: matrix, block, row and
// 4-column group of index tid + u·kThreads over the 2 × 10 × 16 × 4 float4s.
constexpr int kMP4 = 2 * 10 * 16 * 4 / kThreads;
static_assert(kMP4 * kThreads == 2 * 10 * 16 * 4, "the lower blocks' float4s split evenly over the threads");

struct MpSlot {
  int mat, i, j;  // matrix (0: P, 1: M), row, column
};
__device__ __forceinline__ MpSlot mp_slot(int tid, int u) {
  const int idx = tid + u * kThreads, rem = idx % 640;
  int bi, bj;
  lower_block(rem / 64, bi, bj);
  return {idx / 640, 16 * bi + (rem % 64) / 4, 16 * bj + 4 * (rem % 4)};
}

// The next chunk's q/k/v are fetched into registers during this one; one block per SM (up to 255
// registers).
template <int DK, int SL>
__global__ void __launch_bounds__(kThreads, 1) gdn_chunked_kernel(GdnArgs a, bool vec, const float* products) {
  using Lay = GdnLayout<DK, SL>;
  constexpr int LQK = Lay::kLdQK, LCC = Lay::kLdCC, LS = Lay::kLdS, LV = Lay::kLdV, TPW = Lay::kTilesPerWarp;
  constexpr int NT = SL / 16;  // n8 tiles per warp in the [Q;K]·S₀, R and output phases
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* Gam = reinterpret_cast<double*>(smem_raw);
  float* base = reinterpret_cast<float*>(Gam + kChunk);
  float* Qs = base + Lay::kQ;
  float* Ks = base + Lay::kK;
  float* Ss = base + Lay::kS;
  float* Ms = base + Lay::kM;
  float* Ps = base + Lay::kP;
  float* Rs = base + Lay::kR;  // V slice, then R, then Δ (in place)
  float* gam = base + Lay::kGam;
  float* bet = base + Lay::kBeta;
  float* wlast = base + Lay::kWLast;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int c0 = blockIdx.x * SL;
  const int h = blockIdx.y, r = blockIdx.z;
  const int kh = h / (a.Hv / a.Hk);
  const int dv = a.dv;
  const int begin = a.offsets[r], end = a.offsets[r + 1];
  const int chunk0 = first_chunk(a.offsets, r);

  // The state slice lives in the FP32 shared copy Ss (the operand of [Q;K]·S₀; the state update
  // rewrites it in place, each thread the elements of its m16n8 accumulator tiles: warp w owns tiles
  // w·TPW.. of the 16-row band sm0, columns 8·(sn0 + u); element e of tile u is row sm0 + g + 8·(e / 2),
  // column 8·(sn0 + u) + 2t + e % 2). It arrives by cp.async.
  const int sm0 = 16 * (warp * TPW / (SL / 8)), sn0 = warp * TPW % (SL / 8);
  const int64_t state_base = static_cast<int64_t>(h) * DK * dv;
  stage_tile<DK, SL>(Ss, LS, a.state_in != nullptr ? a.state_in + state_base + c0 : a.v, dv,
                         a.state_in != nullptr ? DK : 0, dv - c0, vec, tid);
  cp_async_commit();
  bool state_zero = a.state_in == nullptr;  // S₀ == 0 exactly: skip the S₀ products

  // Vector path: a chunk's q/k/v rows are fetched into registers one chunk ahead
  // (issued before the substitution, stored at the next chunk's start), so their latency overlaps the
  // substitution and the output / state phases. Rows past the sequence end are zero. (The scalar path
  // loads in place.)
  constexpr int kQK4 = kChunk * DK / 4 / kThreads, kV4 = kChunk * SL / 4 / kThreads;
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
      const int idx = tid + u * kThreads, i = idx / (SL / 4), c = 4 * (idx % (SL / 4));
      vr[u] = zero;
      if (i < cf && c0 + c < dv) {  // dv % 4 == 0 here, so the whole float4 is inside the row
        vr[u] = ld4(a.v + static_cast<int64_t>(tf + i) * a.v_token_stride + static_cast<int64_t>(h) * dv + c0 + c);
      }
    }
  };
  // Warp 0 fetches g and β the same way, a chunk ahead (both paths).
  float gate[4];
  if (begin < end) {
    if (vec) fetch(begin);
    if (warp == 0) fetch_gates(a, h, begin, end, lane, gate);
  }

  // Tensor-core tiles of the per-chunk products: warp w covers rows mrow.. (16) of Q, K, P and the
  // output, columns ncol.. (16, two n8 tiles) of the slice.
  const int mrow = 16 * (warp & 3), ncol = SL / 2 * (warp >> 2);

  for (int t0 = begin; t0 < end; t0 += kChunk) {
    const int cn = min(kChunk, end - t0);
    __syncthreads();  // the previous chunk's readers of K, Δ and P are done

    // ---- load the chunk (zero padded to kChunk rows) ----
    if (vec) {
#pragma unroll
      for (int u = 0; u < kQK4; ++u) {
        const int idx = tid + u * kThreads, i = idx / (DK / 4), d = 4 * (idx % (DK / 4));
        *reinterpret_cast<float4*>(Qs + i * LQK + d) = qr[u];
        *reinterpret_cast<float4*>(Ks + i * LQK + d) = kr[u];
      }
#pragma unroll
      for (int u = 0; u < kV4; ++u) {
        const int idx = tid + u * kThreads, i = idx / (SL / 4), c = 4 * (idx % (SL / 4));
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
      for (int idx = tid; idx < kChunk * SL; idx += kThreads) {
        const int i = idx / SL, c = idx % SL;
        float vv = 0.0f;
        if (i < cn && c0 + c < dv) {
          vv = a.v[static_cast<int64_t>(t0 + i) * a.v_token_stride + static_cast<int64_t>(h) * dv + c0 + c];
        }
        Rs[i * LV + c] = vv;
      }
    }
    cp_async_wait_all();  // the state (first chunk)
    if (warp == 0) scan_gates(gate, lane, Gam, gam, bet);
    __syncthreads();

    // ---- this chunk's P and M (gdn_chunk_products_kernel) into registers; [Q;K]·S₀ ----
    // Read as the products kernel writes them (mp_slot: rows past cn zero, blocks above the diagonal
    // never read); the loads overlap [Q;K]·S₀, and they are stored over Q once it is dead.
    const float* src =
        products + (static_cast<int64_t>(chunk0 + (t0 - begin) / kChunk) * a.Hv + h) * 2 * kChunk * kChunk;
    float4 mp[kMP4];
#pragma unroll
    for (int u = 0; u < kMP4; ++u) {
      const MpSlot sl = mp_slot(tid, u);
      mp[u] = sl.i < cn ? ld4(src + (sl.mat * kChunk + sl.i) * kChunk + sl.j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    // x[0] = Q S₀, x[1] = K S₀ on this warp's tiles (3xTF32; padded rows >= cn are zero).
    float x[2][NT][4] = {};
    if (!state_zero && mrow < cn) {
      const float* const qk[2] = {Qs, Ks};
      times_state<DK, SL, 2>(qk, Ss, mrow, ncol, g, t, x);
    }
    __syncthreads();  // Q is dead
#pragma unroll
    for (int u = 0; u < kMP4; ++u) {
      const MpSlot sl = mp_slot(tid, u);
      *reinterpret_cast<float4*>((sl.mat == 0 ? Ps : Ms) + sl.i * LCC + sl.j) = mp[u];
    }
    // R = diag(β)(V − diag(γ) K S₀) in place over V; x[0] becomes diag(γ) Q S₀, the output's first term.
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = mrow + g + 8 * (e >> 1), col = ncol + 8 * n + 2 * t + (e & 1);
        float* rv = Rs + i * LV + col;
        *rv = bet[i] * (*rv - gam[i] * x[1][n][e]);
        x[0][n][e] *= gam[i];
      }
    }
    if (tid < kChunk) wlast[tid] = expf(static_cast<float>(Gam[kChunk - 1] - Gam[tid]));
    __syncthreads();

    if (t0 + kChunk < end) {
      if (vec) fetch(t0 + kChunk);
      if (warp == 0) fetch_gates(a, h, t0 + kChunk, end, lane, gate);
    }

    // ---- blocked forward substitution L Δ = R, 16-row blocks b ----
    // Δ_b = T_b (R_b − Σ_{c<b} M_bc Δ_c) with T_b = L_bb⁻¹ in M's diagonal block (products kernel): per
    // block one k-run over the solved rows and one 16-deep product, four dependent steps instead of 64.
    // Column j of Δ needs only column j of R, so warp w < 4 solves the slice's n8 column tile 8w.. on its
    // own (warp-level syncs only); Y_b = R_b − Σ, then Δ_b, overwrite R_b in place. Blocks wholly in the
    // padding are skipped: R = 0 there, and so is Δ.
    if (warp < SL / 8) {
      const int nc = 8 * warp;
#pragma unroll
      for (int rb = 0; rb < kChunk; rb += 16) {
        if (rb >= cn) break;
        float big[4] = {}, lh[4] = {}, hl[4] = {};
#pragma unroll
        for (int k0 = 0; k0 < rb; k0 += 8) {  // Σ_{c<b} M_bc Δ_c: at most 48 products (kRun)
          uint32_t ah[4], al[4], bh[2], bl[2];
          load_a(Ms + rb * LCC + k0, LCC, g, t, ah, al);
          load_b(Rs + (k0 + t) * LV + nc + g, 4 * LV, bh, bl);
          mma_3xtf32(big, lh, hl, ah, al, bh, bl);
        }
        float* ry = Rs + (rb + g) * LV + nc + 2 * t;  // this lane's accumulator elements of block b
#pragma unroll
        for (int e = 0; e < 4; ++e) ry[8 * (e >> 1) * LV + (e & 1)] -= big[e] + (lh[e] + hl[e]);
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 4; ++e) big[e] = lh[e] = hl[e] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 8) {  // T_b Y_b
          uint32_t ah[4], al[4], bh[2], bl[2];
          load_a(Ms + rb * LCC + rb + k0, LCC, g, t, ah, al);
          load_b(Rs + (rb + k0 + t) * LV + nc + g, 4 * LV, bh, bl);
          mma_3xtf32(big, lh, hl, ah, al, bh, bl);
        }
        __syncwarp();  // every lane has read Y_b
#pragma unroll
        for (int e = 0; e < 4; ++e) ry[8 * (e >> 1) * LV + (e & 1)] = big[e] + (lh[e] + hl[e]);
        __syncwarp();  // Δ_b is visible to the warp's next blocks
      }
    }
    __syncthreads();

    // ---- O = γQS₀ + PΔ on this warp's tiles, written to out ----
    // P is zero right of the 16-row diagonal block and Δ past cn, so k runs to min(mrow + 16, cn).
    if (mrow < cn) {
      float big[NT][4] = {}, lh[NT][4] = {}, hl[NT][4] = {};
      const int kend = min(mrow + 16, cn);
      for (int k0 = 0; k0 < kend; k0 += 8) {
        uint32_t ah[4], al[4];
        load_a(Ps + mrow * LCC + k0, LCC, g, t, ah, al);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint32_t bh[2], bl[2];
          load_b(Rs + (k0 + t) * LV + ncol + 8 * n + g, 4 * LV, bh, bl);
          mma_3xtf32(big[n], lh[n], hl[n], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int col = c0 + ncol + 8 * n + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = mrow + g + 8 * half;
          if (i >= cn) continue;
          float o[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) o[e] = x[0][n][2 * half + e] + (big[n][2 * half + e] + (lh[n][2 * half + e] + hl[n][2 * half + e]));
          float* dst = a.out + static_cast<int64_t>(t0 + i) * a.out_token_stride + static_cast<int64_t>(h) * dv + col;
          if (vec) {
            if (col < dv) *reinterpret_cast<float2*>(dst) = make_float2(o[0], o[1]);
          } else {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (col + e < dv) dst[e] = o[e];
            }
          }
        }
      }
    }

    // ---- S₀ ← γ_{C−1} S₀ + (diag(w) K)ᵀ Δ, w_j = D_{C−1,j} (skipped after the last chunk unless wanted) ----
    if (t0 + kChunk < end || a.state_out != nullptr) {
      float big[TPW][4] = {}, lh[TPW][4] = {}, hl[TPW][4] = {};
      for (int k0 = 0; k0 < cn; k0 += 8) {
        // A fragment of (diag(w) K)ᵀ, rows sm0.. of dk: A[i][j] = K[j][sm0 + i]·w_j, read down K's columns.
        const float* kc = Ks + (k0 + t) * LQK + sm0 + g;
        const float w0 = wlast[k0 + t], w1 = wlast[k0 + t + 4];
        uint32_t ah[4], al[4];
        split_tf32(kc[0] * w0, ah[0], al[0]);
        split_tf32(kc[8] * w0, ah[1], al[1]);
        split_tf32(kc[4 * LQK] * w1, ah[2], al[2]);
        split_tf32(kc[4 * LQK + 8] * w1, ah[3], al[3]);
#pragma unroll
        for (int u = 0; u < TPW; ++u) {
          uint32_t bh[2], bl[2];
          load_b(Rs + (k0 + t) * LV + 8 * (sn0 + u) + g, 4 * LV, bh, bl);
          mma_3xtf32(big[u], lh[u], hl[u], ah, al, bh, bl);
        }
      }
      // The S₀ copy was last read by [Q;K]·S₀ (two barriers ago); the next chunk reads it after its first
      // barrier. Each thread rewrites only its own elements.
      const float gl = gam[kChunk - 1];
#pragma unroll
      for (int u = 0; u < TPW; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float* sp = Ss + (sm0 + g + 8 * (e >> 1)) * LS + 8 * (sn0 + u) + 2 * t + (e & 1);
          *sp = fmaf(gl, *sp, big[u][e] + (lh[u][e] + hl[u][e]));
        }
      }
      state_zero = false;
    }
  }

  // The final state: the last chunk's update left it in this thread's elements of Ss (an empty sequence:
  // the staged S₀, copied by other threads).
  if (a.state_out != nullptr) {
    cp_async_wait_all();
    __syncthreads();
#pragma unroll
    for (int u = 0; u < TPW; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = sm0 + g + 8 * (e >> 1), col = 8 * (sn0 + u) + 2 * t + (e & 1);
        if (c0 + col < dv) a.state_out[state_base + row * dv + c0 + col] = Ss[row * LS + col];
      }
    }
  }
}

template <int DK, int SL>
cudaError_t launch_recurrence(const GdnArgs& a, bool vec, const float* products, cudaStream_t stream) {
  constexpr size_t bytes = GdnLayout<DK, SL>::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      gdn_chunked_kernel<DK, SL>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  gdn_chunked_kernel<DK, SL><<<dim3((a.dv + SL - 1) / SL, a.Hv, a.n_seqs), kThreads, bytes, stream>>>(a, vec, products);
  return cudaGetLastError();
}

// Opts the kernels into their dynamic shared memory once per process (before any graph capture that
// launches them, since the first launch happens eagerly); the result is remembered. Passes whose
// sequences all fit one chunk (GdnArgs::short_seqs) take the token recurrence (short_pass) or, when
// they have too many rows for it, the rows kernels. A long pass whose 32-column slices would leave over
// half the SMs idle (the 0.8B prefill: 4 × 16 blocks) walks 16-column slices, twice the blocks, each
// with half the work per chunk.
template <int DK>
cudaError_t launch_dk(const GdnArgs& a, float* products, cudaStream_t stream) {
  if (short_pass(a)) return launch_short(a, stream);
  if (a.short_seqs) return max_chunks(a) > 0 ? launch_rows(a, products, stream) : cudaSuccess;
  constexpr size_t product_bytes = GdnProductLayout<DK>::kBytes;
  static const cudaError_t product_attr = cudaFuncSetAttribute(
      gdn_chunk_products_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(product_bytes));
  if (product_attr != cudaSuccess) return product_attr;
  const bool vec = vectorizable(a);
  const int64_t chunks = max_chunks(a);
  if (chunks > 0) {
    gdn_chunk_products_kernel<DK><<<dim3(static_cast<unsigned>(chunks), a.Hk, 2), kThreads, product_bytes, stream>>>(
        a, vec, products);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t wide_blocks = static_cast<int64_t>((a.dv + kSlice - 1) / kSlice) * a.Hv * a.n_seqs;
  if constexpr (DK >= 64) {
    if (2 * wide_blocks <= device_traits().sms) return launch_recurrence<DK, kNarrow>(a, vec, products, stream);
  }
  return launch_recurrence<DK, kSlice>(a, vec, products, stream);
}

}  // namespace

}  // namespace gdn

bool gated_delta_rule_supported(int Hk, int Hv, int dk, int dv) {
  return Hk >= 1 && Hv >= Hk && Hv % Hk == 0 && Hv <= gdn::kMaxGridYZ && (dk == 32 || dk == 64 || dk == 128) && dv >= 1;
}

size_t gated_delta_rule_workspace_bytes(const GdnArgs& a) {
  if (a.n_seqs < 1 || a.n_tokens < 0 || a.Hv < 1 || gdn::short_pass(a)) return 0;
  if (a.short_seqs) {  // the rows kernels' Q̃, [Hv, n_tokens, dk]
    return static_cast<size_t>(a.n_tokens) * static_cast<size_t>(a.Hv) * static_cast<size_t>(a.dk) * sizeof(float);
  }
  return static_cast<size_t>(gdn::max_chunks(a)) * static_cast<size_t>(a.Hv) * 2 * gdn::kChunk * gdn::kChunk * sizeof(float);
}

cudaError_t launch_gated_delta_rule(const GdnArgs& a, void* workspace, cudaStream_t stream) {
  if (!gated_delta_rule_supported(a.Hk, a.Hv, a.dk, a.dv) || a.n_seqs < 1 || a.n_seqs > gdn::kMaxGridYZ ||
      (a.state_out != nullptr && a.n_seqs != 1) || (!gdn::short_pass(a) && gdn::max_chunks(a) > 0 && workspace == nullptr) ||
      gdn::max_chunks(a) > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  float* products = static_cast<float*>(workspace);
  switch (a.dk) {
    case 32:
      return gdn::launch_dk<32>(a, products, stream);
    case 64:
      return gdn::launch_dk<64>(a, products, stream);
    default:
      return gdn::launch_dk<128>(a, products, stream);
  }
}

}  // namespace kev::cuda