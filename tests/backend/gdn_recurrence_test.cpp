// Checks the yardstick itself: the FAST chunked gated delta rule against a plain recurrence written
// here, independently of the backend (value-major columns, double), for every length T = 1..200 so
// every ragged-chunk case is covered, from zero and non-zero initial states; and that the shared
// initial state is never written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/test_tensors.h"

namespace kev {
namespace {

using testing::DeviceTensor;
using testing::make_f32;
using testing::read_f32;

struct Inputs {
  int64_t n, Hk, Hv, dk, dv;
  std::vector<float> q, k, v, g, beta, state;
};

Inputs random_inputs(int64_t n, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, uint64_t seed) {
  Inputs in{n, Hk, Hv, dk, dv, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  auto unit_rows = [&](std::vector<float>& x, int64_t rows, int64_t d, double norm) {
    x.resize(rows * d);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) {
        x[r * d + j] = static_cast<float>(nd(rng));
        ss += static_cast<double>(x[r * d + j]) * x[r * d + j];
      }
      for (int64_t j = 0; j < d; ++j) x[r * d + j] = static_cast<float>(x[r * d + j] * norm / std::sqrt(ss));
    }
  };
  unit_rows(in.q, n * Hk, dk, 1.0 / std::sqrt(static_cast<double>(dk)));
  unit_rows(in.k, n * Hk, dk, 1.0);
  for (int64_t i = 0; i < n * Hv * dv; ++i) in.v.push_back(static_cast<float>(nd(rng)));
  for (int64_t i = 0; i < n * Hv; ++i) {
    in.g.push_back(static_cast<float>(-std::log1p(std::exp(nd(rng))) * std::exp(0.5 * nd(rng))));
    in.beta.push_back(static_cast<float>(ud(rng)));
  }
  for (int64_t i = 0; i < Hv * dk * dv; ++i) in.state.push_back(static_cast<float>(0.3 * nd(rng)));
  return in;
}

// out [n,Hv,dv] and final state [Hv,dk,dv] of tokens [begin, end) from `initial` (or zero).
void recurrence(const Inputs& in, int64_t begin, int64_t end, bool from_state, std::vector<double>& out,
                std::vector<double>& final_state) {
  const int64_t dk = in.dk, dv = in.dv, ratio = in.Hv / in.Hk;
  out.resize(in.n * in.Hv * dv);
  final_state.assign(in.Hv * dk * dv, 0.0);
  for (int64_t h = 0; h < in.Hv; ++h) {
    const int64_t kh = h / ratio;
    // col[j] is column j of S (a dk-vector): the value-major view of the key-major state.
    std::vector<std::vector<double>> col(dv, std::vector<double>(dk, 0.0));
    if (from_state) {
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) col[j][i] = in.state[(h * dk + i) * dv + j];
      }
    }
    for (int64_t t = begin; t < end; ++t) {
      const float* q = &in.q[(t * in.Hk + kh) * dk];
      const float* k = &in.k[(t * in.Hk + kh) * dk];
      const double alpha = std::exp(static_cast<double>(in.g[t * in.Hv + h]));
      const double beta = in.beta[t * in.Hv + h];
      for (int64_t j = 0; j < dv; ++j) {
        std::vector<double>& s = col[j];
        double sk = 0;
        for (int64_t i = 0; i < dk; ++i) {
          s[i] *= alpha;
          sk += s[i] * k[i];
        }
        const double delta = in.v[(t * in.Hv + h) * dv + j] - sk;
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) {
          s[i] += beta * delta * k[i];
          o += s[i] * q[i];
        }
        out[(t * in.Hv + h) * dv + j] = o;
      }
    }
    for (int64_t i = 0; i < dk; ++i) {
      for (int64_t j = 0; j < dv; ++j) final_state[(h * dk + i) * dv + j] = col[j][i];
    }
  }
}

double nmse(const std::vector<float>& x, const std::vector<double>& ref, size_t begin, size_t end) {
  double e = 0, r = 0;
  for (size_t i = begin; i < end; ++i) {
    e += (x[i] - ref[i]) * (x[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return r > 0 ? e / r : e;
}

uint64_t hash_bytes(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::shared_ptr<Backend> fast_cpu() {
  auto b = create_backend("cpu", BackendOptions{});
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? b.value() : nullptr;
}

constexpr double kTol = 1e-9;  // as the op table's GDN tolerance

TEST(GdnChunkedVsRecurrence, EveryLengthUpTo200SingleSequence) {
  std::shared_ptr<Backend> b = fast_cpu();
  ASSERT_TRUE(b);
  for (int64_t T = 1; T <= 200; ++T) {
    for (bool from_state : {false, true}) {
      const Inputs in = random_inputs(T, 1, 2, 16, 24, 1000 + T);
      DeviceTensor q = make_f32(*b, {T, 1, 16}, in.q), k = make_f32(*b, {T, 1, 16}, in.k);
      DeviceTensor v = make_f32(*b, {T, 2, 24}, in.v), g = make_f32(*b, {T, 2}, in.g);
      DeviceTensor beta = make_f32(*b, {T, 2}, in.beta), s0 = make_f32(*b, {2, 16, 24}, in.state);
      DeviceTensor o = make_f32(*b, {T, 2, 24}), s1 = make_f32(*b, {2, 16, 24});
      SeqLayout layout;
      layout.offsets = {0, static_cast<int32_t>(T)};
      layout.from_prefix = from_state;
      ASSERT_TRUE(b->gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, s0.t, layout, o.t, s1.t).ok());
      std::vector<double> want_out, want_state;
      recurrence(in, 0, T, from_state, want_out, want_state);
      const std::vector<float> got_out = read_f32(*b, o.t), got_state = read_f32(*b, s1.t);
      EXPECT_LE(nmse(got_out, want_out, 0, got_out.size()), kTol) << "T=" << T << " from_state=" << from_state;
      EXPECT_LE(nmse(got_state, want_state, 0, got_state.size()), kTol) << "T=" << T << " from_state=" << from_state;
    }
  }
}

TEST(GdnChunkedVsRecurrence, PackedLengths1To200FromSharedStateAtRealHeadSize) {
  std::shared_ptr<Backend> b = fast_cpu();
  ASSERT_TRUE(b);
  // Every length 1..200 would be 20,100 tokens at dk = dv = 128; take every 7th length plus the
  // chunk boundaries, still well over a hundred ragged-chunk shapes.
  std::vector<int64_t> lengths;
  for (int64_t T = 1; T <= 200; T += 7) lengths.push_back(T);
  for (int64_t T : {63, 64, 65, 128, 129, 192, 200}) lengths.push_back(T);
  SeqLayout layout;
  layout.from_prefix = true;
  for (int64_t T : lengths) layout.offsets.push_back(layout.offsets.back() + static_cast<int32_t>(T));
  const int64_t n = layout.n_tokens(), Hk = 2, Hv = 4, d = 128;
  const Inputs in = random_inputs(n, Hk, Hv, d, d, 7);
  DeviceTensor q = make_f32(*b, {n, Hk, d}, in.q), k = make_f32(*b, {n, Hk, d}, in.k);
  DeviceTensor v = make_f32(*b, {n, Hv, d}, in.v), g = make_f32(*b, {n, Hv}, in.g);
  DeviceTensor beta = make_f32(*b, {n, Hv}, in.beta), s0 = make_f32(*b, {Hv, d, d}, in.state);
  DeviceTensor o = make_f32(*b, {n, Hv, d});
  const uint64_t before = hash_bytes(read_f32(*b, s0.t));
  ASSERT_TRUE(b->gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, s0.t, layout, o.t, Tensor{}).ok());
  EXPECT_EQ(hash_bytes(read_f32(*b, s0.t)), before) << "state_in was modified";
  EXPECT_EQ(hash_bytes(read_f32(*b, s0.t)), hash_bytes(in.state));
  const std::vector<float> got = read_f32(*b, o.t);
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    std::vector<double> want, unused;
    recurrence(in, layout.offsets[r], layout.offsets[r + 1], true, want, unused);
    const size_t lo = static_cast<size_t>(layout.offsets[r] * Hv * d),
                 hi = static_cast<size_t>(layout.offsets[r + 1] * Hv * d);
    EXPECT_LE(nmse(got, want, lo, hi), kTol) << "sequence " << r << " of length " << lengths[r];
  }
}

}  // namespace
}  // namespace kev
