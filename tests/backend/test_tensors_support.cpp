#include <random>

#include <gtest/gtest.h>

#include "backend/test_tensors.h"

namespace kev::testing {

namespace {

DeviceTensor make(Backend& b, std::initializer_list<int64_t> shape, DType dt, const void* data, size_t count) {
  DeviceTensor d;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto buf = b.alloc(static_cast<size_t>(n) * dtype_size(dt), BufferUsage::Activations);
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  if (!buf.ok()) return d;
  d.buffer = buf.value();
  d.t = Tensor::contiguous(d.buffer.get(), 0, dt, shape);
  if (count) {
    EXPECT_EQ(static_cast<int64_t>(count), n);
    const Status s = b.upload(d.t, data, count * dtype_size(dt));
    EXPECT_TRUE(s.ok()) << s.to_string();
  } else {
    const Status s = b.fill_zero(d.t);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  return d;
}

}  // namespace

DeviceTensor make_f32(Backend& b, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  return make(b, shape, DType::F32, values.data(), values.size());
}

DeviceTensor make_i32(Backend& b, std::initializer_list<int64_t> shape, const std::vector<int32_t>& values) {
  return make(b, shape, DType::I32, values.data(), values.size());
}

std::vector<float> read_f32(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const Status s = b.download(t, v.data(), v.size() * sizeof(float));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return v;
}

std::vector<float> randn(size_t count, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  return err / ref;
}

}  // namespace kev::testing
