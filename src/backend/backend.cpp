// Op names and the backend registry. A build lists every backend it knows; the ones compiled out
// have no factory and are reported as "not built" (the engine never compares backend names itself).
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef KEV_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef KEV_HAVE_WEBGPU
#include "backend/webgpu/webgpu_backend.h"
#endif
#include "common/check.h"

namespace kev {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::Embedding: return "embedding";
    case OpKind::RmsNorm: return "rms_norm";
    case OpKind::AddRmsNorm: return "add_rms_norm";
    case OpKind::Matmul: return "matmul";
    case OpKind::CausalConv1dSilu: return "causal_conv1d_silu";
    case OpKind::GdnGates: return "gdn_gates";
    case OpKind::L2Norm: return "l2_norm";
    case OpKind::GatedDeltaRule: return "gated_delta_rule";
    case OpKind::RmsNormGated: return "rms_norm_gated";
    case OpKind::Rope: return "rope";
    case OpKind::Attention: return "attention";
    case OpKind::SigmoidMul: return "sigmoid_mul";
    case OpKind::Swiglu: return "swiglu";
    case OpKind::Add: return "add";
    case OpKind::GatherRows: return "gather_rows";
    case OpKind::PointerLogits: return "pointer_logits";
    case OpKind::Copy: return "copy";
    case OpKind::kCount: break;
  }
  return "unknown_op";
}

namespace {

using Factory = Result<std::shared_ptr<Backend>> (*)(const BackendOptions&);

struct Entry {
  const char* name;
  Factory create;  // null: known but not built into this binary
};

constexpr Entry kBackends[] = {
    {"cpu", &create_cpu_backend},
#ifdef KEV_HAVE_CUDA
    {"cuda", &create_cuda_backend},
#else
    {"cuda", nullptr},
#endif
#ifdef KEV_HAVE_WEBGPU
    {"webgpu", &create_webgpu_backend},
#else
    {"webgpu", nullptr},
#endif
};

std::string built_list() {
  std::string s;
  for (const Entry& e : kBackends) {
    if (e.create) s += (s.empty() ? "" : ", ") + std::string(e.name);
  }
  return s;
}

}  // namespace

Result<std::shared_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options) {
  for (const Entry& e : kBackends) {
    if (name != e.name) continue;
    KEV_CHECK(e.create != nullptr, ErrorCode::Unsupported, "backend '", name,
              "' is not built into this binary; available: ", built_list());
    return e.create(options);
  }
  return Status(ErrorCode::Unsupported, cat("unknown backend '", name, "'; available: ", built_list()));
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (const Entry& e : kBackends) {
    if (e.create) names.emplace_back(e.name);
  }
  return names;
}

}  // namespace kev
