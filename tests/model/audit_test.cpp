// The op audit (model/audit.h): it must list exactly the ops a real run of the forward calls, with
// the real operand shapes, and report backends that are not built without failing.
#include "model/audit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "model/checkpoint_import.h"
#include "model/forward.h"
#include "model/weights.h"

namespace kev {
namespace {

const std::string kBase = std::string(KEV_FIXTURES_DIR) + "/golden/tiny";

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "text: " << (haystack)

Result<OpenedCheckpoint> tiny() {
  EXPECT_TRUE(std::filesystem::exists(kBase + "/head.pt")) << "missing fixture " << kBase;
  return open_checkpoint(kBase, kBase);
}

// Calls per op kind, over both passes.
std::array<int64_t, static_cast<size_t>(OpKind::kCount)> per_kind(const OpAudit& a) {
  std::array<int64_t, static_cast<size_t>(OpKind::kCount)> n{};
  for (const AuditedOp& o : a.ops) n[static_cast<size_t>(o.op)] += o.calls;
  return n;
}

TEST(OpAudit, CountsEqualARealRunOfTheForward) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  AuditShape shape;
  shape.prefix_tokens = 7;
  shape.rows = 3;
  shape.row_tokens = 6;
  auto audit = audit_ops(ck->config, ck->meta.pointer_dim, "fp32", "cpu", shape);
  ASSERT_TRUE(audit.ok()) << audit.status().to_string();
  EXPECT_TRUE(audit->unavailable.empty()) << audit->unavailable;
  EXPECT_EQ(audit->unsupported(), 0) << format_audit(*audit);

  // The same passes on the CPU backend with the real weights.
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  auto weights = upload_weights(**backend, ck->config, ck->meta.pointer_dim, ck->tensors, DType::F32);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ModelRunner runner(*backend, ck->config, std::move(*weights), 1.0);
  auto prefix = runner.prefill(std::vector<int32_t>(7, 5));
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
  ScorePass pass;
  pass.layout.offsets = {0, 6, 12, 18};
  pass.layout.pos0 = 7;
  pass.layout.from_prefix = true;
  pass.tokens.assign(18, 5);
  pass.option_rows = {2, 3, 8, 9, 14, 15};
  pass.option_question = {0, 0, 1, 1, 2, 2};
  pass.decide_rows = {5, 11, 17};
  ASSERT_TRUE(runner.score(*prefix, pass).ok());

  const auto audited = per_kind(*audit);
  const OpStats& real = runner.op_stats();
  for (size_t i = 0; i < audited.size(); ++i) {
    EXPECT_EQ(static_cast<uint64_t>(audited[i]), real.calls[i]) << op_name(static_cast<OpKind>(i));
  }
  std::set<std::string> passes;
  for (const AuditedOp& o : audit->ops) passes.insert(o.pass);
  EXPECT_EQ(passes, (std::set<std::string>{"prefill", "score"}));
  // Each residual add is fused with the norm after it (2 per layer but the last, in both passes, plus
  // the score pass's last MLP with the final norm); only the score pass's last mixer add stays plain.
  const int64_t L = ck->config.n_layers;
  EXPECT_EQ(audited[static_cast<size_t>(OpKind::AddRmsNorm)], 4 * L - 3);
  EXPECT_EQ(audited[static_cast<size_t>(OpKind::Add)], 1);
}

TEST(OpAudit, ListsOperandShapesOfTheConfiguration) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  AuditShape shape;
  shape.prefix_tokens = 9;
  shape.rows = 2;
  shape.row_tokens = 5;
  auto audit = audit_ops(ck->config, ck->meta.pointer_dim, "fp32", "cpu", shape);
  ASSERT_TRUE(audit.ok()) << audit.status().to_string();
  // The stacked GDN input projections of the state pass (in_proj_qkv 256 + z 128 + b 4 + a 4 rows):
  // x [9,64] · W [392,64]ᵀ -> [9,392]; the head in the score pass.
  auto has = [&](const std::string& pass, OpKind op, const std::string& operands) {
    return std::any_of(audit->ops.begin(), audit->ops.end(), [&](const AuditedOp& o) {
      return o.pass == pass && o.op == op && o.operands == operands;
    });
  };
  EXPECT_TRUE(has("prefill", OpKind::Matmul, "f32[9,64], f32[392,64], -, f32[9,392]")) << format_audit(*audit);
  EXPECT_TRUE(has("score", OpKind::Embedding, "f32[1033,64], i32[10], f32[10,64]")) << format_audit(*audit);
  EXPECT_TRUE(has("score", OpKind::PointerLogits, "f32[2,256], f32[4,256], i32[4], f32[4]")) << format_audit(*audit);
  const std::string text = format_audit(*audit);
  EXPECT_CONTAINS(text, "op audit for backend 'cpu'");
  EXPECT_CONTAINS(text, "all supported by 'cpu'");
  EXPECT_CONTAINS(text, "gated_delta_rule");
}

TEST(OpAudit, Bf16ProjectionsFollowTheBackendsChoice) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  const DType expected = matmul_dtype_for(**backend, ck->config, "bf16");
  auto audit = audit_ops(ck->config, ck->meta.pointer_dim, "bf16", "cpu", AuditShape{});
  ASSERT_TRUE(audit.ok()) << audit.status().to_string();
  EXPECT_EQ(audit->matmul_dtype, dtype_name(expected));
  EXPECT_EQ(audit->unsupported(), 0) << format_audit(*audit);
  const bool bf16_operand = std::any_of(audit->ops.begin(), audit->ops.end(), [](const AuditedOp& o) {
    return o.op == OpKind::Matmul && o.operands.find("bf16[") != std::string::npos;
  });
  EXPECT_EQ(bf16_operand, expected == DType::BF16);
}

TEST(OpAudit, ABackendNotBuiltIsReportedNotFailed) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const std::vector<std::string> built = available_backends();
  std::string missing = "no-such-backend";
  for (const char* name : {"webgpu", "cuda"}) {
    if (std::find(built.begin(), built.end(), name) == built.end()) missing = name;
  }
  auto audit = audit_ops(ck->config, ck->meta.pointer_dim, "fp32", missing, AuditShape{});
  ASSERT_TRUE(audit.ok()) << audit.status().to_string();
  EXPECT_FALSE(audit->unavailable.empty());
  EXPECT_FALSE(audit->ops.empty());
  for (const AuditedOp& o : audit->ops) EXPECT_EQ(o.support, OpSupport::NotBuilt);
  EXPECT_EQ(audit->unsupported(), 0);
  const std::string text = format_audit(*audit);
  EXPECT_CONTAINS(text, "not available in this build");
  EXPECT_CONTAINS(text, missing);
}

TEST(OpAudit, RejectsADegenerateShape) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  AuditShape shape;
  shape.row_tokens = 3;
  auto audit = audit_ops(ck->config, ck->meta.pointer_dim, "fp32", "cpu", shape);
  ASSERT_FALSE(audit.ok());
  EXPECT_EQ(audit.status().code(), ErrorCode::InvalidRequest);
}

}  // namespace
}  // namespace kev
