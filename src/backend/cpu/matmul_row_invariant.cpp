// Row-invariant FP32 GEMM: out[i,j] = Σ_l x[i,l]·w[j,l] (+ bias[j]).
//
// Per-element arithmetic (the invariant): element (i,j) owns one 8-lane accumulator a[0..8), zero at
// the start. For l = 0, 8, 16, … it does a[q] = fma(x[i,l+q], w[j,l+q], a[q]) for the eight lanes
// (the last, partial group of k reads zeros past k, which adds exactly +0 to each lane). Then
// s = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), and out = s + bias[j] when there is a bias. Nothing in
// that sequence depends on n, on i, on which tile or thread computes the element, or on its
// neighbours: tiling only chooses which elements run side by side, and blocking over k only parks
// the accumulator in memory (exactly) between blocks, never changing the order inside one element.
// The portable path runs the same sequence with a separate multiply and add (no FMA), so its bits
// differ from the AVX2 path's but are just as invariant.
//
// Layout and tiling: x [n,k] (row stride ldx) and w [m,k] (contiguous) are both read along k. A
// register tile is kTileRows rows × kTileCols columns of accumulators (12 ymm registers); each 8-wide
// step loads kTileRows x vectors and kTileCols w vectors for kTileRows·kTileCols FMAs. Edge tiles
// (fewer rows or columns) are the same template with smaller sizes. The operands are copied into
// panels first, [k/8][rows of the tile][8] with zeros past k, so the kernel reads two sequential
// streams (no cache-set aliasing from rows 4 KiB apart, no masked loads) — copying changes no value.
//
// Blocking: a task is a block of rows × a block of columns. For each k block (kDepthBlock deep) it
// packs the task's x rows (kept in L2) and then, per column tile, that tile's w panel (kept in L1),
// which every row tile of the block then streams past. Accumulators of a task are parked in a carry
// buffer between k blocks. w is thus read from memory once per row block.
//
// Threading: tasks go to the pool with dynamic scheduling; the thread that runs a task does not affect
// its results. Panels and carry live in per-thread buffers that are reused between calls.
#include "backend/cpu/matmul_row_invariant.h"

#include <algorithm>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KEV_GEMM_HAVE_AVX2 1
#endif

namespace kev::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int kTileRows = 3;
constexpr int kTileCols = 4;
constexpr int64_t kDepthBlock = 512;  // multiple of kLanes
constexpr int64_t kRowBlock = 96;     // multiple of kTileRows
constexpr int64_t kColBlock = 32;     // multiple of kTileCols

// One kernel call: an r × c tile (r <= kTileRows, c <= kTileCols) over `steps` 8-wide k steps.
struct TileArgs {
  const float* x;  // panel [steps][r][8]
  const float* w;  // panel [steps][c][8]
  int64_t steps;
  float* carry;  // [r][c][8]: read when !first, written when !last
  bool first, last;
  float* out;  // element (0,0) of the tile
  int64_t ldo;
  const float* bias;  // at the tile's first column, or null
};
using TileFn = void (*)(const TileArgs& t);
using TileTable = TileFn[kTileRows + 1][kTileCols + 1];

// ---- portable path -----------------------------------------------------------------------------
float reduce_lanes(const float* a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

template <int R, int C>
void tile_portable(const TileArgs& t) {
  float acc[R][C][kLanes];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      for (int q = 0; q < kLanes; ++q) acc[r][c][q] = t.first ? 0.0f : t.carry[(r * C + c) * kLanes + q];
    }
  }
  const float* xp = t.x;
  const float* wp = t.w;
  for (int64_t s = 0; s < t.steps; ++s, xp += R * kLanes, wp += C * kLanes) {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        for (int q = 0; q < kLanes; ++q) acc[r][c][q] += xp[r * kLanes + q] * wp[c * kLanes + q];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      if (!t.last) {
        std::copy(acc[r][c], acc[r][c] + kLanes, t.carry + (r * C + c) * kLanes);
      } else {
        const float s = reduce_lanes(acc[r][c]);
        t.out[r * t.ldo + c] = t.bias ? s + t.bias[c] : s;
      }
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

// The unroll pragmas keep the accumulators in registers at -O2 as well (a spilled tile runs at a
// third of the speed).
template <int R, int C>
__attribute__((target("avx2,fma"))) void tile_avx2(const TileArgs& t) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      acc[r][c] = t.first ? _mm256_setzero_ps() : _mm256_loadu_ps(t.carry + (r * C + c) * kLanes);
    }
  }
  const float* xp = t.x;
  const float* wp = t.w;
  for (int64_t s = 0; s < t.steps; ++s, xp += R * kLanes, wp += C * kLanes) {
    __m256 wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(wp + c * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xp + r * kLanes);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (!t.last) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(t.carry + (r * C + c) * kLanes, acc[r][c]);
    }
    return;
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const float s = reduce_avx2(acc[r][c]);
      t.out[r * t.ldo + c] = t.bias ? s + t.bias[c] : s;
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
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// Copies rows [0, rows) of `src` (row stride ld), columns [l0, l0 + len), into a panel
// [ceil(len/8)][rows][8], zero-filling past len.
void pack_panel(const float* src, int64_t ld, int64_t rows, int64_t l0, int64_t len, float* dst) {
  for (int64_t s = 0; s * kLanes < len; ++s) {
    const int64_t l = l0 + s * kLanes;
    const int64_t count = std::min<int64_t>(kLanes, len - s * kLanes);
    for (int64_t r = 0; r < rows; ++r, dst += kLanes) {
      const float* from = src + r * ld + l;
      if (count == kLanes) {
        for (int q = 0; q < kLanes; ++q) dst[q] = from[q];
      } else {
        for (int q = 0; q < kLanes; ++q) dst[q] = q < count ? from[q] : 0.0f;
      }
    }
  }
}

struct Buffers {
  std::vector<float> x_panels, w_panel, carry;
};

void run_task(const GemmProblem& p, const TileTable& table, int64_t i_begin, int64_t i_end, int64_t j_begin,
              int64_t j_end, Buffers& b) {
  const int64_t n_col_tiles = (j_end - j_begin + kTileCols - 1) / kTileCols;
  const int64_t max_steps = (std::min(kDepthBlock, p.k) + kLanes - 1) / kLanes;
  b.x_panels.resize(static_cast<size_t>((i_end - i_begin) * max_steps * kLanes));
  b.w_panel.resize(static_cast<size_t>(kTileCols * max_steps * kLanes));
  if (p.k > kDepthBlock) b.carry.resize(static_cast<size_t>((i_end - i_begin) * n_col_tiles * kTileCols * kLanes));
  int64_t l0 = 0;
  do {
    const int64_t len = std::min(kDepthBlock, p.k - l0);
    const int64_t steps = (len + kLanes - 1) / kLanes;
    const bool first = l0 == 0, last = l0 + len == p.k;
    // Row tile starting at row i: its panel is at (i - i_begin) * steps * kLanes.
    for (int64_t i = i_begin; i < i_end; i += kTileRows) {
      const int64_t r = std::min<int64_t>(kTileRows, i_end - i);
      pack_panel(p.x + i * p.ldx, p.ldx, r, l0, len, b.x_panels.data() + (i - i_begin) * steps * kLanes);
    }
    for (int64_t j = j_begin; j < j_end; j += kTileCols) {
      const int64_t c = std::min<int64_t>(kTileCols, j_end - j);
      pack_panel(p.w + j * p.k, p.k, c, l0, len, b.w_panel.data());
      const int64_t col_tile = (j - j_begin) / kTileCols;
      for (int64_t i = i_begin; i < i_end; i += kTileRows) {
        const int64_t r = std::min<int64_t>(kTileRows, i_end - i);
        float* carry =
            b.carry.empty() ? nullptr : b.carry.data() + ((i - i_begin) * n_col_tiles + col_tile * kTileRows) * kTileCols * kLanes;
        const TileArgs args{b.x_panels.data() + (i - i_begin) * steps * kLanes,
                            b.w_panel.data(),
                            steps,
                            carry,
                            first,
                            last,
                            p.out + i * p.ldo + j,
                            p.ldo,
                            p.bias ? p.bias + j : nullptr};
        table[r][c](args);
      }
    }
    l0 += len;
  } while (l0 < p.k);
}

}  // namespace

const char* gemm_row_invariant_isa() { return have_avx2() ? "avx2+fma" : "portable"; }

void gemm_row_invariant(ThreadPool& pool, const GemmProblem& p, GemmIsa isa) {
  if (p.n <= 0 || p.m <= 0) return;
  const TileTable* table = &kPortable;
#ifdef KEV_GEMM_HAVE_AVX2
  if (isa == GemmIsa::Best && have_avx2()) table = &kAvx2;
#endif
  const int64_t n_row_blocks = (p.n + kRowBlock - 1) / kRowBlock;
  const int64_t n_col_blocks = (p.m + kColBlock - 1) / kColBlock;
  pool.parallel_for(n_row_blocks * n_col_blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local Buffers buffers;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i_begin = task / n_col_blocks * kRowBlock, j_begin = task % n_col_blocks * kColBlock;
      run_task(p, *table, i_begin, std::min(i_begin + kRowBlock, p.n), j_begin, std::min(j_begin + kColBlock, p.m),
               buffers);
    }
  });
}

}  // namespace kev::cpu
