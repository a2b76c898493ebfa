// Performance sanity for the CPU kernels and the CUDA gated delta rule (disabled by default; not a
// benchmark protocol). Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='*Perf*'
// Each measurement warms up once, then repeats until 1 s has passed (at least 3 runs). It prints the
// median and fastest wall time with all cores, and the process CPU time per run with one thread:
// on a shared machine the wall time swings with other load, the single-thread CPU time much less.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <iostream>
#include <random>

#include "backend/test_tensors.h"
#include "common/check.h"

namespace kev {
namespace {

using testing::DeviceTensor;
using testing::make_f32;
using testing::randn;

struct Timing {
  double median_ms, min_ms, cpu_ms;
};

Timing time_op(const std::function<Status()>& fn) {
  EXPECT_TRUE(fn().ok());
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();
  while (ms.size() < 3 || std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(fn().ok());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC / ms.size();
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), cpu_ms};
}

// Runs `body(backend)` (which returns the timed call) on a FAST backend with all cores, then with one
// thread, and on a REFERENCE backend when `with_reference`.
void measure(const std::string& label, bool with_reference,
             const std::function<std::function<Status()>(Backend&)>& body) {
  struct Variant {
    const char* name;
    int threads;
    bool reference;
  };
  for (const Variant& v :
       {Variant{"fast, all threads", 0, false}, Variant{"fast, 1 thread", 1, false}, Variant{"reference", 1, true}}) {
    if (v.reference && !with_reference) continue;
    BackendOptions o;
    o.threads = v.threads;
    o.reference_mode = v.reference;
    std::shared_ptr<Backend> b = create_backend("cpu", o).value();
    const Timing t = time_op(body(*b));
    std::cout << label << " [" << v.name << "]: " << t.median_ms << " ms median, " << t.min_ms << " ms min";
    if (v.threads == 1) std::cout << ", " << t.cpu_ms << " ms CPU";
    std::cout << "  (" << b->info().device << ")\n";
  }
}

TEST(DISABLED_Perf, Matmul256x1024x3584) {
  const int64_t n = 256, k = 1024, m = 3584;
  DeviceTensor x, w, out;
  measure("matmul [256x1024] x [3584x1024]^T (1.88 GFLOP)", false, [&](Backend& b) {
    x = make_f32(b, {n, k}, randn(n * k, 1, 1));
    w = make_f32(b, {m, k}, randn(m * k, 0.03f, 2));
    out = make_f32(b, {n, m});
    return [&] { return b.matmul(x.t, w.t, Tensor{}, out.t); };
  });
}

// GDN gates for n (token, head) pairs: log decays g in (-1.05, -0.05], betas in [0, 1).
void random_gates(int64_t n, uint64_t seed, std::vector<float>& g, std::vector<float>& beta) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  g.resize(n);
  beta.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = -0.05f - u(rng);
    beta[i] = u(rng);
  }
}

TEST(DISABLED_Perf, GatedDeltaRuleT256Hv16) {
  const int64_t T = 256, H = 16, d = 128;
  std::vector<float> g, beta;
  random_gates(T * H, 4, g, beta);
  DeviceTensor q, k, v, gt, bt, s0, out, s1;
  SeqLayout layout;
  layout.offsets = {0, static_cast<int32_t>(T)};
  layout.from_prefix = true;
  measure("gated_delta_rule T=256 Hk=Hv=16 dk=dv=128 from a state, with state_out", true, [&](Backend& b) {
    const std::vector<float> qk = randn(T * H * d, 1.0f / std::sqrt(128.0f), 3);
    q = make_f32(b, {T, H, d}, qk);
    k = make_f32(b, {T, H, d}, qk);
    v = make_f32(b, {T, H, d}, randn(T * H * d, 1, 5));
    gt = make_f32(b, {T, H}, g);
    bt = make_f32(b, {T, H}, beta);
    s0 = make_f32(b, {H, d, d}, randn(H * d * d, 0.3f, 6));
    out = make_f32(b, {T, H, d});
    s1 = make_f32(b, {H, d, d});
    return [&] { return b.gated_delta_rule(q.t, k.t, v.t, gt.t, bt.t, s0.t, layout, out.t, s1.t); };
  });
}

// CUDA timing of the gated delta rule at the 4B shapes (Hk = 16, Hv = 32, dk = dv = 128; the 0.8B
// has Hv = 16), from a state (from_zero: from the zero state, as a model's first prefill). The backend
// records ops and runs them at synchronize(), so one timed run enqueues `reps` calls and waits once:
// the per-call time is GPU time plus the (graph-replayed) launch cost, without the host round trip.
// Skips when no CUDA device can be opened.
void time_cuda_gdn(const std::string& label, const std::vector<int64_t>& lens, bool with_state_out,
                   int64_t Hv = 32, bool from_zero = false) {
  auto r = create_backend("cuda", BackendOptions{});
  if (!r.ok()) GTEST_SKIP() << "no CUDA backend: " << r.status().to_string();
  Backend& b = *r.value();
  const int64_t Hk = 16, d = 128, reps = 20;
  int64_t T = 0;
  SeqLayout layout;
  layout.offsets = {0};
  for (int64_t len : lens) layout.offsets.push_back(static_cast<int32_t>(T += len));
  layout.from_prefix = !from_zero;
  std::vector<float> g, beta;
  random_gates(T * Hv, 11, g, beta);
  const DeviceTensor q = make_f32(b, {T, Hk, d}, randn(T * Hk * d, 1.0f / std::sqrt(128.0f), 12));
  const DeviceTensor k = make_f32(b, {T, Hk, d}, randn(T * Hk * d, 1.0f / std::sqrt(128.0f), 13));
  const DeviceTensor v = make_f32(b, {T, Hv, d}, randn(T * Hv * d, 1, 14));
  const DeviceTensor gt = make_f32(b, {T, Hv}, g), bt = make_f32(b, {T, Hv}, beta);
  const DeviceTensor s0 = make_f32(b, {Hv, d, d}, randn(Hv * d * d, 0.3f, 15));
  const DeviceTensor out = make_f32(b, {T, Hv, d}), s1 = make_f32(b, {Hv, d, d});
  const Tensor state_out = with_state_out ? s1.t : Tensor{};
  const Timing t = time_op([&]() -> Status {
    for (int64_t i = 0; i < reps; ++i) {
      KEV_TRY(b.gated_delta_rule(q.t, k.t, v.t, gt.t, bt.t, s0.t, layout, out.t, state_out));
    }
    return b.synchronize();
  });
  std::cout << label << ": " << 1000.0 * t.median_ms / reps << " us per call median, " << 1000.0 * t.min_ms / reps
            << " us min  (" << b.info().device << ")\n";
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda4bT2187) {
  time_cuda_gdn("cuda gated_delta_rule 4b, 1 x 2187 tokens from a state, with state_out", {2187}, true);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda08bT2187) {
  time_cuda_gdn("cuda gated_delta_rule 0.8b, 1 x 2187 tokens from a state, with state_out", {2187}, true, 16);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda4bT250) {
  time_cuda_gdn("cuda gated_delta_rule 4b, 1 x 250 tokens from a state, with state_out", {250}, true);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda08bT250) {
  time_cuda_gdn("cuda gated_delta_rule 0.8b, 1 x 250 tokens from zero, with state_out", {250}, true, 16, true);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda4bRows6x37) {
  time_cuda_gdn("cuda gated_delta_rule 4b, 6 rows x 37 tokens from one state", {37, 37, 37, 37, 36, 36}, false);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda08bRows6x37) {
  time_cuda_gdn("cuda gated_delta_rule 0.8b, 6 rows x 37 tokens from one state", {37, 37, 37, 37, 36, 36}, false, 16);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda4bRows4x37) {
  time_cuda_gdn("cuda gated_delta_rule 4b, 4 rows x 37 tokens from one state", {37, 37, 37, 36}, false);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda08bRows2x37) {
  time_cuda_gdn("cuda gated_delta_rule 0.8b, 2 rows x 37 tokens from one state", {37, 36}, false, 16);
}

TEST(DISABLED_Perf, GatedDeltaRuleCuda4bT37) {
  time_cuda_gdn("cuda gated_delta_rule 4b, 1 x 37 tokens from a state, with state_out", {37}, true);
}

// Question rows over a state prefix: `rows` sequences of `len` tokens, 0.8B heads 8/2/256.
void time_attention(int64_t Ls, int64_t rows, int64_t len) {
  const int64_t H = 8, Hkv = 2, hd = 256, n = rows * len;
  DeviceTensor q, kv, pk, out;
  SeqLayout layout;
  for (int64_t r = 0; r < rows; ++r) layout.offsets.push_back(static_cast<int32_t>((r + 1) * len));
  layout.from_prefix = true;
  measure("attention Ls=" + std::to_string(Ls) + ", " + std::to_string(rows) + " rows x " + std::to_string(len) +
              " tokens, 8/2/256",
          false, [&](Backend& b) {
            q = make_f32(b, {n, H, hd}, randn(n * H * hd, 1, 7));
            kv = make_f32(b, {n, Hkv, hd}, randn(n * Hkv * hd, 1, 8));
            pk = make_f32(b, {Ls, Hkv, hd}, randn(Ls * Hkv * hd, 1, 9));
            out = make_f32(b, {n, H, hd});
            return [&] { return b.attention(q.t, kv.t, kv.t, pk.t, pk.t, layout, 1.0f / 16, out.t); };
          });
}

TEST(DISABLED_Perf, AttentionRowsOverPrefix) {
  time_attention(1024, 8, 64);
  time_attention(2048, 32, 12);
}

}  // namespace
}  // namespace kev
