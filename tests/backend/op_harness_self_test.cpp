// The harness must catch what it claims to catch: a backend that leaves an output element unwritten,
// writes past an output, writes into an input, or computes the wrong thing fails the case; a backend
// that refuses an op is reported as unsupported.
#include <gtest/gtest.h>

#include "backend/op_harness.h"

namespace kev::optest {
namespace {

enum class Sabotage { None, SkipLastRow, WritePastEnd, WriteInput, WrongMath, Refuse };

// Forwards to the CPU backend, except that `add` misbehaves as asked.
class Saboteur final : public Backend {
 public:
  Saboteur(std::shared_ptr<Backend> inner, Sabotage how) : inner_(std::move(inner)), how_(how) {}
  BackendInfo info() const override { return inner_->info(); }
  bool supports(const OpDesc& d) const override { return how_ != Sabotage::Refuse && inner_->supports(d); }
  Result<std::shared_ptr<Buffer>> alloc(size_t n, BufferUsage u) override { return inner_->alloc(n, u); }
  Status upload(const Tensor& d, const void* s, size_t n) override { return inner_->upload(d, s, n); }
  Status download(const Tensor& s, void* d, size_t n) override { return inner_->download(s, d, n); }
  Status fill_zero(const Tensor& d) override { return inner_->fill_zero(d); }
  Status synchronize() override { return inner_->synchronize(); }
  Status embedding(const Tensor& a, const Tensor& b, const Tensor& c) override { return inner_->embedding(a, b, c); }
  Status rms_norm(const Tensor& a, const Tensor& b, float e, const Tensor& c) override {
    return inner_->rms_norm(a, b, e, c);
  }
  Status add_rms_norm(const Tensor& a, const Tensor& b, const Tensor& c, float e, const Tensor& d) override {
    return inner_->add_rms_norm(a, b, c, e, d);
  }
  Status matmul(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) override {
    return inner_->matmul(a, b, c, d);
  }
  Status causal_conv1d_silu(const Tensor& a, const Tensor& b, const Tensor& c, const SeqLayout& l, const Tensor& d,
                            const Tensor& e) override {
    return inner_->causal_conv1d_silu(a, b, c, l, d, e);
  }
  Status gdn_gates(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e,
                   const Tensor& f) override {
    return inner_->gdn_gates(a, b, c, d, e, f);
  }
  Status l2_norm(const Tensor& a, float e, float s, const Tensor& b) override { return inner_->l2_norm(a, e, s, b); }
  Status gated_delta_rule(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e,
                          const Tensor& f, const SeqLayout& l, const Tensor& g, const Tensor& h) override {
    return inner_->gated_delta_rule(a, b, c, d, e, f, l, g, h);
  }
  Status rms_norm_gated(const Tensor& a, const Tensor& b, const Tensor& c, float e, const Tensor& d) override {
    return inner_->rms_norm_gated(a, b, c, e, d);
  }
  Status rope(const Tensor& x, const SeqLayout& l, int64_t n, double t) override { return inner_->rope(x, l, n, t); }
  Status attention(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e,
                   const SeqLayout& l, float s, const Tensor& f) override {
    return inner_->attention(a, b, c, d, e, l, s, f);
  }
  Status sigmoid_mul(const Tensor& a, const Tensor& b, const Tensor& c) override {
    return inner_->sigmoid_mul(a, b, c);
  }
  Status swiglu(const Tensor& a, const Tensor& b, const Tensor& c) override { return inner_->swiglu(a, b, c); }
  Status gather_rows(const Tensor& a, const Tensor& b, const Tensor& c) override {
    return inner_->gather_rows(a, b, c);
  }
  Status pointer_logits(const Tensor& a, const Tensor& b, const Tensor& c, float s, const Tensor& d) override {
    return inner_->pointer_logits(a, b, c, s, d);
  }
  Status copy(const Tensor& a, const Tensor& b) override { return inner_->copy(a, b); }

  Status add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    const int64_t n = out.shape[0];
    switch (how_) {
      case Sabotage::SkipLastRow:
        return inner_->add(a.slice(0, 0, n - 1), b.slice(0, 0, n - 1), out.slice(0, 0, n - 1));
      case Sabotage::WrongMath: return inner_->add(a, a, out);
      case Sabotage::WritePastEnd: {
        if (Status s = inner_->add(a, b, out); !s.ok()) return s;
        Tensor after = Tensor::contiguous(out.buffer, out.offset + out.span_bytes(), DType::F32, {1});
        return inner_->fill_zero(after);
      }
      case Sabotage::WriteInput: {
        if (Status s = inner_->add(a, b, out); !s.ok()) return s;
        return inner_->fill_zero(Tensor::contiguous(a.buffer, a.offset, DType::F32, {1}));
      }
      default: return inner_->add(a, b, out);
    }
  }

 private:
  std::shared_ptr<Backend> inner_;
  Sabotage how_;
};

std::shared_ptr<Backend> cpu(bool reference) {
  BackendOptions o;
  o.reference_mode = reference;
  return create_backend("cpu", o).value();
}

OpCase add_case() {
  return OpCase(OpKind::Add, "n=4,d=33", {in("x", {4, 33}, normal()), in("y", {4, 33}, normal()), out("out", {4, 33})},
                1e-12, [](Backend& b, const std::vector<Tensor>& t) { return b.add(t[0], t[1], t[2]); });
}

CaseReport run_with(Sabotage how) {
  Saboteur s(cpu(false), how);
  std::shared_ptr<Backend> ref = cpu(true);
  return run_case(add_case(), s, *ref);
}

TEST(OpHarness, PassesAnHonestBackend) {
  const CaseReport r = run_with(Sabotage::None);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(OpHarness, CatchesUnwrittenOutputs) {
  const CaseReport r = run_with(Sabotage::SkipLastRow);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("NaN/Inf"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.rfind("add(n=4,d=33)", 0), 0u) << r.message;
}

TEST(OpHarness, CatchesWritesPastTheOutput) {
  const CaseReport r = run_with(Sabotage::WritePastEnd);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("guard/gap overwritten"), std::string::npos) << r.message;
}

TEST(OpHarness, CatchesWritesIntoInputs) {
  const CaseReport r = run_with(Sabotage::WriteInput);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("an input was written"), std::string::npos) << r.message;
}

TEST(OpHarness, CatchesWrongResults) {
  const CaseReport r = run_with(Sabotage::WrongMath);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("FAIL"), std::string::npos) << r.message;
}

TEST(OpHarness, ReportsUnsupportedCases) {
  const CaseReport r = run_with(Sabotage::Refuse);
  EXPECT_FALSE(r.supported);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("not supported"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace kev::optest
