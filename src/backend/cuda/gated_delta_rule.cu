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
// Launch (every pass but the question rows that take the rows kernels below). Two kernels. (1)
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
// dk = 128 (72.25 at 64, 59.25 at 32), within the 99 KiB per-block limit of sm_86/sm_89. Two variants.
// A pass with a long sequence fetches the next chunk's q/k/v rows into registers during the current
// chunk, compiled for one block per SM (up to 255 registers). When every sequence fits one chunk
// (GdnArgs::short_seqs: one sequence with state_out, or question rows too few for the rows kernels, the
// 0.8B's 6 rows: 384 blocks) there is nothing to fetch ahead: the block's state slice and its one chunk
// of q, k and v are copied by cp.async at its start, all in flight at once and holding no registers,
// and the kernel is compiled for two blocks per SM (128 registers, 60 bytes spilled at dk = 128). On
// sm_90 such a short pass's recurrence is the products kernel's programmatic dependent launch: its
// blocks start as SMs free up and stage their loads while the products kernel finishes, waiting for
// it (griddepcontrol.wait) only before reading P and M. (A long pass is launched plainly: the
// dependent launch timed slower there, 4B 2,187 tokens 359 against 350 µs.) Both grids depend only on
// dv, Hk, Hv, n_tokens and n_seqs, never on the offsets' values (CUDA graph replay); the variant is
// part of the recorded command's signature. A short chunk (cn < 64: a Kev row of ~40 tokens is one)
// skips the 16-row tiles of M, P, [Q;K]·S₀ and PΔ, the k-steps and the substitution blocks that lie
// wholly in the zero padding, whose results are exactly zero: the rows past cn of a partly used block
// of P and M are loaded as zeros, so Y and Δ stay zero there.
//
// Question rows (GdnArgs::short_seqs without state_out: every sequence one chunk, all from the same
// read-only S₀; Kev's cached evaluation) whose recurrence grid would need more than two waves of two
// blocks per SM (rows_pass; the 4B's 6 rows: 768 blocks on 132 SMs): two other kernels. With one chunk
// per sequence nothing is carried to a next chunk, so the state enters only through one product. With
// X = P L⁻¹ (lower triangular):
//   O = diag(γ) Q S₀ + P L⁻¹ diag(β)(V − diag(γ) K S₀) = Q̃ S₀ + Ṽ,
//   Q̃ = diag(γ) Q − X diag(βγ) K,  Ṽ = X diag(β) V,
// where Q̃ and Ṽ need no state. X L = P is solved by 16-row bands i, which are independent (row i of X
// needs only row i of P), and in each band by 16-column blocks b from the diagonal down:
//   X_ib = (P_ib − Σ_{b<c<=i} X_ic M_cb) T_b, T_b = L_bb⁻¹ as above.
// (1) gdn_rows_kernel: grid (max_chunks, Hv, nv), nv = ceil(dv / 128), 256 threads, two blocks per SM
// (118 registers). Block (c, h, z) stages chunk c's Q and K rows by cp.async, forms Q Kᵀ and K Kᵀ (20
// pairs of m16n8 tiles, P's and M's sharing each B fragment; warp w: pairs w, w+8, w+16) and P, M with
// the decays in shared memory (over the dead Q; M_bb aside, inverted in double into M's diagonal),
// solves X (warp i: band i, warp-level syncs only) and multiplies X diag(s) B, s scaling B's rows as its
// fragments are read (warp w: 16 output columns, band by band, k up to the band's diagonal block):
// first, from a state and z = 0, B = K, s = βγ, Q̃ = γQ − ... written to the workspace [Hv, n_tokens,
// dk] (head-major, so that a head's rows are contiguous; the γQ terms come from global memory one band
// ahead, band 0's while X is solved); then B = V columns 128z.. (fetched into registers while X and Q̃
// are formed, stored over K after Q̃'s product), s = β, Ṽ written to out. From the zero state O = Ṽ
// and nothing else runs. One block forms both Q̃ and Ṽ: a Q̃ block and a Ṽ block per (row, head),
// each forming P, M and X (V staged over K at once, three blocks per SM, 80 registers), timed slower
// (2026-12-02, H200: 4B 6 × 37 rows 34.4 / 33.6 against 32.0 / 31.7 µs, 0.8B 32.4 / 31.4 against
// 30.5 / 30.4). Shared memory: Q (then P [64, 68] and M [64, 72]), K (then V [64, 136]), the four M_bb,
// Γ, γ, β and βγ: 74.3 KiB at dk = 128. The grid depends on dv, Hv, n_tokens and n_seqs only.
// (2) gdn_rows_state_kernel: out += Q̃ S₀ for all the pass's tokens at once (S₀ is shared, so the rows
// need not be told apart): grid (ceil(dv / 32), ceil(n_tokens / 64), Hv), 256 threads (warp w: rows
// 16·(w % 4).., columns 16·(w / 4).. of a 64 × 32 output tile; dk k-steps as [Q;K]·S₀ above), four
// blocks per SM (53 KiB: Q̃ tile and S₀ slice). On sm_90 it is gdn_rows_kernel's programmatic dependent
// launch: it stages its S₀ slice, then waits (griddepcontrol.wait) before reading Q̃ and Ṽ.
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

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_tf32.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gated_delta_rule.cu needs sm_80 or newer (mma.sync .tf32): set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

namespace kev::cuda {

namespace {

constexpr int kChunk = kGdnChunkTokens;
constexpr int kSlice = 32;    // state columns (of dv) per block; kNarrow in a long pass with few blocks
constexpr int kNarrow = 16;
constexpr int kThreads = 256;
constexpr int kMaxGridYZ = 65535;
// Most products one tensor-core accumulator sums from zero (64 dimensions): the FP32 accumulation
// inside mma truncates, so longer sums are flushed into an FP32 register sum.
constexpr int kRun = 64;

// Floats between the 16×16 diagonal blocks M_bb that the products kernel inverts: ≡ 4 (mod 32), so
// that the two blocks one warp reads sit in different banks.
constexpr int kDiagPitch = 16 * 16 + 4;

constexpr int cmax(int x, int y) { return x > y ? x : y; }

static_assert(kChunk == 64 && kThreads == 256, "the warp tilings below assume C = 64 and 8 warps");

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

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Programmatic dependent launch (sm_90; the launcher uses it for short passes): the products kernel
// (or the rows kernel) lets the recurrence kernel (the rows' state product) start at once, and that
// waits here, before its first read of what the first wrote, for it to finish (memory included).
// Without it both are no-ops.
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_products() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
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

// Global index of sequence r's first chunk: r + offsets[r] / C, found in O(1). The sequences' ranges
// never overlap, since ceil(len_r / C) <= len_r / C + 1 and offsets[r] / C + len_r / C <=
// offsets[r + 1] / C (integer division); each sequence leaves a gap of at most one index.
__device__ __forceinline__ int first_chunk(const int32_t* offsets, int r) { return r + offsets[r] / kChunk; }

// The sequence whose chunk range may hold global chunk c: the last r with first_chunk(r) <= c
// (first_chunk increases strictly with r, so a binary search finds it).
__device__ __forceinline__ int chunk_seq(const int32_t* offsets, int n_seqs, int c) {
  int lo = 0, hi = n_seqs;  // invariant: first_chunk(lo) <= c < first_chunk(hi), first_chunk(n_seqs) = ∞
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (first_chunk(offsets, mid) <= c) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The device's compute capability major and SM count, asked once per process.
struct DeviceTraits {
  int major = 0, sms = 0;
};
const DeviceTraits& device_traits() {
  static const DeviceTraits traits = [] {
    DeviceTraits d;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return DeviceTraits{};
    }
    return d;
  }();
  return traits;
}

// A pass of question rows (every sequence one chunk, no final state) takes the rows kernels when the
// recurrence's 32-column grid would need more than two waves of two blocks per SM (the 4B's 6 rows:
// 768 blocks on the H200's 132 SMs; its rows kernel runs 192 blocks in one wave). Below that the
// products kernel and the recurrence measured faster (0.8B, 6 rows, 384 blocks: 27.2 against 30.4 µs;
// docs/backends.md). Depends on shapes, n_seqs and the SM count only (CUDA graph replay).
bool rows_pass(const GdnArgs& a) {
  if (!a.short_seqs || a.state_out != nullptr) return false;
  const int64_t recurrence_blocks = static_cast<int64_t>((a.dv + kSlice - 1) / kSlice) * a.Hv * a.n_seqs;
  return recurrence_blocks > 4 * static_cast<int64_t>(device_traits().sms);
}

// Chunk indices of a pass: the last sequence's range ends at or before n_seqs + n_tokens / C.
int64_t max_chunks(const GdnArgs& a) {
  return a.n_tokens > 0 ? static_cast<int64_t>(a.n_seqs) + a.n_tokens / kChunk : 0;
}

// Rows [0, kRows) × columns [0, kCols) of a row-major global tile (row stride ld) into shared memory
// (row pitch ldd) by cp.async, not waited for: element (i, j) is copied when i < live_rows and
// j < live_cols and written as zero otherwise. vec: 16-byte copies (src rows 16-byte aligned,
// live_cols % 4 == 0); else 4-byte ones. src must be a valid address even when nothing is live.
// Vector path: thread tid copies one column group of rows i0, i0 + kStep, ...: its addresses advance
// by constant strides, a few instructions a copy (a loop over idx = tid + u·kThreads with per-copy
// index math cost ~30, a quarter of the recurrence kernel's issued instructions in short passes).
template <int kRows, int kCols>
__device__ __forceinline__ void stage_tile(float* dst, int ldd, const float* src, int64_t ld, int live_rows,
                                           int live_cols, bool vec, int tid) {
  if (vec) {
    constexpr int kPerRow = kCols / 4, kStep = kThreads / kPerRow;
    static_assert(kThreads % kPerRow == 0 && kRows % kStep == 0, "each pass covers whole rows");
    const int i0 = static_cast<unsigned>(tid) / kPerRow, j = 4 * (static_cast<unsigned>(tid) % kPerRow);
    const float* s = src + i0 * ld + j;
    float* d = dst + i0 * ldd + j;
    const int64_t step = kStep * ld;
    const bool col_live = j < live_cols;
#pragma unroll
    for (int u = 0; u < kRows / kStep; ++u) {
      const bool live = col_live && i0 + u * kStep < live_rows;
      cp_async<16>(d + u * kStep * ldd, live ? s + u * step : src, live);
    }
  } else {
    for (int idx = tid; idx < kRows * kCols; idx += kThreads) {
      const int i = idx / kCols, j = idx % kCols;
      const bool live = i < live_rows && j < live_cols;
      cp_async<4>(dst + i * ldd + j, live ? src + i * ld + j : src, live);
    }
  }
}

// Row and column block (bi, bj) of lower 16×16 block blk, numbered row by row: (0,0), (1,0), (1,1), ...
__device__ __forceinline__ void lower_block(int blk, int& bi, int& bj) {
  bi = blk < 1 ? 0 : blk < 3 ? 1 : blk < 6 ? 2 : 3;
  bj = blk - bi * (bi + 1) / 2;
}

// acc[m] += rows 16·bi.. of A_m times rows col0.. of K, transposed (one m16n8 tile of A_m Kᵀ over DK
// dimensions; A_m and K row-major with pitch DK + 4) for the NM matrices A_m, each B fragment read and
// split once for all of them; 3xTF32, the big accumulators flushed every kRun.
template <int DK, int NM>
__device__ __forceinline__ void product_tile(const float* const (&As)[NM], const float* Ks, int bi, int col0, int g,
                                             int t, float (&acc)[NM][4]) {
  constexpr int LQK = DK + 4;
  const float* brow = Ks + (col0 + g) * LQK + t;
  float lh[NM][4] = {}, hl[NM][4] = {};
#pragma unroll
  for (int kb = 0; kb < DK; kb += kRun) {
    float big[NM][4] = {};
#pragma unroll
    for (int k0 = kb; k0 < kb + kRun && k0 < DK; k0 += 8) {
      uint32_t bh[2], bl[2];
      load_b(brow + k0, 4, bh, bl);  // B = Kᵀ: b0 = K[j][k0 + t], b1 = K[j][k0 + t + 4]
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        uint32_t ah[4], al[4];
        load_a(As[m] + 16 * bi * LQK + k0, LQK, g, t, ah, al);
        mma_3xtf32(big[m], lh[m], hl[m], ah, al, bh, bl);
      }
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][e] += big[m][e];
    }
  }
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[m][e] += lh[m][e] + hl[m][e];
  }
}

// Column col of T = (I + M_bb)⁻¹ (M_bb: 16×16 strictly lower, row-major at mb) by forward substitution
// in double, rows < rows written to dst[i·ld] (x_i = 0 above col comes out by itself).
__device__ __forceinline__ void invert_column(const float* mb, int col, int rows, float* dst, int ld) {
  double x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (i >= rows) break;
    double xi = i == col ? 1.0 : 0.0;
#pragma unroll
    for (int m = 0; m < i; ++m) xi -= static_cast<double>(mb[i * 16 + m]) * x[m];
    x[i] = xi;
    dst[i * ld + col] = static_cast<float>(xi);
  }
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
  release_dependents();
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
    const int tile = warp + 8 * u;
    int bi, bj;
    lower_block(tile >> 1, bi, bj);
    // Rows past cn are zero padding (and bj <= bi): a block starting there is all zero.
    if (tile >= 20 || 16 * bi >= cn) continue;
    product_tile<DK, 1>(A, Ks, bi, 16 * bj + 8 * (tile & 1), g, t, acc[u]);
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
#pragma unroll
    for (int u = 0; u < 3; ++u) {
      const int tile = warp + 8 * u;
      if (tile >= 20) continue;
      int bi, bj;
      lower_block(tile >> 1, bi, bj);
      const int j = 16 * bj + 8 * (tile & 1) + 2 * t;
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

// x[m] += A_m S₀ for the NM matrices A_m (the recurrence: Q and K; the rows' state product: Q̃) on
// one warp's tiles: rows mrow.. (16) of each A_m (row pitch DK + 4) times columns ncol.. (NT n8 tiles)
// of the S₀ copy (row pitch SL + 8), 3xTF32, the big accumulators flushed into x every kRun
// dimensions. Each B fragment is read and split once for all matrices, and the warp keeps 3·NM·NT
// independent accumulators in flight. (Q S₀ and K S₀ one after the other, P and M arriving by cp.async
// between them in place of the registers below, spilled nothing but timed slower: H200, 6 × 37 rows,
// 4B 49.9 against 48.2 µs, 0.8B 32.2 against 29.4.)
template <int DK, int SL, int NM, int NT = SL / 16>
__device__ __forceinline__ void times_state(const float* const (&As)[NM], const float* Ss, int mrow, int ncol, int g,
                                            int t, float (&x)[NM][NT][4]) {
  constexpr int LQK = DK + 4, LS = SL + 8;
  float lh[NM][NT][4] = {}, hl[NM][NT][4] = {};
#pragma unroll
  for (int kb = 0; kb < DK; kb += kRun) {
    float big[NM][NT][4] = {};
#pragma unroll
    for (int k0 = kb; k0 < kb + kRun && k0 < DK; k0 += 8) {
      uint32_t ah[NM][4], al[NM][4];
#pragma unroll
      for (int m = 0; m < NM; ++m) load_a(As[m] + mrow * LQK + k0, LQK, g, t, ah[m], al[m]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t bh[2], bl[2];
        load_b(Ss + (k0 + t) * LS + ncol + 8 * n + g, 4 * LS, bh, bl);
#pragma unroll
        for (int m = 0; m < NM; ++m) mma_3xtf32(big[m][n], lh[m][n], hl[m][n], ah[m], al[m], bh, bl);
      }
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[m][n][e] += big[m][n][e];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[m][n][e] += lh[m][n][e] + hl[m][n][e];
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

// kAhead: a long sequence: the next chunk's q/k/v are fetched into registers during this one, and
// the kernel is compiled for one block per SM (up to 255 registers). Without it (every sequence one
// chunk, GdnArgs::short_seqs) the chunk's q/k/v are copied by cp.async together with the state, and
// two blocks share an SM.
template <int DK, bool kAhead, int SL>
__global__ void __launch_bounds__(kThreads, kAhead ? 1 : 2) gdn_chunked_kernel(GdnArgs a, bool vec,
                                                                               const float* products) {
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
  // column 8·(sn0 + u) + 2t + e % 2). It arrives by cp.async; in a short pass so do the sequence's one
  // chunk of q, k and the v slice (zero past the sequence end), so that all of the block's loads are in
  // flight at once and hold no registers.
  const int sm0 = 16 * (warp * TPW / (SL / 8)), sn0 = warp * TPW % (SL / 8);
  const int64_t state_base = static_cast<int64_t>(h) * DK * dv;
  stage_tile<DK, SL>(Ss, LS, a.state_in != nullptr ? a.state_in + state_base + c0 : a.v, dv,
                         a.state_in != nullptr ? DK : 0, dv - c0, vec, tid);
  if constexpr (!kAhead) {
    if (begin < end) {
      const int cn = min(kChunk, end - begin);
      const int64_t qk0 = static_cast<int64_t>(begin) * a.qk_token_stride + static_cast<int64_t>(kh) * DK;
      stage_tile<kChunk, DK>(Qs, LQK, a.q + qk0, a.qk_token_stride, cn, DK, vec, tid);
      stage_tile<kChunk, DK>(Ks, LQK, a.k + qk0, a.qk_token_stride, cn, DK, vec, tid);
      stage_tile<kChunk, SL>(Rs, LV, a.v + static_cast<int64_t>(begin) * a.v_token_stride + static_cast<int64_t>(h) * dv + c0,
                                 a.v_token_stride, cn, dv - c0, vec, tid);
    }
  }
  cp_async_commit();
  bool state_zero = a.state_in == nullptr;  // S₀ == 0 exactly: skip the S₀ products

  // Long sequences, vector path: a chunk's q/k/v rows are fetched into registers one chunk ahead
  // (issued before the substitution, stored at the next chunk's start), so their latency overlaps the
  // substitution and the output / state phases. Rows past the sequence end are zero. (The scalar path
  // loads in place.)
  constexpr int kQK4 = kAhead ? kChunk * DK / 4 / kThreads : 1, kV4 = kAhead ? kChunk * SL / 4 / kThreads : 1;
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
    if constexpr (kAhead) {
      if (vec) fetch(begin);
    }
    if (warp == 0) fetch_gates(a, h, begin, end, lane, gate);
  }

  // Tensor-core tiles of the per-chunk products: warp w covers rows mrow.. (16) of Q, K, P and the
  // output, columns ncol.. (16, two n8 tiles) of the slice.
  const int mrow = 16 * (warp & 3), ncol = SL / 2 * (warp >> 2);

  for (int t0 = begin; t0 < end; t0 += kChunk) {
    const int cn = min(kChunk, end - t0);
    __syncthreads();  // the previous chunk's readers of K, Δ and P are done

    // ---- load the chunk (zero padded to kChunk rows) ----
    if constexpr (kAhead) {
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
    }
    cp_async_wait_all();  // the state (first chunk); in a short pass also the chunk's q/k/v
    if (warp == 0) scan_gates(gate, lane, Gam, gam, bet);
    __syncthreads();

    // ---- this chunk's P and M (gdn_chunk_products_kernel) into registers; [Q;K]·S₀ ----
    // Read as the products kernel writes them (mp_slot: rows past cn zero, blocks above the diagonal
    // never read); the loads overlap [Q;K]·S₀, and they are stored over Q once it is dead. A short pass
    // runs as the products kernel's dependent launch (sm_90) and waits for it here.
    const float* src =
        products + (static_cast<int64_t>(chunk0 + (t0 - begin) / kChunk) * a.Hv + h) * 2 * kChunk * kChunk;
    if constexpr (!kAhead) wait_for_products();
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
      if constexpr (kAhead) {
        if (vec) fetch(t0 + kChunk);
      }
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


// ---- question rows: every sequence one chunk, no state_out (GdnArgs::short_seqs) ----

// Columns of dv per block of the rows kernel (each block's Ṽ slice; Q̃'s dk <= 128 as well).
constexpr int kRowsCols = 128;
// Output columns per block of the rows' state product.
constexpr int kRowsSlice = 32;

template <int DK>
struct GdnRowsLayout {
  static constexpr int kLdQK = DK + 4;         // Q, K rows (A fragments, and K's B fragments of Kᵀ)
  static constexpr int kLdP = kChunk + 4;      // P, then X, rows (A fragments)
  static constexpr int kLdM = kChunk + 8;      // M and T_b rows (B fragments)
  static constexpr int kLdV = kRowsCols + 8;   // V slice rows (B fragments)
  // Regions in floats after the double Γ[kChunk] block. Q is dead once its products are in registers,
  // so P and M are stored over it; the V slice goes over K once Q̃'s product is done with it.
  static constexpr int kQ = 0;
  static constexpr int kP = 0;
  static constexpr int kM = kP + kChunk * kLdP;
  static constexpr int kK = cmax(kChunk * kLdQK, kM + kChunk * kLdM);
  static constexpr int kV = kK;
  static constexpr int kDiag = kK + cmax(kChunk * kLdQK, kChunk * kLdV);  // the 4 blocks M_bb while inverted
  static constexpr int kGam = kDiag + 4 * kDiagPitch;
  static constexpr int kBeta = kGam + kChunk;
  static constexpr int kScale = kBeta + kChunk;  // βγ, the row scale of K in Q̃
  static constexpr int kFloats = kScale + kChunk;
  static constexpr size_t kBytes = kChunk * sizeof(double) + kFloats * sizeof(float);
  static_assert(kM % 4 == 0 && kK % 4 == 0 && kDiag % 4 == 0, "float4 alignment");
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

template <int DK>
struct GdnRowsStateLayout {
  static constexpr int kLdQ = DK + 4;           // Q̃ rows (A fragments)
  static constexpr int kLdS = kRowsSlice + 8;   // S₀ slice rows (B fragments)
  static constexpr int kS = kChunk * kLdQ;
  static constexpr size_t kBytes = (kS + DK * kLdS) * sizeof(float);
  static_assert(kS % 4 == 0, "float4 alignment");
};

// The state-independent part of a pass of question rows (see the header comment): block (c, h, z)
// takes chunk c (one whole sequence) and value head h, forms P, M and T_b in shared memory, solves
// X L = P, and writes Q̃ = diag(γ) Q − X diag(βγ) K to qt[h][token] (z = 0, only from a state), then
// Ṽ = X diag(β) V, columns kRowsCols·z.. of dv, to out. Blocks past the pass's last chunk return at
// once.
template <int DK>
__global__ void __launch_bounds__(kThreads, 2) gdn_rows_kernel(GdnArgs a, bool vec, float* qt) {
  using Lay = GdnRowsLayout<DK>;
  constexpr int LQK = Lay::kLdQK, LP = Lay::kLdP, LM = Lay::kLdM, LV = Lay::kLdV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* Gam = reinterpret_cast<double*>(smem_raw);
  float* base = reinterpret_cast<float*>(Gam + kChunk);
  float* Qs = base + Lay::kQ;
  float* Ps = base + Lay::kP;  // P, then Y and X block by block (in place)
  float* Ms = base + Lay::kM;
  float* Ks = base + Lay::kK;
  float* Vs = base + Lay::kV;
  float* Mdiag = base + Lay::kDiag;
  float* gam = base + Lay::kGam;
  float* bet = base + Lay::kBeta;
  float* scl = base + Lay::kScale;
  release_dependents();  // the state product may start staging S₀ (it waits for this grid before reading qt/out)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int c = blockIdx.x, h = blockIdx.y;
  const bool with_q = a.state_in != nullptr && blockIdx.z == 0;  // this block forms Q̃ too
  const int c0 = kRowsCols * blockIdx.z, vcols = min(kRowsCols, a.dv - c0);
  const int r = chunk_seq(a.offsets, a.n_seqs, c), end = a.offsets[r + 1];
  const int t0 = a.offsets[r] + (c - first_chunk(a.offsets, r)) * kChunk;
  if (t0 >= end) return;  // a gap in the numbering, or past the pass's last chunk
  const int cn = min(kChunk, end - t0), kh = h / (a.Hv / a.Hk);
  const int64_t row0 = static_cast<int64_t>(t0) * a.qk_token_stride + static_cast<int64_t>(kh) * DK;
  stage_tile<kChunk, DK>(Qs, LQK, a.q + row0, a.qk_token_stride, cn, DK, vec, tid);
  stage_tile<kChunk, DK>(Ks, LQK, a.k + row0, a.qk_token_stride, cn, DK, vec, tid);
  cp_async_commit();
  if (warp == 0) {
    float gate[4];
    fetch_gates(a, h, t0, end, lane, gate);
    scan_gates(gate, lane, Gam, gam, bet);
  }
  cp_async_wait_all();
  __syncthreads();

  // ---- Q Kᵀ and K Kᵀ: 20 pairs of m16n8 tiles (the 10 lower 16×16 blocks, two column halves each; P's
  // tile and M's share each B fragment); warp w: pairs w, w + 8, w + 16. Blocks starting at or past cn
  // are zero padding and never read. ----
  float acc[3][2][4] = {};
  const float* const qk[2] = {Qs, Ks};
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int tile = warp + 8 * u;
    int bi, bj;
    lower_block(tile >> 1, bi, bj);
    if (tile >= 20 || 16 * bi >= cn) continue;
    product_tile<DK, 2>(qk, Ks, bi, 16 * bj + 8 * (tile & 1), g, t, acc[u]);
  }
  __syncthreads();  // Q is dead (K stays for Q̃)
  // P_ij = (q_i·k_j) D_ij (j <= i), M_ij = β_i (k_i·k_j) D_ij (j < i); M_bb goes to Mdiag for the inversion.
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int tile = warp + 8 * u;
    int bi, bj;
    lower_block(tile >> 1, bi, bj);
    if (tile >= 20 || 16 * bi >= cn) continue;
    const int j = 16 * bj + 8 * (tile & 1) + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * bi + g + 8 * half;
      const double gi = Gam[i];
      float p[2], m[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float d = expf(static_cast<float>(gi - Gam[j + e]));
        p[e] = j + e <= i ? acc[u][0][2 * half + e] * d : 0.0f;
        m[e] = j + e < i ? acc[u][1][2 * half + e] * d * bet[i] : 0.0f;
      }
      *reinterpret_cast<float2*>(Ps + i * LP + j) = make_float2(p[0], p[1]);
      *reinterpret_cast<float2*>(bi == bj ? Mdiag + bi * kDiagPitch + (i - 16 * bi) * 16 + j - 16 * bj : Ms + i * LM + j) =
          make_float2(m[0], m[1]);
    }
  }
  if (tid < kChunk) scl[tid] = bet[tid] * gam[tid];
  __syncthreads();
  // T_b = (I + M_bb)⁻¹ into M's diagonal block b, all 16 rows (rows past cn are those of I: finite, as
  // the products below need).
  if (tid < 4 * 16 && 16 * (tid >> 4) < cn) {
    const int b = tid >> 4;
    invert_column(Mdiag + b * kDiagPitch, tid & 15, 16, Ms + 16 * b * (LM + 1), LM);
  }
  __syncthreads();

  // Q̃'s γQ terms, band by band (this thread's output elements below): band 0's fetched while X is
  // solved, each next band's during the current band's product.
  const int ncol = 16 * warp;  // the final products: warp w owns columns 16w.. (two n8 tiles)
  const bool fetch_q = with_q && ncol < DK;
  auto load_q = [&](int bnd, float2 (&qv)[2][2]) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * bnd + g + 8 * half, col = ncol + 8 * n + 2 * t;
        qv[n][half] = make_float2(0.0f, 0.0f);
        if (i < cn) {
          const float* src = a.q + static_cast<int64_t>(t0 + i) * a.qk_token_stride + static_cast<int64_t>(kh) * DK + col;
          qv[n][half] = vec ? *reinterpret_cast<const float2*>(src) : make_float2(src[0], src[1]);
        }
      }
    }
  };
  float2 qnext[2][2];
  if (fetch_q) load_q(0, qnext);
  // The V slice's rows (zero past cn and dv) into registers while X and Q̃ are formed; they go to shared
  // memory over K once Q̃'s product is done with it.
  constexpr int kV4 = kChunk * kRowsCols / 4 / kThreads;
  float4 vr[kV4];
#pragma unroll
  for (int u = 0; u < kV4; ++u) {
    const int idx = tid + u * kThreads, i = idx / (kRowsCols / 4), cc = 4 * (idx % (kRowsCols / 4));
    vr[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < cn && cc < vcols) {
      const float* src = a.v + static_cast<int64_t>(t0 + i) * a.v_token_stride + static_cast<int64_t>(h) * a.dv + c0 + cc;
      if (vec) {
        vr[u] = ld4(src);  // dv % 4 == 0 here, so the whole float4 is inside the row
      } else {
        vr[u].x = src[0];
        if (cc + 1 < vcols) vr[u].y = src[1];
        if (cc + 2 < vcols) vr[u].z = src[2];
        if (cc + 3 < vcols) vr[u].w = src[3];
      }
    }
  }

  // ---- X L = P, 16-row bands i (each on its own: warp i), 16-column blocks b from the diagonal down:
  // X_ib = (P_ib − Σ_{b<c<=i} X_ic M_cb) T_b, Y and then X over P_ib in place. ----
  if (warp < 4 && 16 * warp < cn) {
    const int bnd = warp;
    float* xr = Ps + 16 * bnd * LP;  // the band's rows
#pragma unroll
    for (int b = 3; b >= 0; --b) {
      if (b > bnd) continue;
      float big[2][4] = {}, lh[2][4] = {}, hl[2][4] = {};
#pragma unroll
      for (int k0 = 16 * (b + 1); k0 < 64; k0 += 8) {  // Σ X_ic M_cb: at most 48 products (kRun)
        if (k0 >= 16 * (bnd + 1)) break;
        uint32_t ah[4], al[4];
        load_a(xr + k0, LP, g, t, ah, al);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t bh[2], bl[2];
          load_b(Ms + (k0 + t) * LM + 16 * b + 8 * n + g, 4 * LM, bh, bl);
          mma_3xtf32(big[n], lh[n], hl[n], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          xr[(g + 8 * (e >> 1)) * LP + 16 * b + 8 * n + 2 * t + (e & 1)] -= big[n][e] + (lh[n][e] + hl[n][e]);
        }
      }
      __syncwarp();
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) big[n][e] = lh[n][e] = hl[n][e] = 0.0f;
      }
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {  // Y T_b
        uint32_t ah[4], al[4];
        load_a(xr + 16 * b + k0, LP, g, t, ah, al);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t bh[2], bl[2];
          load_b(Ms + (16 * b + k0 + t) * LM + 16 * b + 8 * n + g, 4 * LM, bh, bl);
          mma_3xtf32(big[n], lh[n], hl[n], ah, al, bh, bl);
        }
      }
      __syncwarp();  // every lane has read Y_ib
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          xr[(g + 8 * (e >> 1)) * LP + 16 * b + 8 * n + 2 * t + (e & 1)] = big[n][e] + (lh[n][e] + hl[n][e]);
        }
      }
      __syncwarp();  // X_ib is visible to the band's next blocks
    }
  }
  __syncthreads();

  // ---- X diag(s) B for B = K (Q̃, s = βγ) and then V (Ṽ, s = β): band by band, k up to the band's
  // diagonal block (X is lower triangular); s scales B's rows as its fragments are read. ----
  auto x_times = [&](const float* B, int LB, const float* s, int ncols, bool is_q) {
    if (ncol >= ncols) return;
#pragma unroll 1
    for (int bnd = 0; bnd < 4 && 16 * bnd < cn; ++bnd) {
      float2 qv[2][2];
      if (is_q) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int half = 0; half < 2; ++half) qv[n][half] = qnext[n][half];
        }
        if (bnd + 1 < 4) load_q(bnd + 1, qnext);
      }
      float big[2][4] = {}, lh[2][4] = {}, hl[2][4] = {};
      for (int k0 = 0; k0 < 16 * (bnd + 1); k0 += 8) {
        uint32_t ah[4], al[4];
        load_a(Ps + 16 * bnd * LP + k0, LP, g, t, ah, al);
        const float s0 = s[k0 + t], s1 = s[k0 + t + 4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float* bp = B + (k0 + t) * LB + ncol + 8 * n + g;
          uint32_t bh[2], bl[2];
          split_tf32(bp[0] * s0, bh[0], bl[0]);
          split_tf32(bp[4 * LB] * s1, bh[1], bl[1]);
          mma_3xtf32(big[n], lh[n], hl[n], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int col = ncol + 8 * n + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * bnd + g + 8 * half;
          if (i >= cn) continue;
          float o[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) o[e] = big[n][2 * half + e] + (lh[n][2 * half + e] + hl[n][2 * half + e]);
          if (is_q) {
            // Q̃ = γQ − X diag(βγ) K; DK is even, so both columns are inside the row.
            const float gi = gam[i];
            *reinterpret_cast<float2*>(qt + (static_cast<int64_t>(h) * a.n_tokens + t0 + i) * DK + col) =
                make_float2(fmaf(gi, qv[n][half].x, -o[0]), fmaf(gi, qv[n][half].y, -o[1]));
          } else {
            float* dst =
                a.out + static_cast<int64_t>(t0 + i) * a.out_token_stride + static_cast<int64_t>(h) * a.dv + c0 + col;
            if (vec) {
              if (col < ncols) *reinterpret_cast<float2*>(dst) = make_float2(o[0], o[1]);
            } else {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                if (col + e < ncols) dst[e] = o[e];
              }
            }
          }
        }
      }
    }
  };
  if (with_q) {
    x_times(Ks, LQK, scl, DK, true);
    __syncthreads();  // K's readers are done
  }
#pragma unroll
  for (int u = 0; u < kV4; ++u) {
    const int idx = tid + u * kThreads, i = idx / (kRowsCols / 4), cc = 4 * (idx % (kRowsCols / 4));
    *reinterpret_cast<float4*>(Vs + i * LV + cc) = vr[u];
  }
  __syncthreads();
  x_times(Vs, LV, bet, vcols, false);
}

// out[t, h, :] += Q̃[h][t] · S₀[h] for the rows' tokens (see the header comment): block (x, y, h)
// takes tokens 64·y.. and state columns kRowsSlice·x.. of value head h. The S₀ slice is staged before
// waiting for gdn_rows_kernel (a programmatic dependent launch on sm_90), Q̃ and Ṽ (in out) after.
template <int DK>
__global__ void __launch_bounds__(kThreads, 4) gdn_rows_state_kernel(GdnArgs a, bool vec, const float* qt) {
  using Lay = GdnRowsStateLayout<DK>;
  constexpr int LQ = Lay::kLdQ, LS = Lay::kLdS, NT = kRowsSlice / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* Qt = reinterpret_cast<float*>(smem_raw);
  float* Ss = Qt + Lay::kS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int c0 = kRowsSlice * blockIdx.x, tok0 = kChunk * blockIdx.y, h = blockIdx.z, dv = a.dv;
  const int rows = min(kChunk, a.n_tokens - tok0);
  stage_tile<DK, kRowsSlice>(Ss, LS, a.state_in + static_cast<int64_t>(h) * DK * dv + c0, dv, DK, dv - c0, vec, tid);
  cp_async_commit();
  wait_for_products();
  stage_tile<kChunk, DK>(Qt, LQ, qt + (static_cast<int64_t>(h) * a.n_tokens + tok0) * DK, DK, rows, DK, true, tid);
  cp_async_commit();
  // Warp w: rows mrow.. (16), columns ncol.. (two n8 tiles); Ṽ of its elements, then the product.
  const int mrow = 16 * (warp & 3), ncol = kRowsSlice / 2 * (warp >> 2);
  float o[1][NT][4] = {};
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = mrow + g + 8 * (e >> 1), col = c0 + ncol + 8 * n + 2 * t + (e & 1);
      if (i < rows && col < dv) {
        o[0][n][e] = a.out[static_cast<int64_t>(tok0 + i) * a.out_token_stride + static_cast<int64_t>(h) * dv + col];
      }
    }
  }
  cp_async_wait_all();
  __syncthreads();
  if (mrow >= rows) return;
  const float* const qs[1] = {Qt};
  times_state<DK, kRowsSlice, 1>(qs, Ss, mrow, ncol, g, t, o);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int col = c0 + ncol + 8 * n + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = mrow + g + 8 * half;
      if (i >= rows) continue;
      float* dst = a.out + static_cast<int64_t>(tok0 + i) * a.out_token_stride + static_cast<int64_t>(h) * dv + col;
      if (vec) {
        if (col < dv) *reinterpret_cast<float2*>(dst) = make_float2(o[0][n][2 * half], o[0][n][2 * half + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (col + e < dv) dst[e] = o[0][n][2 * half + e];
        }
      }
    }
  }
}

// float4 loads of q/k/v rows and stores of out rows need 16-byte aligned rows and dv % 4 == 0 (a
// slice's float4 column groups then never straddle the end of a row); the state slice's 16-byte copies
// need state_in aligned too.
bool vectorizable(const GdnArgs& a) {
  return aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) && aligned16(a.state_in) &&
         a.qk_token_stride % 4 == 0 && a.v_token_stride % 4 == 0 && a.out_token_stride % 4 == 0 && a.dv % 4 == 0;
}


template <int DK, bool kAhead, int SL>
cudaError_t launch_recurrence(const GdnArgs& a, bool vec, const float* products, bool dependent,
                              cudaStream_t stream) {
  constexpr size_t bytes = GdnLayout<DK, SL>::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      gdn_chunked_kernel<DK, kAhead, SL>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  cudaLaunchAttribute attrs[1] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((a.dv + SL - 1) / SL, a.Hv, a.n_seqs);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = dependent ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, gdn_chunked_kernel<DK, kAhead, SL>, a, vec, products);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Question rows (rows_pass): gdn_rows_kernel, then, from a state, gdn_rows_state_kernel as its
// programmatic dependent launch where the GPU allows it (sm_90). Both grids depend only on dv, Hv,
// n_tokens, n_seqs and whether there is a state.
template <int DK>
cudaError_t launch_rows(const GdnArgs& a, float* qt, cudaStream_t stream) {
  constexpr size_t bytes = GdnRowsLayout<DK>::kBytes, state_bytes = GdnRowsStateLayout<DK>::kBytes;
  static const cudaError_t attr = [] {
    const cudaError_t e = cudaFuncSetAttribute(gdn_rows_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(gdn_rows_state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(state_bytes));
  }();
  if (attr != cudaSuccess) return attr;
  const bool vec = vectorizable(a), from_state = a.state_in != nullptr;
  const int nv = (a.dv + kRowsCols - 1) / kRowsCols;
  gdn_rows_kernel<DK><<<dim3(static_cast<unsigned>(max_chunks(a)), a.Hv, nv), kThreads, bytes,
                        stream>>>(a, vec, qt);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !from_state) return err;
  cudaLaunchAttribute attrs[1] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((a.dv + kRowsSlice - 1) / kRowsSlice, (a.n_tokens + kChunk - 1) / kChunk, a.Hv);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = state_bytes;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = device_traits().major >= 9 ? 1 : 0;
  err = cudaLaunchKernelEx(&cfg, gdn_rows_state_kernel<DK>, a, vec, static_cast<const float*>(qt));
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Opts the kernels into their dynamic shared memory once per process (before any graph capture that
// launches them, since the first launch happens eagerly); the result is remembered. Question rows with
// many blocks (rows_pass) take launch_rows. Another short pass's recurrence is launched as the
// products kernel's programmatic dependent where the GPU allows it (sm_90, griddepcontrol): it stages
// its state and q/k/v while the products kernel still runs (see wait_for_products). A long pass whose
// 32-column slices would leave over half the SMs idle (the 0.8B prefill: 4 × 16 blocks) walks
// 16-column slices, twice the blocks, each with half the work per chunk.
template <int DK>
cudaError_t launch_dk(const GdnArgs& a, float* products, cudaStream_t stream) {
  if (rows_pass(a)) return max_chunks(a) > 0 ? launch_rows<DK>(a, products, stream) : cudaSuccess;
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
  const DeviceTraits& dev = device_traits();
  const bool dependent = chunks > 0 && a.short_seqs && dev.major >= 9;
  const int64_t wide_blocks = static_cast<int64_t>((a.dv + kSlice - 1) / kSlice) * a.Hv * a.n_seqs;
  if constexpr (DK >= 64) {
    if (!a.short_seqs && 2 * wide_blocks <= dev.sms) {
      return launch_recurrence<DK, true, kNarrow>(a, vec, products, dependent, stream);
    }
  }
  return a.short_seqs ? launch_recurrence<DK, false, kSlice>(a, vec, products, dependent, stream)
                      : launch_recurrence<DK, true, kSlice>(a, vec, products, dependent, stream);
}

}  // namespace

bool gated_delta_rule_supported(int Hk, int Hv, int dk, int dv) {
  return Hk >= 1 && Hv >= Hk && Hv % Hk == 0 && Hv <= kMaxGridYZ && (dk == 32 || dk == 64 || dk == 128) && dv >= 1;
}

size_t gated_delta_rule_workspace_bytes(const GdnArgs& a) {
  if (a.n_seqs < 1 || a.n_tokens < 0 || a.Hv < 1) return 0;
  if (rows_pass(a)) {  // Q̃, [Hv, n_tokens, dk]
    return static_cast<size_t>(a.n_tokens) * static_cast<size_t>(a.Hv) * static_cast<size_t>(a.dk) * sizeof(float);
  }
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
