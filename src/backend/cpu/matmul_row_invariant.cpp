// Row-invariant FP32 GEMM: out[i,j] = Σ_l x[i,l]·w[j,l] (+ bias[j]).
//
// Per-element arithmetic (the invariant): element (i,j) owns one 8-lane accumulator a[0..8), zero at
// the start. For l = 0, 8, 16, … it does a[q] = fma(x[i,l+q], w[j,l+q], a[q]) for the eight lanes;
// the last, partial group of k loads zeros past k (masked loads), which adds exactly +0 to a lane.
// Then s = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) and out = s + bias[j] when there is a bias. Nothing
// in that sequence depends on n, on i, on which tile or thread computes the element or on its
// neighbours: tiling only chooses which elements run side by side, never the order inside one.
// The portable path runs the same sequence with a[q] += x·w written as one expression (a separate
// multiply and add unless the compiler contracts it, which it then does for every element alike), so
// its bits may differ from the AVX2 path's but are just as invariant.
//
// Layout and tiling: x [n,k] (row stride ldx) and w [m,k] (contiguous) are both read along k, in
// place. A register tile is kTileRows rows × kTileCols columns of accumulators (12 ymm registers);
// each 8-wide step loads 3 x vectors and 4 w vectors for 12 FMAs. Edge tiles are the same template
// with fewer rows or columns. A task is a block of rows × kColBlock columns; inside it column tiles run
// outside and row tiles inside, so a w tile (kTileCols·k floats) is fetched from memory once per row
// block and then served from L1/L2 to every row tile, and the row block (about kRowBlockBytes of x,
// kept in L2) is reused by every column tile. While a column tile runs, its row tiles prefetch the next
// w tile into L2 in equal shares, which hides the memory latency of the cold read of w.
// Measured on a 2-core AMD EPYC (Zen 3) this runs at 76–92% of OpenBLAS 0.3.21's sgemm for 256 rows
// and faster than it for 16 rows or fewer (docs/backends.md has the table). Packing x and w into
// panels and blocking k (as BLAS does) were tried and were slower here.
//
// Threading: tasks go to the pool with dynamic scheduling; which thread runs a task does not change
// its results.
#include "backend/cpu/matmul_row_invariant.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define KEV_GEMM_HAVE_AVX2 1
#endif

namespace kev::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int kTileRows = 3;
constexpr int kTileCols = 4;
constexpr int64_t kRowBlockBytes = 256 * 1024;  // half of a Zen 3 core's L2
constexpr int64_t kColBlock = 64;               // multiple of kTileCols
constexpr int64_t kCacheLine = 64;

// One kernel call: rows [i, i+R) × columns [j, j+C); it also prefetches the bytes
// [prefetch, prefetch_end) (a share of the next w tile), one cache line per k step.
struct TileArgs {
  int64_t i, j;
  const char* prefetch;
  const char* prefetch_end;
};
using TileFn = void (*)(const GemmProblem& p, const TileArgs& t);
using TileTable = TileFn[kTileRows + 1][kTileCols + 1];

// ---- portable path -----------------------------------------------------------------------------
float reduce_lanes(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

template <int R, int C>
void tile_portable(const GemmProblem& p, const TileArgs& t) {
  float acc[R][C][kLanes] = {};
  const float* xr[R];
  const float* wr[C];
  for (int r = 0; r < R; ++r) xr[r] = p.x + (t.i + r) * p.ldx;
  for (int c = 0; c < C; ++c) wr[c] = p.w + (t.j + c) * p.k;
  const char* prefetch = t.prefetch;
  int64_t l = 0;
  for (; l + kLanes <= p.k; l += kLanes) {
    if (prefetch < t.prefetch_end) {
      __builtin_prefetch(prefetch);
      prefetch += kCacheLine;
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        for (int q = 0; q < kLanes; ++q) acc[r][c][q] += xr[r][l + q] * wr[c][l + q];
      }
    }
  }
  if (l < p.k) {
    float xt[R][kLanes] = {};
    float wt[C][kLanes] = {};
    for (int r = 0; r < R; ++r) std::copy(xr[r] + l, xr[r] + p.k, xt[r]);
    for (int c = 0; c < C; ++c) std::copy(wr[c] + l, wr[c] + p.k, wt[c]);
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        for (int q = 0; q < kLanes; ++q) acc[r][c][q] += xt[r][q] * wt[c][q];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (t.i + r) * p.ldo + t.j;
    for (int c = 0; c < C; ++c) {
      const float s = reduce_lanes(acc[r][c]);
      o[c] = p.bias ? s + p.bias[t.j + c] : s;
    }
  }
}

// ---- AVX2 + FMA path ---------------------------------------------------------------------------
#ifdef KEV_GEMM_HAVE_AVX2
// The same tree as reduce_lanes: (lo + hi) pairs lane q with q+4, then (0,2) and (1,3), then the two.
__attribute__((target("avx2,fma"))) inline float reduce_avx2(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  const __m128 u = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(u);
}

// The unroll pragmas keep the accumulators in registers at -O2 too (a spilled tile runs at a third
// of the speed).
template <int R, int C>
__attribute__((target("avx2,fma"))) void tile_avx2(const GemmProblem& p, const TileArgs& t) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const float* xr[R];
  const float* wr[C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) xr[r] = p.x + (t.i + r) * p.ldx;
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) wr[c] = p.w + (t.j + c) * p.k;
  const char* prefetch = t.prefetch;
  int64_t l = 0;
  for (; l + kLanes <= p.k; l += kLanes) {
    if (prefetch < t.prefetch_end) {
      _mm_prefetch(prefetch, _MM_HINT_T1);
      prefetch += kCacheLine;
    }
    __m256 wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(wr[c] + l);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xr[r] + l);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (l < p.k) {
    // Lanes at or past k load as 0 and are never read from memory (x rows may sit in a wider matrix).
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(p.k - l)), lane);
    __m256 wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) wv[c] = _mm256_maskload_ps(wr[c] + l, mask);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_maskload_ps(xr[r] + l, mask);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (t.i + r) * p.ldo + t.j;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const float s = reduce_avx2(acc[r][c]);
      o[c] = p.bias ? s + p.bias[t.j + c] : s;
    }
  }
}
#endif

// Every (rows, columns) tile size up to the full tile; index [r][c].
#define KEV_TILE_ROW(f, R) {nullptr, f<R, 1>, f<R, 2>, f<R, 3>, f<R, 4>}
#define KEV_TILE_TABLE(f) \
  {{nullptr, nullptr, nullptr, nullptr, nullptr}, KEV_TILE_ROW(f, 1), KEV_TILE_ROW(f, 2), KEV_TILE_ROW(f, 3)}

static_assert(kTileRows == 3 && kTileCols == 4, "the tile tables below list sizes up to 3 x 4");
const TileTable kPortable = KEV_TILE_TABLE(tile_portable);
#ifdef KEV_GEMM_HAVE_AVX2
const TileTable kAvx2 = KEV_TILE_TABLE(tile_avx2);
#endif

bool have_avx2() {
#ifdef KEV_GEMM_HAVE_AVX2
  static const bool yes = [] {
    __builtin_cpu_init();  // needed when the first call comes from a static initialiser
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

void run_task(const GemmProblem& p, const TileTable& table, int64_t i_begin, int64_t i_end, int64_t j_begin,
              int64_t j_end) {
  const int64_t row_tiles = (i_end - i_begin + kTileRows - 1) / kTileRows;
  for (int64_t j = j_begin; j < j_end; j += kTileCols) {
    const int64_t c = std::min<int64_t>(kTileCols, j_end - j);
    // The next w tile (rows [j+c, j+c+kTileCols) of w, contiguous), split into one share per row tile.
    const char* next = reinterpret_cast<const char*>(p.w + (j + c) * p.k);
    const int64_t next_bytes =
        static_cast<int64_t>(sizeof(float)) * (std::min<int64_t>(j + c + kTileCols, p.m) - (j + c)) * p.k;
    const int64_t share = ((next_bytes + kCacheLine - 1) / kCacheLine + row_tiles - 1) / row_tiles * kCacheLine;
    int64_t tile = 0;
    for (int64_t i = i_begin; i < i_end; i += kTileRows, ++tile) {
      const int64_t r = std::min<int64_t>(kTileRows, i_end - i);
      const TileArgs args{i, j, next + std::min(next_bytes, tile * share),
                          next + std::min(next_bytes, (tile + 1) * share)};
      table[r][c](p, args);
    }
  }
}

}  // namespace

const char* gemm_row_invariant_isa() { return have_avx2() ? "avx2+fma" : "portable"; }

void gemm_row_invariant(ThreadPool& pool, const GemmProblem& p, GemmIsa isa) {
  if (p.n <= 0 || p.m <= 0) return;
  const TileTable* table = &kPortable;
#ifdef KEV_GEMM_HAVE_AVX2
  if (isa == GemmIsa::Best && have_avx2()) table = &kAvx2;
#endif
  const int64_t row_bytes = std::max<int64_t>(p.k, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t row_block = std::max<int64_t>(kRowBlockBytes / row_bytes / kTileRows, 1) * kTileRows;
  const int64_t n_row_blocks = (p.n + row_block - 1) / row_block;
  const int64_t n_col_blocks = (p.m + kColBlock - 1) / kColBlock;
  pool.parallel_for(n_row_blocks * n_col_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i_begin = task / n_col_blocks * row_block, j_begin = task % n_col_blocks * kColBlock;
      run_task(p, *table, i_begin, std::min(i_begin + row_block, p.n), j_begin, std::min(j_begin + kColBlock, p.m));
    }
  });
}

}  // namespace kev::cpu
