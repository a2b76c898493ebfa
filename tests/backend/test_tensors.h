// Small helpers for backend tests that build operands by hand: a device tensor with its own buffer,
// made from host values, and read back.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace kev::testing {

struct DeviceTensor {
  std::shared_ptr<Buffer> buffer;
  Tensor t;
};

// A contiguous F32 tensor holding `values` (zeros when empty). Aborts the test on failure via gtest.
DeviceTensor make_f32(Backend& b, std::initializer_list<int64_t> shape, const std::vector<float>& values = {});
DeviceTensor make_i32(Backend& b, std::initializer_list<int64_t> shape, const std::vector<int32_t>& values);
std::vector<float> read_f32(Backend& b, const Tensor& t);
// `count` values drawn from N(0, scale²) by a seeded generator (same seed, same values).
std::vector<float> randn(size_t count, float scale, uint64_t seed);
// Σ(got − want)² / Σ want², in double; a size mismatch fails the test.
double nmse(const std::vector<float>& got, const std::vector<float>& want);

}  // namespace kev::testing
