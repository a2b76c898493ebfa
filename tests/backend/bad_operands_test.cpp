// Bad operands are errors that name the op and the mismatch, never crashes; supports() refuses the
// same operand sets; outputs are untouched when an op refuses.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/test_tensors.h"

namespace kev {
namespace {

using testing::DeviceTensor;
using testing::make_f32;
using testing::make_i32;

class BadOperands : public ::testing::Test {
 protected:
  void SetUp() override {
    for (bool reference : {false, true}) {
      BackendOptions o;
      o.reference_mode = reference;
      auto r = create_backend("cpu", o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      (reference ? ref_ : fast_) = r.value();
    }
  }
  // Both modes must refuse with `code` and a message holding `op` and `fragment`.
  template <class Call>
  void expect_refused(const char* op, ErrorCode code, const std::string& fragment, Call&& call) {
    for (Backend* b : {fast_.get(), ref_.get()}) {
      const Status s = call(*b);
      ASSERT_FALSE(s.ok()) << op << " accepted bad operands";
      EXPECT_EQ(s.code(), code) << s.to_string();
      EXPECT_NE(s.message().find(op), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << s.message();
    }
  }
  Backend& fast() { return *fast_; }

  std::shared_ptr<Backend> fast_, ref_;
};

SeqLayout one_seq(int32_t n, bool prefix) {
  SeqLayout l;
  l.offsets = {0, n};
  l.from_prefix = prefix;
  return l;
}

TEST_F(BadOperands, Matmul) {
  Backend& b = fast();
  DeviceTensor x = make_f32(b, {4, 8}), w = make_f32(b, {6, 7}), w_ok = make_f32(b, {6, 8});
  DeviceTensor out = make_f32(b, {4, 6}), bias = make_f32(b, {5});
  expect_refused("matmul", ErrorCode::InvalidRequest, "w is f32[6,7], expected [6,8] ([m,k])",
                 [&](Backend& be) { return be.matmul(x.t, w.t, Tensor{}, out.t); });
  expect_refused("matmul", ErrorCode::InvalidRequest, "bias",
                 [&](Backend& be) { return be.matmul(x.t, w_ok.t, bias.t, out.t); });
  expect_refused("matmul", ErrorCode::InvalidRequest, "out",
                 [&](Backend& be) { return be.matmul(x.t, w_ok.t, Tensor{}, x.t.slice(1, 0, 6)); });
  Tensor bf16 = x.t;
  bf16.dtype = DType::BF16;
  expect_refused("matmul", ErrorCode::Unsupported, "takes f32",
                 [&](Backend& be) { return be.matmul(bf16, w_ok.t, Tensor{}, out.t); });
  EXPECT_FALSE(b.supports(OpDesc{OpKind::Matmul, {x.t, w.t, Tensor{}, out.t}}));
  EXPECT_FALSE(b.supports(OpDesc{OpKind::Matmul, {x.t, w_ok.t, out.t}}));  // wrong operand count
  EXPECT_TRUE(b.supports(OpDesc{OpKind::Matmul, {x.t, w_ok.t, Tensor{}, out.t}}));
}

TEST_F(BadOperands, TensorsOutsideTheirBufferOrStrided) {
  Backend& b = fast();
  DeviceTensor x = make_f32(b, {4, 8}), out = make_f32(b, {4, 8}), w = make_f32(b, {8});
  Tensor past = x.t;
  past.offset = 4;
  expect_refused("rms_norm", ErrorCode::InvalidRequest, "its buffer has 128",
                 [&](Backend& be) { return be.rms_norm(past, w.t, 1e-6f, out.t); });
  Tensor strided = x.t;
  strided.stride[1] = 2;
  strided.shape[1] = 4;
  expect_refused("rms_norm", ErrorCode::InvalidRequest, "innermost stride 2",
                 [&](Backend& be) { return be.rms_norm(strided, w.t.slice(0, 0, 4), 1e-6f, out.t.slice(1, 0, 4)); });
  EXPECT_FALSE(b.supports(OpDesc{OpKind::RmsNorm, {strided, w.t, out.t}}));
  Tensor odd = x.t;
  odd.offset = 2;
  odd.shape[0] = 3;
  expect_refused("rms_norm", ErrorCode::InvalidRequest, "not a multiple of its element size",
                 [&](Backend& be) { return be.rms_norm(odd, w.t, 1e-6f, out.t.slice(0, 0, 3)); });

  // Memory the CPU backend did not allocate.
  struct Foreign : Buffer {
    size_t size() const override { return 1 << 20; }
    void* handle() const override { return nullptr; }
  } foreign;
  Tensor alien = x.t;
  alien.buffer = &foreign;
  expect_refused("rms_norm", ErrorCode::InvalidRequest, "did not allocate",
                 [&](Backend& be) { return be.rms_norm(alien, w.t, 1e-6f, out.t); });
  expect_refused("rms_norm", ErrorCode::InvalidRequest, "w is f32[7], expected [8] ([d])",
                 [&](Backend& be) { return be.rms_norm(x.t, w.t.slice(0, 0, 7), 1e-6f, out.t); });
  expect_refused("add", ErrorCode::InvalidRequest, "overlaps",
                 [&](Backend& be) { return be.add(x.t.slice(0, 0, 3), x.t.slice(0, 0, 3), x.t.slice(0, 1, 3)); });
}

TEST_F(BadOperands, AddRmsNorm) {
  Backend& b = fast();
  DeviceTensor x = make_f32(b, {4, 8}), y = make_f32(b, {4, 8}), w = make_f32(b, {8}), out = make_f32(b, {4, 8});
  DeviceTensor y_short = make_f32(b, {3, 8});
  expect_refused("add_rms_norm", ErrorCode::InvalidRequest, "y is f32[3,8]",
                 [&](Backend& be) { return be.add_rms_norm(x.t, y_short.t, w.t, 1e-6f, out.t); });
  expect_refused("add_rms_norm", ErrorCode::InvalidRequest, "w is f32[7], expected [8] ([d])",
                 [&](Backend& be) { return be.add_rms_norm(x.t, y.t, w.t.slice(0, 0, 7), 1e-6f, out.t); });
  Tensor y_bf16 = y.t;
  y_bf16.dtype = DType::BF16;
  expect_refused("add_rms_norm", ErrorCode::Unsupported, "takes f32",
                 [&](Backend& be) { return be.add_rms_norm(x.t, y_bf16, w.t, 1e-6f, out.t); });
  // x is rewritten, so out may not be x (the residual would be lost) and y may not be x.
  expect_refused("add_rms_norm", ErrorCode::InvalidRequest, "output out (bytes [0,128)) overlaps input x",
                 [&](Backend& be) { return be.add_rms_norm(x.t, y.t, w.t, 1e-6f, x.t); });
  expect_refused("add_rms_norm", ErrorCode::InvalidRequest, "output x (bytes [0,128)) overlaps input y",
                 [&](Backend& be) { return be.add_rms_norm(x.t, x.t, w.t, 1e-6f, out.t); });
  expect_refused("add_rms_norm", ErrorCode::InvalidRequest, "output out (bytes [0,128)) overlaps input y",
                 [&](Backend& be) { return be.add_rms_norm(x.t, y.t, w.t, 1e-6f, y.t); });
  EXPECT_FALSE(b.supports(OpDesc{OpKind::AddRmsNorm, {x.t, y_short.t, w.t, out.t}}));
  EXPECT_FALSE(b.supports(OpDesc{OpKind::AddRmsNorm, {x.t, y.t, out.t}}));  // wrong operand count
  EXPECT_TRUE(b.supports(OpDesc{OpKind::AddRmsNorm, {x.t, y.t, w.t, out.t}}));
}

TEST_F(BadOperands, GatedDeltaRule) {
  Backend& b = fast();
  const int32_t n = 6;
  DeviceTensor q = make_f32(b, {n, 2, 8}), k = make_f32(b, {n, 2, 8}), v = make_f32(b, {n, 3, 4});
  DeviceTensor v4 = make_f32(b, {n, 4, 4}), g = make_f32(b, {n, 4}), beta = make_f32(b, {n, 4});
  DeviceTensor s = make_f32(b, {4, 8, 4}), out = make_f32(b, {n, 4, 4}), s_bad = make_f32(b, {4, 4, 8});
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "Hv = 3 must be a multiple of key heads Hk = 2",
                 [&](Backend& be) {
                   return be.gated_delta_rule(q.t, k.t, v.t, g.t, beta.t, s.t, one_seq(n, true), out.t, Tensor{});
                 });
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "state_in is f32[4,4,8], expected [4,8,4]",
                 [&](Backend& be) {
                   return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, s_bad.t, one_seq(n, true), out.t, Tensor{});
                 });
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "from_prefix is set but state_in is empty",
                 [&](Backend& be) {
                   return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, Tensor{}, one_seq(n, true), out.t, Tensor{});
                 });
  SeqLayout two;
  two.offsets = {0, 2, n};
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "single-sequence", [&](Backend& be) {
    return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, s.t, two, out.t, s_bad.t.reshaped({4, 8, 4}));
  });
  SeqLayout short_layout;
  short_layout.offsets = {0, 5};
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "covers 5 tokens but the operands have 6",
                 [&](Backend& be) {
                   return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, s.t, short_layout, out.t, Tensor{});
                 });
  SeqLayout decreasing;
  decreasing.offsets = {0, 4, 3, n};
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "decrease", [&](Backend& be) {
    return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, s.t, decreasing, out.t, Tensor{});
  });
  DeviceTensor both = make_f32(b, {160});  // state_in and a state_out shifted by 16 elements
  const Tensor s_in = Tensor::contiguous(both.buffer.get(), 0, DType::F32, {4, 8, 4});
  const Tensor s_out = Tensor::contiguous(both.buffer.get(), 64, DType::F32, {4, 8, 4});
  expect_refused("gated_delta_rule", ErrorCode::InvalidRequest, "overlaps input state_in", [&](Backend& be) {
    return be.gated_delta_rule(q.t, k.t, v4.t, g.t, beta.t, s_in, one_seq(n, true), out.t, s_out);
  });
  EXPECT_FALSE(b.supports(OpDesc{OpKind::GatedDeltaRule, {q.t, k.t, v.t, g.t, beta.t, s.t, out.t, Tensor{}}}));
  EXPECT_TRUE(b.supports(OpDesc{OpKind::GatedDeltaRule, {q.t, k.t, v4.t, g.t, beta.t, s.t, out.t, s.t}}));
}

TEST_F(BadOperands, ConvAttentionRope) {
  Backend& b = fast();
  DeviceTensor x = make_f32(b, {5, 16}), w = make_f32(b, {16, 4}), w3 = make_f32(b, {16, 3}), st = make_f32(b, {16, 4});
  DeviceTensor out = make_f32(b, {5, 16});
  expect_refused(
      "causal_conv1d_silu", ErrorCode::InvalidRequest, "state_in is f32[16,4], expected [16,3]",
      [&](Backend& be) { return be.causal_conv1d_silu(x.t, w3.t, st.t, one_seq(5, true), out.t, Tensor{}); });
  SeqLayout two;
  two.offsets = {0, 1, 5};
  expect_refused("causal_conv1d_silu", ErrorCode::InvalidRequest, "single-sequence",
                 [&](Backend& be) { return be.causal_conv1d_silu(x.t, w.t, st.t, two, out.t, st.t); });
  expect_refused("causal_conv1d_silu", ErrorCode::InvalidRequest, "state_in is empty", [&](Backend& be) {
    return be.causal_conv1d_silu(x.t, w.t, Tensor{}, one_seq(5, true), out.t, Tensor{});
  });
  expect_refused("causal_conv1d_silu", ErrorCode::InvalidRequest, "overlaps", [&](Backend& be) {
    return be.causal_conv1d_silu(x.t, w.t, Tensor{}, one_seq(5, false), x.t, Tensor{});
  });

  DeviceTensor q = make_f32(b, {3, 6, 8}), kv = make_f32(b, {3, 4, 8}), ao = make_f32(b, {3, 6, 8});
  DeviceTensor pk = make_f32(b, {2, 4, 8});
  expect_refused("attention", ErrorCode::InvalidRequest, "H = 6 must be a multiple of KV heads Hkv = 4",
                 [&](Backend& be) { return be.attention(q.t, kv.t, kv.t, pk.t, pk.t, one_seq(3, true), 0.3f, ao.t); });
  DeviceTensor q8 = make_f32(b, {3, 8, 8}), ao8 = make_f32(b, {3, 8, 8});
  expect_refused("attention", ErrorCode::InvalidRequest, "both be given", [&](Backend& be) {
    return be.attention(q8.t, kv.t, kv.t, pk.t, Tensor{}, one_seq(3, true), 0.3f, ao8.t);
  });
  expect_refused("attention", ErrorCode::InvalidRequest, "prefix_k / prefix_v are empty", [&](Backend& be) {
    return be.attention(q8.t, kv.t, kv.t, Tensor{}, Tensor{}, one_seq(3, true), 0.3f, ao8.t);
  });
  EXPECT_TRUE(b.supports(OpDesc{OpKind::Attention, {q8.t, kv.t, kv.t, pk.t, pk.t, ao8.t}}));

  expect_refused("rope", ErrorCode::InvalidRequest, "n_rot = 5",
                 [&](Backend& be) { return be.rope(q.t, one_seq(3, true), 5, 1e4); });
  expect_refused("rope", ErrorCode::InvalidRequest, "n_rot = 10",
                 [&](Backend& be) { return be.rope(q.t, one_seq(3, true), 10, 1e4); });
  expect_refused("rope", ErrorCode::InvalidRequest, "theta",
                 [&](Backend& be) { return be.rope(q.t, one_seq(3, true), 8, -1.0); });
}

TEST_F(BadOperands, IndicesOutOfRangeLeaveOutputsUntouched) {
  Backend& b = fast();
  DeviceTensor table = make_f32(b, {10, 4}, std::vector<float>(40, 1.0f));
  DeviceTensor ids = make_i32(b, {3}, {1, 10, 2}), neg = make_i32(b, {3}, {0, -1, 2});
  DeviceTensor out = make_f32(b, {3, 4}, std::vector<float>(12, 7.0f));
  expect_refused("embedding", ErrorCode::InvalidRequest, "ids[1] = 10 is outside [0, 10)",
                 [&](Backend& be) { return be.embedding(table.t, ids.t, out.t); });
  EXPECT_EQ(testing::read_f32(b, out.t), std::vector<float>(12, 7.0f));
  expect_refused("gather_rows", ErrorCode::InvalidRequest, "idx[1] = -1",
                 [&](Backend& be) { return be.gather_rows(table.t, neg.t, out.t); });
  DeviceTensor u = make_f32(b, {2, 4}), kappa = make_f32(b, {3, 4}), logits = make_f32(b, {3});
  expect_refused("pointer_logits", ErrorCode::InvalidRequest, "question[1] = 10",
                 [&](Backend& be) { return be.pointer_logits(u.t, kappa.t, ids.t, 1.0f, logits.t); });
  Tensor f16 = table.t;
  f16.dtype = DType::F16;
  f16.shape[1] = 8;
  expect_refused("copy", ErrorCode::Unsupported, "f16", [&](Backend& be) { return be.copy(f16, f16); });
  expect_refused("embedding", ErrorCode::Unsupported, "f16",
                 [&](Backend& be) { return be.embedding(f16, ids.t, out.t); });
}

}  // namespace
}  // namespace kev
