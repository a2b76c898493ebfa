// The registry, tensor views, and the CPU backend's memory and transfer contracts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "backend/backend.h"
#include "backend/test_tensors.h"

namespace kev {
namespace {

std::shared_ptr<Backend> cpu(bool reference = false) {
  BackendOptions o;
  o.reference_mode = reference;
  auto b = create_backend("cpu", o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? b.value() : nullptr;
}

TEST(Registry, ListsTheBuiltBackends) {
  std::vector<std::string> built{"cpu"};
#ifdef KEV_HAVE_CUDA
  built.push_back("cuda");
#endif
#ifdef KEV_HAVE_WEBGPU
  built.push_back("webgpu");
#endif
  EXPECT_EQ(available_backends(), built);
  auto b = cpu();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->info().name, "cpu");
  EXPECT_EQ(b->info().activation_dtype, DType::F32);
  EXPECT_NE(cpu(true)->info().device.find("reference mode"), std::string::npos);
}

TEST(Registry, OtherBackendsAreReportedAsNotBuilt) {
  const std::vector<std::string> built = available_backends();
  for (const char* name : {"cuda", "webgpu"}) {
    if (std::find(built.begin(), built.end(), name) != built.end()) continue;
    auto b = create_backend(name, {});
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), ErrorCode::Unsupported);
    EXPECT_NE(b.status().message().find("not built"), std::string::npos) << b.status().message();
    EXPECT_NE(b.status().message().find("cpu"), std::string::npos) << b.status().message();
  }
  auto unknown = create_backend("tpu", {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::Unsupported);
  EXPECT_NE(unknown.status().message().find("unknown backend 'tpu'"), std::string::npos);
}

TEST(Registry, RejectsBadThreadCounts) {
  BackendOptions o;
  o.threads = -1;
  auto b = create_backend("cpu", o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::InvalidRequest);
  o.threads = 3;
  auto three = create_backend("cpu", o);
  ASSERT_TRUE(three.ok());
  EXPECT_NE(three.value()->info().device.find("3 threads"), std::string::npos) << three.value()->info().device;
}

TEST(OpNames, AreDistinctSnakeCase) {
  std::set<std::string> names;
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    const std::string n = op_name(static_cast<OpKind>(k));
    EXPECT_NE(n, "unknown_op");
    EXPECT_TRUE(names.insert(n).second) << n;
  }
  EXPECT_STREQ(op_name(OpKind::GatedDeltaRule), "gated_delta_rule");
}

TEST(TensorViews, ShapesStridesAndSpans) {
  const Tensor t = Tensor::contiguous(nullptr, 16, DType::F32, {4, 3, 8});
  EXPECT_EQ(t.numel(), 96);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.span_bytes(), 96u * 4);
  EXPECT_EQ(t.describe(), "f32[4,3,8]");
  const Tensor s = t.slice(2, 2, 4);  // a column slice
  EXPECT_EQ(s.offset, 16u + 8);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.span_bytes(), static_cast<size_t>((3 * 24 + 2 * 8 + 3 + 1) * 4));
  EXPECT_EQ(s.describe(), "f32[4,3,4] strides [24,8,1]");
  const Tensor q = Tensor::contiguous(nullptr, 0, DType::BF16, {5, 512}).slice(1, 0, 256).split_last(2);
  EXPECT_EQ(q.rank, 3);
  EXPECT_EQ(q.dim(-1), 128);
  EXPECT_EQ(q.stride[0], 512);
  EXPECT_EQ(q.stride[1], 128);
  EXPECT_EQ(t.reshaped({12, 8}).stride[0], 8);
  EXPECT_EQ(Tensor::contiguous(nullptr, 0, DType::F32, {0, 8}).span_bytes(), 0u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_STREQ(dtype_name(DType::I32), "i32");
}

TEST(CpuMemory, BuffersAre64ByteAlignedHostMemory) {
  auto b = cpu();
  ASSERT_TRUE(b);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{1000003}}) {
    auto buf = b->alloc(bytes, BufferUsage::Weights);
    ASSERT_TRUE(buf.ok());
    EXPECT_EQ(buf.value()->size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.value()->handle()) % 64, 0u);
  }
  EXPECT_FALSE(b->alloc(SIZE_MAX - 8, BufferUsage::Weights).ok());
  EXPECT_TRUE(b->synchronize().ok());
}

TEST(CpuMemory, UploadDownloadFillZeroRoundTrip) {
  auto b = cpu();
  ASSERT_TRUE(b);
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 3.5f;
  testing::DeviceTensor d = testing::make_f32(*b, {4, 6}, v);
  EXPECT_EQ(testing::read_f32(*b, d.t), v);
  EXPECT_EQ(std::memcmp(d.buffer->handle(), v.data(), v.size() * 4), 0);  // handle() is the host pointer
  const Tensor second_row = Tensor::contiguous(d.buffer.get(), 6 * 4, DType::F32, {6});
  ASSERT_TRUE(b->fill_zero(second_row).ok());
  const std::vector<float> after = testing::read_f32(*b, d.t);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], (i >= 6 && i < 12) ? 0.0f : v[i]) << i;
}

TEST(CpuMemory, TransfersAreBoundsChecked) {
  auto b = cpu();
  ASSERT_TRUE(b);
  auto buf = b->alloc(64, BufferUsage::Staging);
  ASSERT_TRUE(buf.ok());
  std::vector<float> host(32);
  const Tensor fits = Tensor::contiguous(buf.value().get(), 0, DType::F32, {16});
  const Tensor past_end = Tensor::contiguous(buf.value().get(), 8, DType::F32, {16});
  const Tensor strided = Tensor::contiguous(buf.value().get(), 0, DType::F32, {4, 4}).slice(1, 0, 2);
  EXPECT_TRUE(b->upload(fits, host.data(), 64).ok());
  Status s = b->upload(past_end, host.data(), 64);
  EXPECT_EQ(s.code(), ErrorCode::InvalidRequest);
  EXPECT_NE(s.message().find("spans 64 bytes; its buffer has 64"), std::string::npos) << s.message();
  s = b->upload(fits, host.data(), 60);
  EXPECT_EQ(s.code(), ErrorCode::InvalidRequest);
  EXPECT_NE(s.message().find("holds 64 bytes but 60 were given"), std::string::npos) << s.message();
  EXPECT_FALSE(b->download(past_end, host.data(), 64).ok());
  EXPECT_FALSE(b->download(strided, host.data(), 32).ok());
  EXPECT_FALSE(b->fill_zero(past_end).ok());
  EXPECT_FALSE(b->upload(fits, nullptr, 64).ok());
  EXPECT_FALSE(b->upload(Tensor{}, host.data(), 0).ok());
}

TEST(CpuCopy, Bf16NarrowingRoundsToNearestEven) {
  for (bool reference : {false, true}) {
    auto b = cpu(reference);
    ASSERT_TRUE(b);
    const uint32_t in_bits[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff800000u, 0x7fc00001u};
    const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0x7f80, 0xff80, 0x7fc0};
    std::vector<float> in(6);
    std::memcpy(in.data(), in_bits, sizeof in_bits);
    testing::DeviceTensor x = testing::make_f32(*b, {6}, in);
    auto buf = b->alloc(12, BufferUsage::Activations);
    ASSERT_TRUE(buf.ok());
    const Tensor out = Tensor::contiguous(buf.value().get(), 0, DType::BF16, {6});
    ASSERT_TRUE(b->copy(x.t, out).ok());
    uint16_t got[6];
    ASSERT_TRUE(b->download(out, got, sizeof got).ok());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], want[i]) << "element " << i << " reference=" << reference;
    // And back: widening is exact.
    testing::DeviceTensor back = testing::make_f32(*b, {6});
    ASSERT_TRUE(b->copy(out, back.t).ok());
    const std::vector<float> wide = testing::read_f32(*b, back.t);
    uint32_t wide_bits[6];
    std::memcpy(wide_bits, wide.data(), sizeof wide_bits);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(wide_bits[i], static_cast<uint32_t>(want[i]) << 16);
  }
}

}  // namespace
}  // namespace kev
