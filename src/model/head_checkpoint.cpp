#include "model/head_checkpoint.h"

#include <array>
#include <cmath>
#include <string_view>

#include "common/check.h"
#include "io/sha256.h"
#include "io/torch_checkpoint.h"

namespace kev {

namespace {

constexpr std::array<std::string_view, 4> kHeadTensors{"q.weight", "q.bias", "k.weight", "k.bias"};
constexpr std::array<std::string_view, 11> kKnownKeys{
    "base",          "base_revision", "head",    "lora",   "head_dim", "option_isolation", "special_embeddings",
    "weights_dtype", "temperature",   "holdout", "weights"};

bool is_known_key(std::string_view key) {
  for (std::string_view k : kKnownKeys) {
    if (k == key) return true;
  }
  return false;
}

// Opaque objects (an argparse.Namespace, a numpy scalar) say so, since their "type" is a Python class.
Status wrong_type(std::string_view key, const PickleValue& v, const char* expected) {
  if (v.if_opaque()) {
    return Status(ErrorCode::InvalidArtifact,
                  cat("'", key, "' is a ", v.type_name(), " object, which this reader does not decode; expected ",
                      expected));
  }
  return Status(ErrorCode::InvalidArtifact, cat("'", key, "' has type ", v.type_name(), "; expected ", expected));
}

// The value under `key`, or nullptr when the key is missing or None (both mean "use the default").
const PickleValue* present(const PickleDict& d, std::string_view key) {
  const PickleValue* v = d.find(key);
  return (v == nullptr || v->is_none()) ? nullptr : v;
}

Status read_string(const PickleDict& d, std::string_view key, std::string& out) {
  const PickleValue* v = present(d, key);
  if (v == nullptr) return Status::success();
  if (!v->if_string()) return wrong_type(key, *v, "str");
  out = *v->if_string();
  return Status::success();
}

Status read_int(const PickleDict& d, std::string_view key, int64_t& out) {
  const PickleValue* v = present(d, key);
  if (v == nullptr) return Status::success();
  if (!v->if_int()) return wrong_type(key, *v, "int");
  out = *v->if_int();
  return Status::success();
}

Status read_bool(const PickleDict& d, std::string_view key, bool& out) {
  const PickleValue* v = present(d, key);
  if (v == nullptr) return Status::success();
  if (!v->if_bool()) return wrong_type(key, *v, "bool");
  out = *v->if_bool();
  return Status::success();
}

Status read_number(const PickleDict& d, std::string_view key, std::optional<double>& out) {
  const PickleValue* v = present(d, key);
  if (v == nullptr) return Status::success();
  if (!v->is_number()) return wrong_type(key, *v, "int or float");
  out = v->number();
  return Status::success();
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += cat(i ? ", " : "", shape[i]);
  return out + "]";
}

Result<HostTensor> read_head_tensor(const PickleDict& head, std::string_view name) {
  const PickleValue* v = head.find(name);
  KEV_CHECK(v != nullptr, ErrorCode::InvalidArtifact, "'head' has no '", name, "' tensor");
  if (!v->if_tensor()) return wrong_type(cat("head.", name), *v, "tensor");
  const TorchTensor& t = **v->if_tensor();
  KEV_CHECK(t.dtype == TorchDtype::Float32 || t.dtype == TorchDtype::BFloat16 || t.dtype == TorchDtype::Float16,
            ErrorCode::InvalidArtifact, "'head.", name, "' is ", torch_dtype_name(t.dtype),
            "; expected float32 (or bfloat16/float16)");
  KEV_ASSIGN_OR_RETURN(HostTensor out, t.to_host_f32());
  for (size_t i = 0; i < out.data.size(); ++i) {
    KEV_CHECK(std::isfinite(out.data[i]), ErrorCode::InvalidArtifact, "'head.", name, "' element ", i, " is ",
              out.data[i]);
  }
  return out;
}

Status read_head(const PickleDict& root, HeadCheckpoint& h) {
  const PickleValue* v = root.find("head");
  KEV_CHECK(v != nullptr, ErrorCode::InvalidArtifact, "required key 'head' is missing");
  const PickleDict* head = v->if_dict();
  if (head == nullptr) return wrong_type("head", *v, "dict of tensors");
  for (const auto& [key, value] : head->entries()) {
    const std::string* name = key.if_string();
    bool known = false;
    for (std::string_view n : kHeadTensors) known = known || (name && *name == n);
    KEV_CHECK(known, ErrorCode::InvalidArtifact, "'head' has an unexpected entry '",
              name ? *name : std::string(key.type_name()),
              "'; a Kev head holds only q.weight, q.bias, k.weight, k.bias");
  }
  KEV_ASSIGN_OR_RETURN(h.q_weight, read_head_tensor(*head, "q.weight"));
  KEV_ASSIGN_OR_RETURN(h.q_bias, read_head_tensor(*head, "q.bias"));
  KEV_ASSIGN_OR_RETURN(h.k_weight, read_head_tensor(*head, "k.weight"));
  KEV_ASSIGN_OR_RETURN(h.k_bias, read_head_tensor(*head, "k.bias"));

  const int64_t p = h.head_dim;
  const auto& qw = h.q_weight.shape;
  const auto& kw = h.k_weight.shape;
  KEV_CHECK(qw.size() == 2 && qw[0] == p && qw[1] > 0, ErrorCode::InvalidArtifact, "'head.q.weight' has shape ",
            shape_string(qw), "; expected [", p, ", d] with head_dim ", p);
  KEV_CHECK(kw.size() == 2 && kw[0] == p && kw[1] == qw[1], ErrorCode::InvalidArtifact, "'head.k.weight' has shape ",
            shape_string(kw), "; expected [", p, ", ", qw[1], "] to match q.weight");
  KEV_CHECK(h.q_bias.shape == std::vector<int64_t>{p}, ErrorCode::InvalidArtifact, "'head.q.bias' has shape ",
            shape_string(h.q_bias.shape), "; expected [", p, "]");
  KEV_CHECK(h.k_bias.shape == std::vector<int64_t>{p}, ErrorCode::InvalidArtifact, "'head.k.bias' has shape ",
            shape_string(h.k_bias.shape), "; expected [", p, "]");
  return Status::success();
}

Status parse(const PickleValue& root_value, HeadCheckpoint& h) {
  const PickleDict* root = root_value.if_dict();
  KEV_CHECK(root != nullptr, ErrorCode::InvalidArtifact, "holds a value of type ", root_value.type_name(),
            "; expected the dict Kev's trainer saves");
  for (const auto& [key, value] : root->entries()) {
    const std::string* name = key.if_string();
    KEV_CHECK(name != nullptr, ErrorCode::InvalidArtifact, "has a top-level key of type ", key.type_name(),
              "; Kev's keys are strings");
    if (!is_known_key(*name)) h.extra_keys.push_back(*name);
  }

  KEV_TRY(read_string(*root, "base", h.base));
  KEV_TRY(read_string(*root, "base_revision", h.base_revision));
  KEV_TRY(read_int(*root, "lora", h.lora));
  KEV_CHECK(h.lora >= 0, ErrorCode::InvalidArtifact, "'lora' is ", h.lora, "; the LoRA rank must be >= 0");
  KEV_TRY(read_int(*root, "head_dim", h.head_dim));
  KEV_CHECK(h.head_dim > 0, ErrorCode::InvalidArtifact, "'head_dim' is ", h.head_dim, "; it must be > 0");

  KEV_TRY(read_bool(*root, "option_isolation", h.option_isolation));
  KEV_TRY(read_bool(*root, "special_embeddings", h.special_embeddings));
  KEV_CHECK(!h.option_isolation, ErrorCode::Unsupported,
            "'option_isolation' is true; released Kev checkpoints never set option_isolation; refusing");
  KEV_CHECK(!h.special_embeddings, ErrorCode::Unsupported,
            "'special_embeddings' is true; released Kev checkpoints never set special_embeddings; refusing");

  KEV_TRY(read_string(*root, "weights_dtype", h.weights_dtype));
  KEV_CHECK(h.weights_dtype == "fp32" || h.weights_dtype == "bf16", ErrorCode::InvalidArtifact, "'weights_dtype' is '",
            h.weights_dtype, "'; expected \"fp32\" or \"bf16\"");
  KEV_TRY(read_string(*root, "weights", h.weights));
  KEV_CHECK(h.weights == "lora" || h.weights == "full", ErrorCode::InvalidArtifact, "'weights' is '", h.weights,
            "'; expected \"lora\" or \"full\"");

  std::optional<double> temperature;
  KEV_TRY(read_number(*root, "temperature", temperature));
  if (temperature) h.temperature = *temperature;
  KEV_CHECK(std::isfinite(h.temperature) && h.temperature > 0, ErrorCode::InvalidArtifact, "'temperature' is ",
            h.temperature, "; it must be finite and > 0");
  KEV_TRY(read_number(*root, "holdout", h.holdout));

  return read_head(*root, h);
}

}  // namespace

Result<HeadCheckpoint> read_head_checkpoint(const std::string& path) {
  KEV_ASSIGN_OR_RETURN(PickleValue root, read_torch_checkpoint(path));
  HeadCheckpoint h;
  if (Status s = parse(root, h); !s.ok()) return Status(s.code(), cat(path, ": ", s.message()));
  return h;
}

Result<std::string> checkpoint_id(const std::string& path) {
  KEV_ASSIGN_OR_RETURN(std::string hex, sha256_file_hex(path));
  return "sha256:" + hex;
}

}  // namespace kev
