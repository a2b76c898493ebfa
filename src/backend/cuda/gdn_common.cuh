// What the gated delta rule's kernels share (gated_delta_rule.cu: products and recurrence;
// gated_delta_rule_rows.cu: question rows): the chunk constants, the gate scan, the chunk numbering,
// cp.async staging and the 3xTF32 product tiles, and the host-side launch facts (device traits,
// chunk count, vector access). Math, layout and conventions: gated_delta_rule.cu's header comment.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gated_delta_rule.cuh"
#include "backend/cuda/mma_tf32.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the gated delta rule needs sm_80 or newer (mma.sync .tf32): set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

namespace kev::cuda::gdn {

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

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Programmatic dependent launch (sm_90; the rows kernels' launcher uses it): gdn_rows_kernel lets the
// rows' state product start at once, and that waits here, before its first read of what the first
// wrote, for it to finish (memory included). Without it both are no-ops.
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
inline const DeviceTraits& device_traits() {
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


// Chunk indices of a pass: the last sequence's range ends at or before n_seqs + n_tokens / C.
inline int64_t max_chunks(const GdnArgs& a) {
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

// Warp warp's u-th m16n8 tile (u < 3) of the 20 covering a chunk's 10 lower 16×16 blocks (two 8-column
// halves each; warp w: tiles w, w + 8, w + 16): false when there is no such tile or its block starts at
// or past cn (zero padding, never read); else the block (bi, bj) and the tile's first column col0.
__device__ __forceinline__ bool lower_tile(int warp, int u, int cn, int& bi, int& bj, int& col0) {
  const int tile = warp + 8 * u;
  if (tile >= 20) return false;
  lower_block(tile >> 1, bi, bj);
  col0 = 16 * bj + 8 * (tile & 1);
  return 16 * bi < cn;
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

// float4 loads of q/k/v rows and stores of out rows need 16-byte aligned rows and dv % 4 == 0 (a
// slice's float4 column groups then never straddle the end of a row); the state slice's 16-byte copies
// need state_in aligned too.
inline bool vectorizable(const GdnArgs& a) {
  return aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) && aligned16(a.state_in) &&
         a.qk_token_stride % 4 == 0 && a.v_token_stride % 4 == 0 && a.out_token_stride % 4 == 0 && a.dv % 4 == 0;
}


// Short passes (gated_delta_rule_short.cu): whether a pass takes the token recurrence (no workspace),
// and its launch.
bool short_pass(const GdnArgs& a);
cudaError_t launch_short(const GdnArgs& a, cudaStream_t stream);

// Question rows from a shared state that short_pass leaves (gated_delta_rule_rows.cu): the rows
// kernels' launch (qt: the workspace, Q̃ as [Hv, n_tokens, dk]).
cudaError_t launch_rows(const GdnArgs& a, float* qt, cudaStream_t stream);

}  // namespace kev::cuda::gdn
