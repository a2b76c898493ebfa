// The fused residual add + RMSNorm must leave the CPU's results exactly as they were when the forward
// ran add(x, y, x) then rms_norm(x, w, eps, out): same x and same out, bit for bit, in both modes
// (the golden parity of the engine rests on it). The op tables (op_cases_support.cpp) check its
// accuracy against the reference; this checks it against the two ops it replaces.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>

#include "backend/test_tensors.h"

namespace kev {
namespace {

using testing::make_f32;
using testing::randn;
using testing::read_f32;

struct Shape {
  int64_t n, h, d;  // x [n, h, d]; h = 1 is the hidden state [n, d]
};

class AddRmsNormCpu : public ::testing::TestWithParam<bool> {};

TEST_P(AddRmsNormCpu, EqualsAddThenRmsNormBitForBit) {
  BackendOptions o;
  o.reference_mode = GetParam();
  auto r = create_backend("cpu", o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Backend& b = **r;
  const float eps = 1e-6f;
  for (const Shape& s : {Shape{9, 1, 1024}, Shape{4, 1, 2560}, Shape{3, 2, 33}}) {
    SCOPED_TRACE("n=" + std::to_string(s.n) + ",h=" + std::to_string(s.h) + ",d=" + std::to_string(s.d));
    const size_t count = static_cast<size_t>(s.n * s.h * s.d);
    const std::vector<float> x0 = randn(count, 3.0f, 1), y = randn(count, 1.0f, 2);
    const std::vector<float> w = randn(static_cast<size_t>(s.d), 0.1f, 3);
    auto tensors = [&] {
      return std::array{make_f32(b, {s.n, s.h, s.d}, x0), make_f32(b, {s.n, s.h, s.d}, y), make_f32(b, {s.d}, w),
                        make_f32(b, {s.n, s.h, s.d})};
    };
    auto composite = tensors(), fused = tensors();
    ASSERT_TRUE(b.add(composite[0].t, composite[1].t, composite[0].t).ok());
    ASSERT_TRUE(b.rms_norm(composite[0].t, composite[2].t, eps, composite[3].t).ok());
    const Status st = b.add_rms_norm(fused[0].t, fused[1].t, fused[2].t, eps, fused[3].t);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int i : {0, 3}) {
      const std::vector<float> want = read_f32(b, composite[i].t), got = read_f32(b, fused[i].t);
      ASSERT_EQ(want.size(), got.size());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << (i == 0 ? "x" : "out");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AddRmsNormCpu, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "reference" : "fast"; });

}  // namespace
}  // namespace kev
