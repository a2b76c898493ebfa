// Row invariance of the CPU backend's FAST matmul (gemm_row_invariant, the default kernel): the bits
// of a row's output must not depend on how many rows share the call, where the row sits among them,
// how many threads split the work, or the row strides of x and out. This is what makes the engine's
// "questions together == questions alone" exact. Both the AVX2 path and the portable fallback are
// checked (the fallback is forced on AVX2 machines). Accuracy against a double-precision dot product
// is checked along the way; FAST vs REFERENCE through the op harness lives in op_cases_support.cpp.
#include "backend/cpu/matmul_row_invariant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/test_tensors.h"

namespace kev::cpu {
namespace {

using kev::testing::randn;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Weights {
  int64_t k, m;
  std::vector<float> w, bias;  // bias empty: none
};

Weights make_weights(int64_t k, int64_t m, bool bias, uint64_t seed) {
  return {k, m, randn(static_cast<size_t>(k * m), 0.05f, seed),
          bias ? randn(static_cast<size_t>(m), 1.0f, seed + 1) : std::vector<float>{}};
}

struct Placement {
  int64_t n, pos;         // rows in the call, row of the probe
  int64_t x_pad, o_pad;   // extra floats between rows of x / out (gaps hold NaN)
  int threads;
  GemmIsa isa;
  std::string label() const {
    return "n=" + std::to_string(n) + " pos=" + std::to_string(pos) + " x_pad=" + std::to_string(x_pad) +
           " out_pad=" + std::to_string(o_pad) + " threads=" + std::to_string(threads) +
           (isa == GemmIsa::Portable ? " portable" : " best");
  }
};

// Runs one call with `probe` at row `pl.pos` among random rows and returns the probe's output row.
// Fails the test if a gap of out was written or an output is not finite (a read of an x gap or of
// past-k lanes would bring in NaN).
std::vector<float> run_probe(const Weights& wt, const std::vector<float>& probe, const Placement& pl, uint64_t seed) {
  const int64_t ldx = wt.k + pl.x_pad, ldo = wt.m + pl.o_pad;
  std::vector<float> x(static_cast<size_t>(pl.n * ldx), kNaN);
  const std::vector<float> others = randn(static_cast<size_t>(pl.n * wt.k), 1.0f, seed);
  for (int64_t i = 0; i < pl.n; ++i) {
    const float* src = i == pl.pos ? probe.data() : others.data() + i * wt.k;
    std::copy(src, src + wt.k, x.begin() + i * ldx);
  }
  std::vector<float> out(static_cast<size_t>(pl.n * ldo), kNaN);
  ThreadPool pool(pl.threads);
  gemm_row_invariant(pool,
                     GemmProblem{pl.n, wt.k, wt.m, x.data(), ldx, wt.w.data(),
                                 wt.bias.empty() ? nullptr : wt.bias.data(), out.data(), ldo},
                     pl.isa);
  for (int64_t i = 0; i < pl.n; ++i) {
    for (int64_t j = 0; j < ldo; ++j) {
      const float v = out[i * ldo + j];
      if (j < wt.m) {
        EXPECT_TRUE(std::isfinite(v)) << pl.label() << ": out[" << i << "," << j << "] = " << v;
      } else {
        EXPECT_TRUE(std::isnan(v)) << pl.label() << ": gap out[" << i << "," << j << "] was written";
      }
    }
  }
  return std::vector<float>(out.begin() + pl.pos * ldo, out.begin() + pl.pos * ldo + wt.m);
}

// Σ_l probe_l·w_jl (+ bias) in double, and the scale Σ|probe_l·w_jl| its float error is measured against.
void expect_close_to_double(const Weights& wt, const std::vector<float>& probe, const std::vector<float>& got,
                            const std::string& label) {
  for (int64_t j = 0; j < wt.m; ++j) {
    double acc = wt.bias.empty() ? 0.0 : wt.bias[j], scale = wt.bias.empty() ? 0.0 : std::fabs(wt.bias[j]);
    for (int64_t l = 0; l < wt.k; ++l) {
      const double term = static_cast<double>(probe[l]) * wt.w[j * wt.k + l];
      acc += term;
      scale += std::fabs(term);
    }
    ASSERT_LE(std::fabs(got[j] - acc), 1e-5 * scale + 1e-30) << label << ": column " << j;
  }
}

struct Shape {
  int64_t k, m;
  bool bias;
};

// For each shape: the probe alone (n = 1, one thread, dense) is the yardstick; every placement must
// give the same bits. The n values cross the 3-row register tiles, the row blocks (256 KiB of x rows:
// 63 rows at k = 1030, 18 at k = 3584) and the 64-column blocks.
void check_invariance(const std::vector<Shape>& shapes, const std::vector<int64_t>& ns, GemmIsa isa) {
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    const Weights wt = make_weights(s.k, s.m, s.bias, seed++);
    const std::vector<float> probe = randn(static_cast<size_t>(s.k), 1.0f, seed++);
    const Placement alone{1, 0, 0, 0, 1, isa};
    const std::vector<float> want = run_probe(wt, probe, alone, seed++);
    const std::string shape_label = "k=" + std::to_string(s.k) + " m=" + std::to_string(s.m) + (s.bias ? " bias" : "");
    expect_close_to_double(wt, probe, want, shape_label);
    int variant = 0;
    for (int64_t n : ns) {
      std::vector<int64_t> positions = {0, n / 2, n - 1};
      positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
      for (int64_t pos : positions) {
        // Dense with one thread, then strided with 2 or 3 threads (alternating).
        const Placement dense{n, pos, 0, 0, 1, isa};
        const Placement strided{n, pos, 5 + variant % 4, 3, 2 + variant % 2, isa};
        ++variant;
        for (const Placement& pl : {dense, strided}) {
          const std::vector<float> got = run_probe(wt, probe, pl, seed++);
          ASSERT_TRUE(same_bits(got, want)) << shape_label << " " << pl.label() << ": bits differ from the row alone";
        }
      }
    }
  }
}

TEST(RowInvariantGemm, ReportsItsPath) {
  const std::string isa = gemm_row_invariant_isa();
  EXPECT_TRUE(isa == "avx2+fma" || isa == "portable") << isa;
  RecordProperty("isa", isa);
}

TEST(RowInvariantGemm, RowBitsDoNotDependOnBatchPositionThreadsOrStrides) {
  check_invariance({{1024, 256, true}, {1030, 67, false}, {13, 130, true}, {5, 3, true}, {3584, 20, false}},
                   {1, 2, 3, 4, 5, 16, 17, 62, 63, 64, 65, 100, 128, 255, 256, 300}, GemmIsa::Best);
}

TEST(RowInvariantGemm, PortablePathIsRowInvariantToo) {
  check_invariance({{1030, 67, true}, {13, 9, false}, {1, 5, true}}, {1, 2, 3, 4, 17, 63, 64, 65, 130, 300},
                   GemmIsa::Portable);
}

TEST(RowInvariantGemm, EmptyDepthGivesBias) {
  const std::vector<float> bias = {1.5f, -2.0f, 0.25f};
  const float x_unused = 0.0f;
  std::vector<float> out(6, kNaN);
  ThreadPool pool(2);
  gemm_row_invariant(pool, GemmProblem{2, 0, 3, &x_unused, 0, &x_unused, bias.data(), out.data(), 3});
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f}));
  gemm_row_invariant(pool, GemmProblem{2, 0, 3, &x_unused, 0, &x_unused, nullptr, out.data(), 3});
  EXPECT_EQ(out, std::vector<float>(6, 0.0f));
}

// Through the Backend interface with the default options: a batched matmul over a column slice of a
// wider activation matrix gives, row for row, the bits of the same row run alone, with 1 and 2 threads.
TEST(RowInvariantGemm, BackendMatmulRowsEqualRowsAlone) {
  constexpr int64_t n = 41, k = 1000, m = 200, wide = 1100, col0 = 60;
  const std::vector<float> xv = randn(static_cast<size_t>(n * wide), 1.0f, 7);
  const std::vector<float> wv = randn(static_cast<size_t>(m * k), 0.05f, 8);
  const std::vector<float> bv = randn(static_cast<size_t>(m), 1.0f, 9);
  std::vector<std::vector<float>> first_run;
  for (int threads : {1, 2}) {
    BackendOptions opts;
    opts.threads = threads;
    ASSERT_TRUE(opts.row_invariant_matmul);  // the default
    auto created = create_cpu_backend(opts);
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    Backend& b = *created.value();
    const testing::DeviceTensor x = testing::make_f32(b, {n, wide}, xv);
    const testing::DeviceTensor w = testing::make_f32(b, {m, k}, wv);
    const testing::DeviceTensor bias = testing::make_f32(b, {m}, bv);
    const testing::DeviceTensor out = testing::make_f32(b, {n, m});
    const testing::DeviceTensor one = testing::make_f32(b, {1, m});
    const Tensor xs = x.t.slice(1, col0, k);
    const Status batched = b.matmul(xs, w.t, bias.t, out.t);
    ASSERT_TRUE(batched.ok()) << batched.to_string();
    const std::vector<float> all = testing::read_f32(b, out.t);
    std::vector<std::vector<float>> rows;
    for (int64_t i = 0; i < n; ++i) {
      const Status alone = b.matmul(xs.slice(0, i, 1), w.t, bias.t, one.t);
      ASSERT_TRUE(alone.ok()) << alone.to_string();
      const std::vector<float> got = testing::read_f32(b, one.t);
      const std::vector<float> row(all.begin() + i * m, all.begin() + (i + 1) * m);
      ASSERT_TRUE(same_bits(got, row)) << "threads=" << threads << " row " << i;
      rows.push_back(row);
    }
    if (first_run.empty()) {
      first_run = rows;
    } else {
      EXPECT_EQ(rows, first_run) << "1 and 2 threads disagree";
    }
  }
}

}  // namespace
}  // namespace kev::cpu
