// Performance sanity for the CPU kernels (disabled by default; not a benchmark protocol). Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='*Perf*'
// Each measurement warms up once, then repeats until 1 s has passed (at least 3 runs) and prints
// the median and the fastest run (on a shared machine the minimum is the steadier figure).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <random>

#include "backend/test_tensors.h"

namespace kev {
namespace {

using testing::DeviceTensor;
using testing::make_f32;

struct Timing {
  double median_ms, min_ms;
};

std::ostream& operator<<(std::ostream& os, const Timing& t) {
  return os << t.median_ms << " ms median, " << t.min_ms << " ms min";
}

Timing time_op(const std::function<Status()>& fn) {
  EXPECT_TRUE(fn().ok());
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  while (ms.size() < 3 || std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(fn().ok());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

std::vector<float> randn(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::shared_ptr<Backend> cpu(bool reference) {
  BackendOptions o;
  o.reference_mode = reference;
  return create_backend("cpu", o).value();
}

TEST(DISABLED_Perf, Matmul256x1024x3584) {
  auto b = cpu(false);
  const int64_t n = 256, k = 1024, m = 3584;
  DeviceTensor x = make_f32(*b, {n, k}, randn(n * k, 1, 1)), w = make_f32(*b, {m, k}, randn(m * k, 0.03f, 2));
  DeviceTensor out = make_f32(*b, {n, m});
  const Timing t = time_op([&] { return b->matmul(x.t, w.t, Tensor{}, out.t); });
  std::cout << "matmul [" << n << "x" << k << "] x [" << m << "x" << k << "]^T: " << t << ", "
            << 2.0 * n * k * m / t.min_ms / 1e6 << " GFLOP/s at the min (" << b->info().device << ")\n";
}

TEST(DISABLED_Perf, GatedDeltaRuleT256Hv16) {
  const int64_t T = 256, H = 16, d = 128;
  for (bool reference : {false, true}) {
    auto b = cpu(reference);
    std::vector<float> qk = randn(T * H * d, 1.0f / std::sqrt(128.0f), 3), g(T * H), beta(T * H);
    std::mt19937_64 rng(4);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < T * H; ++i) {
      g[i] = -0.05f - u(rng);
      beta[i] = u(rng);
    }
    DeviceTensor q = make_f32(*b, {T, H, d}, qk), k = make_f32(*b, {T, H, d}, qk);
    DeviceTensor v = make_f32(*b, {T, H, d}, randn(T * H * d, 1, 5)), gt = make_f32(*b, {T, H}, g);
    DeviceTensor bt = make_f32(*b, {T, H}, beta), s0 = make_f32(*b, {H, d, d}, randn(H * d * d, 0.3f, 6));
    DeviceTensor out = make_f32(*b, {T, H, d}), s1 = make_f32(*b, {H, d, d});
    SeqLayout layout;
    layout.offsets = {0, static_cast<int32_t>(T)};
    layout.from_prefix = true;
    const Timing t = time_op([&] { return b->gated_delta_rule(q.t, k.t, v.t, gt.t, bt.t, s0.t, layout, out.t, s1.t); });
    std::cout << "gated_delta_rule T=256 Hk=Hv=16 dk=dv=128 " << (reference ? "reference" : "chunked") << ": " << t
              << "\n";
  }
}

TEST(DISABLED_Perf, AttentionPrefix1024Rows8x64) {
  auto b = cpu(false);
  const int64_t Ls = 1024, H = 8, Hkv = 2, hd = 256, rows = 8, len = 64, n = rows * len;
  DeviceTensor q = make_f32(*b, {n, H, hd}, randn(n * H * hd, 1, 7)),
               kv = make_f32(*b, {n, Hkv, hd}, randn(n * Hkv * hd, 1, 8));
  DeviceTensor pk = make_f32(*b, {Ls, Hkv, hd}, randn(Ls * Hkv * hd, 1, 9)), out = make_f32(*b, {n, H, hd});
  SeqLayout layout;
  for (int64_t r = 0; r < rows; ++r) layout.offsets.push_back(static_cast<int32_t>((r + 1) * len));
  layout.from_prefix = true;
  const Timing t = time_op([&] { return b->attention(q.t, kv.t, kv.t, pk.t, pk.t, layout, 1.0f / 16, out.t); });
  std::cout << "attention Ls=1024, 8 rows x 64 tokens, 8/2/256: " << t << "\n";
}

}  // namespace
}  // namespace kev
