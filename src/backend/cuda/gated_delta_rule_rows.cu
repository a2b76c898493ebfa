// Chunked gated delta rule: the question-rows kernels (see gated_delta_rule.cu for the math, the
// layout, the gate and q-scaling conventions, and the chunked form these rewrite).
//
// Question rows (GdnArgs::short_seqs without state_out: every sequence one chunk, all from the same
// read-only S₀; Kev's cached evaluation) too many for the token recurrence (gated_delta_rule_short.cu's
// short_pass: its grid over two blocks per SM; the 4B's 6 rows, 384 blocks on 132 SMs): two other
// kernels. With one chunk per sequence nothing is carried to a next chunk, so the state enters only
// through one product. With X = P L⁻¹ (lower triangular):
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
//
// Dtypes: FP32 in, out and state; products 3xTF32 with FP32 accumulation; double only for Γ and T_b.
// Preconditions (gated_delta_rule_supported): dk ∈ {32, 64, 128}, dv >= 1, Hk >= 1 divides Hv,
// Hv <= 65535; at launch also 1 <= n_seqs <= 65535 and state_out only with n_seqs == 1; sm_80 or
// newer (TF32 mma, cp.async). Global accesses are 16-byte (out: 8-byte) when q/k/v/out and state_in
// are 16-byte aligned, their row strides multiples of 4 and dv % 4 == 0, scalar otherwise.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gdn_common.cuh"

namespace kev::cuda::gdn {

namespace {

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
    int bi, bj, col0;
    if (lower_tile(warp, u, cn, bi, bj, col0)) product_tile<DK, 2>(qk, Ks, bi, col0, g, t, acc[u]);
  }
  __syncthreads();  // Q is dead (K stays for Q̃)
  // P_ij = (q_i·k_j) D_ij (j <= i), M_ij = β_i (k_i·k_j) D_ij (j < i); M_bb goes to Mdiag for the inversion.
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    int bi, bj, col0;
    if (!lower_tile(warp, u, cn, bi, bj, col0)) continue;
    const int j = col0 + 2 * t;
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


// Question rows (rows_pass): gdn_rows_kernel, then, from a state, gdn_rows_state_kernel as its
// programmatic dependent launch where the GPU allows it (sm_90). Both grids depend only on dv, Hv,
// n_tokens, n_seqs and whether there is a state.
template <int DK>
cudaError_t launch_rows_dk(const GdnArgs& a, float* qt, cudaStream_t stream) {
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

}  // namespace

cudaError_t launch_rows(const GdnArgs& a, float* qt, cudaStream_t stream) {
  switch (a.dk) {
    case 32:
      return launch_rows_dk<32>(a, qt, stream);
    case 64:
      return launch_rows_dk<64>(a, qt, stream);
    default:
      return launch_rows_dk<128>(a, qt, stream);
  }
}

}  // namespace kev::cuda::gdn
