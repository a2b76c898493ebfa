// Conversions of common/bf16.h: exactness of widening, round-to-nearest-even narrowing (checked
// against the compiler's own _Float16 conversion and against a nearest-value search for bf16),
// specials, and common/host_tensor.h basics.
#include "common/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/host_tensor.h"

namespace kev {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16, KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(f32_to_bf16(3.14159265f), 0x4049);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(Bf16, TiesRoundToEven) {
  // 1 + 2^-8 lies exactly between bf16 1.0 (even) and 1 + 2^-7 (odd): rounds down to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);
  // 1 + 3·2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
  // Just above a tie rounds up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  // The largest finite float rounds past bf16's largest finite value to infinity.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Bf16, NanStaysNan) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload lies only in the dropped low bits must not become infinity.
  const uint16_t h = f32_to_bf16(from_bits(0x7f800001));
  EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
  EXPECT_EQ(f32_to_bf16(from_bits(0xffc00000)) & 0x8000, 0x8000);  // sign kept
}

TEST(Bf16, WideningIsExactAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(Bf16, NarrowingPicksTheNearestValue) {
  // Sample every float bit pattern with a stride coprime to the bf16 step.
  for (uint64_t u = 0; u <= 0xffffffffu; u += 40961) {
    const float f = from_bits(static_cast<uint32_t>(u));
    if (!std::isfinite(f)) continue;
    const uint16_t r = f32_to_bf16(f);
    const double got = bf16_to_f32(r);
    if (std::isinf(got)) {
      ASSERT_GE(std::fabs(f), 3.3961e38f) << std::hex << u;  // only values rounding past the max
      continue;
    }
    // Neighbours in bf16 (by bit pattern) are never closer; on a tie the result is even.
    for (int delta : {-1, 1}) {
      const uint16_t n = static_cast<uint16_t>(r + delta);
      const double other = bf16_to_f32(n);
      if (std::isnan(other) || std::isinf(other)) continue;
      const double d_got = std::fabs(got - f), d_other = std::fabs(other - f);
      ASSERT_LE(d_got, d_other) << std::hex << u;
      if (d_got == d_other && got != other) {
        ASSERT_EQ(r & 1, 0) << std::hex << u;
      }
    }
  }
}

TEST(F16, WideningMatchesTheCompiler) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const _Float16 ref = std::bit_cast<_Float16>(static_cast<uint16_t>(h));
    const float want = static_cast<float>(ref);
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(bits(got), bits(want)) << std::hex << h;
    }
  }
}

TEST(F16, NarrowingMatchesTheCompiler) {
  auto check = [](uint32_t u) {
    const float f = from_bits(u);
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_to_f32(got))) << std::hex << u;
    } else {
      ASSERT_EQ(got, want) << std::hex << u << " (" << f << ")";
    }
  };
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) check(static_cast<uint32_t>(u));
  // Every float in the half range's neighbourhood of exponents, densely: subnormals, the normal
  // boundary, the overflow threshold 65520.
  for (uint32_t e : {0x33000000u, 0x33800000u, 0x38000000u, 0x38800000u, 0x477f0000u}) {
    for (uint32_t m = 0; m < (1u << 23); m += 61) {
      check(e + m);
      check(0x80000000u | (e + m));
    }
  }
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(from_bits(0x33800000)), 0x0001);  // 2^-24, the smallest subnormal
  EXPECT_EQ(f32_to_f16(from_bits(0x33000000)), 0x0000);  // 2^-25: a tie, rounds to even zero
}

TEST(F16, BulkConversionsMatchScalar) {
  const float in[] = {1.5f, -0.1f, 65000.0f, 1e-7f};
  uint16_t half[4], bf[4];
  float back[4];
  f32_to_f16(in, half, 4);
  f32_to_bf16(in, bf, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(half[i], f32_to_f16(in[i]));
    EXPECT_EQ(bf[i], f32_to_bf16(in[i]));
  }
  f16_to_f32(half, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], f16_to_f32(half[i]));
  bf16_to_f32(bf, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], bf16_to_f32(bf[i]));
}

TEST(HostTensor, ShapeAndZeros) {
  HostTensor t = HostTensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.data.size(), 24u);
  EXPECT_EQ(t.rank(), 3u);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_EQ(HostTensor::zeros({}).numel(), 1);
  EXPECT_EQ(HostTensor::zeros({5, 0}).numel(), 0);
}

}  // namespace
}  // namespace kev
