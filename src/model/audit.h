// Op audit: every op the state (prefill) and score passes call, with operand shapes and dtypes, and
// whether a given backend supports each call — what kev_export prints for the backend it targets.
//
//   KEV_ASSIGN_OR_RETURN(kev::OpAudit audit, kev::audit_ops(config, pointer_dim, "bf16", "cuda",
//                                                           kev::AuditShape::for_limits(limits)));
//   std::cout << kev::format_audit(audit);
//   if (audit.unsupported() > 0) ...
//
// The audit cannot drift from the forward: it runs the real ModelRunner::prefill and ::score through a
// recording backend that allocates no memory and does no arithmetic, with weights that have shapes but
// no values, and records each OpDesc the runner asks supports() for. The target backend is then asked
// supports() for every distinct call. A backend not built into this binary is reported as such (every
// op "not available in this build") rather than as an error. Shapes depend on the token counts; the
// audit uses the largest ones the limits allow (a full prefix, rows as long as max_context permits).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kev/kev.h"
#include "kev/result.h"
#include "model/config.h"

namespace kev {

struct AuditShape {
  int64_t prefix_tokens = 384;  // Ls of the state pass
  int64_t rows = 2;             // question rows packed into the score pass
  int64_t row_tokens = 640;     // tokens per row (at least 4: question, open, close, decide)
  // prefix_tokens = max_prefix; rows of max_context - max_prefix tokens (at least 4).
  static AuditShape for_limits(const Limits& limits);
};

enum class OpSupport { Supported, Unsupported, NotBuilt };
const char* op_support_name(OpSupport s);  // "supported", "NOT SUPPORTED", "not available in this build"

struct AuditedOp {
  std::string pass;      // "prefill" | "score"
  OpKind op = OpKind::Matmul;
  std::string operands;  // e.g. "f32[384,1024], bf16[6144,1024], -, f32[384,6144]" ("-" = absent)
  int64_t calls = 0;     // identical calls within the pass
  OpSupport support = OpSupport::NotBuilt;
};

struct OpAudit {
  std::string backend;          // the backend asked
  std::string backend_device;   // its info().device, when built
  std::string unavailable;      // why it could not be asked (empty when it was)
  std::string matmul_dtype;     // projection weights as the backend would hold them: "f32" | "bf16"
  AuditShape shape;
  std::vector<AuditedOp> ops;   // first-call order; identical (pass, op, operands) merged
  int64_t unsupported() const;  // distinct calls the backend refuses (0 when it is not built)
  int64_t total_calls() const;
};

// `dtype`: the backbone dtype of the model file ("fp32" | "bf16"). Errors only for an invalid shape or
// configuration; an unavailable backend is reported inside the OpAudit.
Result<OpAudit> audit_ops(const ModelConfig& config, int64_t pointer_dim, const std::string& dtype,
                          const std::string& backend, const AuditShape& shape);

// A table, one line per distinct call, plus a verdict line.
std::string format_audit(const OpAudit& audit);

}  // namespace kev
