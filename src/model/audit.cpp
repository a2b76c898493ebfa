#include "model/audit.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>

#include "common/check.h"
#include "model/forward.h"
#include "model/weights.h"

namespace kev {

namespace {

// Memory that is never touched: the recording backend hands it out so tensors have a buffer.
class NoMemory : public Buffer {
 public:
  explicit NoMemory(size_t bytes) : size_(bytes) {}
  size_t size() const override { return size_; }
  void* handle() const override { return nullptr; }

 private:
  size_t size_;
};

struct Recorded {
  std::string pass;
  OpDesc desc;
  std::string operands;
  int64_t calls = 0;
};

// Supports everything, records what it is asked, does nothing. Its buffers live as long as it does,
// so recorded tensors stay valid after the runner has released them.
class RecordingBackend : public Backend {
 public:
  std::string pass;  // labels what supports() records next

  BackendInfo info() const override { return {"audit", "records ops, runs none", DType::F32, SIZE_MAX}; }

  bool supports(const OpDesc& desc) const override {
    std::string operands;
    for (const Tensor& t : desc.operands) operands += (operands.empty() ? "" : ", ") + (t.empty() ? "-" : t.describe());
    const std::string key = pass + "|" + op_name(desc.op) + "|" + operands;
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, recorded_.size()).first;
      recorded_.push_back({pass, desc, operands, 0});
    }
    ++recorded_[it->second].calls;
    return true;
  }

  Result<std::shared_ptr<Buffer>> alloc(size_t bytes, BufferUsage) override {
    buffers_.push_back(std::make_shared<NoMemory>(bytes));
    return buffers_.back();
  }
  Status upload(const Tensor&, const void*, size_t) override { return Status::success(); }
  Status download(const Tensor&, void*, size_t) override { return Status::success(); }
  Status fill_zero(const Tensor&) override { return Status::success(); }
  Status synchronize() override { return Status::success(); }

  Status embedding(const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status rms_norm(const Tensor&, const Tensor&, float, const Tensor&) override { return Status::success(); }
  Status add_rms_norm(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) override {
    return Status::success();
  }
  Status matmul(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status causal_conv1d_silu(const Tensor&, const Tensor&, const Tensor&, const SeqLayout&, const Tensor&,
                            const Tensor&) override {
    return Status::success();
  }
  Status gdn_gates(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
    return Status::success();
  }
  Status l2_norm(const Tensor&, float, float, const Tensor&) override { return Status::success(); }
  Status gated_delta_rule(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const SeqLayout&, const Tensor&, const Tensor&) override {
    return Status::success();
  }
  Status rms_norm_gated(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) override {
    return Status::success();
  }
  Status rope(const Tensor&, const SeqLayout&, int64_t, double) override { return Status::success(); }
  Status attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const SeqLayout&, float,
                   const Tensor&) override {
    return Status::success();
  }
  Status sigmoid_mul(const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status swiglu(const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status add(const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status gather_rows(const Tensor&, const Tensor&, const Tensor&) override { return Status::success(); }
  Status pointer_logits(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) override {
    return Status::success();
  }
  Status copy(const Tensor&, const Tensor&) override { return Status::success(); }

  const std::vector<Recorded>& calls() const { return recorded_; }

 private:
  // supports() is const in the interface; recording is bookkeeping, not backend state.
  mutable std::vector<Recorded> recorded_;
  mutable std::map<std::string, size_t> index_;
  std::vector<std::shared_ptr<Buffer>> buffers_;
};

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

AuditShape AuditShape::for_limits(const Limits& limits) {
  AuditShape s;
  s.prefix_tokens = std::max<int64_t>(1, limits.max_prefix);
  s.row_tokens = std::max<int64_t>(4, limits.max_context - limits.max_prefix);
  return s;
}

const char* op_support_name(OpSupport s) {
  switch (s) {
    case OpSupport::Supported: return "supported";
    case OpSupport::Unsupported: return "NOT SUPPORTED";
    case OpSupport::NotBuilt: return "not available in this build";
  }
  return "?";
}

int64_t OpAudit::unsupported() const {
  return std::count_if(ops.begin(), ops.end(), [](const AuditedOp& o) { return o.support == OpSupport::Unsupported; });
}

int64_t OpAudit::total_calls() const {
  int64_t n = 0;
  for (const AuditedOp& o : ops) n += o.calls;
  return n;
}

Result<OpAudit> audit_ops(const ModelConfig& config, int64_t pointer_dim, const std::string& dtype,
                          const std::string& backend, const AuditShape& shape) {
  KEV_CHECK(shape.prefix_tokens >= 1 && shape.rows >= 1 && shape.row_tokens >= 4, ErrorCode::InvalidRequest,
            "audit shape: ", shape.prefix_tokens, " prefix tokens, ", shape.rows, " rows of ", shape.row_tokens,
            " tokens; need at least 1, 1 and 4");
  KEV_CHECK(dtype == "fp32" || dtype == "bf16", ErrorCode::InvalidRequest, "dtype '", dtype,
            "' is not one of fp32, bf16");
  KEV_CHECK(config.n_vocab > 0 && config.n_layers > 0, ErrorCode::InvalidRequest, "audit: empty model configuration");
  OpAudit audit;
  audit.backend = backend;
  audit.shape = shape;

  BackendOptions options;
  options.audit_only = true;  // supports() only: the export machine may have no such device
  Result<std::shared_ptr<Backend>> target = create_backend(backend, options);
  DType matmul_dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  if (target.ok()) {
    audit.backend_device = (*target)->info().device;
    matmul_dtype = matmul_dtype_for(**target, config, dtype);
  } else {
    audit.unavailable = target.status().message();
  }
  audit.matmul_dtype = dtype_name(matmul_dtype);

  // Weights with shapes and no values: upload_weights checks the shapes and uploads nothing to the recorder.
  auto recorder = std::make_shared<RecordingBackend>();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const WeightSpec& spec : weight_specs(config, pointer_dim)) shapes.emplace(spec.name, spec.shape);
  const TensorSource shape_only = [&](const std::string& name) -> Result<HostTensor> {
    auto it = shapes.find(name);
    KEV_CHECK(it != shapes.end(), ErrorCode::Internal, "audit: no weight spec for '", name, "'");
    HostTensor t;
    t.shape = it->second;
    return t;
  };
  KEV_ASSIGN_OR_RETURN(ModelWeights weights, upload_weights(*recorder, config, pointer_dim, shape_only, matmul_dtype));
  ModelRunner runner(recorder, config, std::move(weights), 1.0);

  recorder->pass = "prefill";
  const std::vector<int32_t> state(static_cast<size_t>(shape.prefix_tokens), 0);
  KEV_ASSIGN_OR_RETURN(PrefixState prefix, runner.prefill(state));

  // Rows of row_tokens: question, two options (open, close), filler, decide last.
  recorder->pass = "score";
  ScorePass pass;
  pass.layout.offsets = {0};
  pass.layout.pos0 = shape.prefix_tokens;
  pass.layout.from_prefix = true;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const int32_t base = static_cast<int32_t>(r * shape.row_tokens);
    pass.tokens.insert(pass.tokens.end(), static_cast<size_t>(shape.row_tokens), 0);
    pass.layout.offsets.push_back(static_cast<int32_t>(pass.tokens.size()));
    for (int32_t close : {2, 3}) {
      pass.option_rows.push_back(base + close);
      pass.option_question.push_back(static_cast<int32_t>(r));
    }
    pass.decide_rows.push_back(base + static_cast<int32_t>(shape.row_tokens) - 1);
  }
  KEV_TRY(runner.score(prefix, pass).status());

  for (const Recorded& r : recorder->calls()) {
    AuditedOp op;
    op.pass = r.pass;
    op.op = r.desc.op;
    op.operands = r.operands;
    op.calls = r.calls;
    op.support = !target.ok()                  ? OpSupport::NotBuilt
                 : (*target)->supports(r.desc) ? OpSupport::Supported
                                               : OpSupport::Unsupported;
    audit.ops.push_back(std::move(op));
  }
  return audit;
}

std::string format_audit(const OpAudit& a) {
  std::string s = cat("op audit for backend '", a.backend, "'",
                      a.backend_device.empty() ? std::string() : cat(" (", a.backend_device, ")"), ": projections ",
                      a.matmul_dtype, "; state pass of ", a.shape.prefix_tokens, " tokens, score pass of ",
                      a.shape.rows, " rows x ", a.shape.row_tokens, " tokens\n");
  if (!a.unavailable.empty()) s += cat("  ", a.unavailable, "\n");
  size_t support_width = 0;
  for (const AuditedOp& o : a.ops) {
    support_width = std::max(support_width, std::string(op_support_name(o.support)).size());
  }
  for (const AuditedOp& o : a.ops) {
    s += cat("  ", pad(o.pass, 8), pad(op_name(o.op), 20), pad(cat("x", o.calls), 6),
             pad(op_support_name(o.support), support_width + 2), o.operands, "\n");
  }
  const std::string counts = cat(a.ops.size(), " distinct calls (", a.total_calls(), " in all)");
  if (!a.unavailable.empty()) {
    s += cat(counts, ": backend '", a.backend, "' is not available in this build; support not checked\n");
  } else if (a.unsupported() == 0) {
    s += cat(counts, ": all supported by '", a.backend, "'\n");
  } else {
    s += cat(counts, ": ", a.unsupported(), " NOT supported by '", a.backend, "'\n");
  }
  return s;
}

}  // namespace kev
