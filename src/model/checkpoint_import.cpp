#include "model/checkpoint_import.h"

#include <cblas.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>

#include "common/bf16.h"
#include "common/check.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/head_checkpoint.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

namespace {

namespace fs = std::filesystem;

// Our names are HF text-decoder names without a prefix; checkpoints add one of these.
constexpr const char* kPrefixes[] = {"model.language_model.", "model.", ""};
// peft prefixes every adapter tensor with this, then the module path inside the wrapped model.
constexpr std::string_view kPeftPrefix = "base_model.model.";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// "runs/kev-0.8b/" -> "kev-0.8b".
std::string dir_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string base_text(const HeadCheckpoint& head) {
  if (head.base.empty()) return "head.pt names no base";
  return cat("head.pt names base '", head.base, "'",
             head.base_revision.empty() ? std::string() : cat(" at revision '", head.base_revision, "'"));
}

struct LoraPair {
  const SafeTensorInfo* a = nullptr;  // [r, in]
  const SafeTensorInfo* b = nullptr;  // [out, r]
};

struct Adapter {
  std::string config_path;
  SafetensorsFile file;
  int64_t rank = 0;
  double scale = 0;                       // s·α/r (or s·α/√r)
  std::map<std::string, LoraPair> pairs;  // our weight name -> its A and B
};

// Everything the TensorSource reads from; shared so the source outlives OpenedCheckpoint copies.
struct Sources {
  HeadCheckpoint head;
  SafetensorsSet weights;
  std::map<std::string, SafeTensorRef> refs;  // our name -> tensor in `weights`
  std::optional<Adapter> adapter;
};

// True when adapter_config.json sets `key` to something other than null / false / empty.
bool json_set(const nlohmann::json& cfg, const char* key) {
  if (!json_has(cfg, key)) return false;
  const nlohmann::json& v = cfg[key];
  if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return false;
  return !((v.is_object() || v.is_array() || v.is_string()) && v.empty());
}

Result<Adapter> open_adapter_files(const std::string& dir, int64_t head_rank, double user_scale) {
  const std::string path = dir + "/adapter_config.json";
  KEV_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json_file(path));
  KEV_ASSIGN_OR_RETURN(int64_t rank, json_int(cfg, "r", path));
  KEV_ASSIGN_OR_RETURN(double alpha, json_number(cfg, "lora_alpha", path));
  KEV_CHECK(rank > 0, ErrorCode::InvalidArtifact, path, ": r is ", rank, "; it must be positive");
  KEV_CHECK(std::isfinite(alpha), ErrorCode::InvalidArtifact, path, ": lora_alpha is ", alpha, "; it must be finite");
  KEV_CHECK(head_rank == 0 || head_rank == rank, ErrorCode::InvalidArtifact, path, ": r is ", rank,
            " but head.pt records lora = ", head_rank);
  if (json_has(cfg, "peft_type") && cfg["peft_type"].is_string()) {
    const std::string type = cfg["peft_type"].get<std::string>();
    KEV_CHECK(type == "LORA", ErrorCode::Unsupported, path, ": peft_type is '", type, "'; only LORA adapters merge");
  }
  bool rslora = false;
  if (json_has(cfg, "use_rslora") && !cfg["use_rslora"].is_null()) {
    KEV_ASSIGN_OR_RETURN(rslora, json_bool(cfg, "use_rslora", path));
  }
  for (const char* refused : {"trainable_token_indices", "modules_to_save"}) {
    KEV_CHECK(!json_set(cfg, refused), ErrorCode::Unsupported, path, ": '", refused,
              "' is set; Kev adapters never train extra tokens or modules, refusing");
  }
  for (const char* refused : {"use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern"}) {
    KEV_CHECK(!json_set(cfg, refused), ErrorCode::Unsupported, path, ": '", refused, "' is set to ",
              json_excerpt(cfg[refused]), "; only plain LoRA with one rank and alpha merges");
  }
  const std::string weights_path = dir + "/adapter_model.safetensors";
  KEV_CHECK(fs::exists(weights_path), ErrorCode::InvalidArtifact, "'", dir,
            "' has adapter_config.json but no adapter_model.safetensors");
  KEV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(weights_path));
  const double r = static_cast<double>(rank);
  return Adapter{path, std::move(file), rank, user_scale * (rslora ? alpha / std::sqrt(r) : alpha / r), {}};
}

// Pairs every adapter tensor with a projection of the backbone and checks the shapes; anything
// left over is an error. `specs` maps our projection names to their [out, in] shapes.
Status pair_adapter(Adapter& a, const std::map<std::string, std::vector<int64_t>>& specs) {
  const std::string& file = a.file.path();
  for (const SafeTensorInfo& info : a.file.tensors()) {
    const std::string& n = info.name;
    const bool is_a = n.ends_with(".lora_A.weight"), is_b = n.ends_with(".lora_B.weight");
    std::string ours;
    if (n.starts_with(kPeftPrefix) && (is_a || is_b)) {
      const std::string stem = n.substr(kPeftPrefix.size(), n.size() - kPeftPrefix.size() - 14);
      for (const char* p : kPrefixes) {
        const std::string_view prefix(p);
        if (!stem.starts_with(prefix)) continue;
        const std::string candidate = stem.substr(prefix.size()) + ".weight";
        if (specs.count(candidate)) {
          ours = candidate;
          break;
        }
      }
    }
    KEV_CHECK(!ours.empty(), ErrorCode::InvalidArtifact, file, ": adapter tensor '", n,
              "' matches no adapted projection of the backbone (unknown target, layer or tensor kind)");
    LoraPair& pair = a.pairs[ours];
    const SafeTensorInfo*& slot = is_a ? pair.a : pair.b;
    KEV_CHECK(slot == nullptr, ErrorCode::InvalidArtifact, file, ": '", slot ? slot->name : "", "' and '", n,
              "' both adapt '", ours, "'");
    slot = &info;
  }
  for (const auto& [name, pair] : a.pairs) {
    const std::string stem = name.substr(0, name.size() - 7);
    KEV_CHECK(pair.a && pair.b, ErrorCode::InvalidArtifact, file, ": '", stem, "' has lora_", pair.a ? "A" : "B",
              " but no lora_", pair.a ? "B" : "A", " tensor");
    const std::vector<int64_t>& w = specs.at(name);
    const std::vector<int64_t> want_a{a.rank, w[1]}, want_b{w[0], a.rank};
    KEV_CHECK(pair.a->shape == want_a && pair.b->shape == want_b, ErrorCode::InvalidArtifact, file,
              ": the adapter of '", name, "' has lora_A ", shape_text(pair.a->shape), " and lora_B ",
              shape_text(pair.b->shape), "; the weight ", shape_text(w), " with r = ", a.rank, " needs lora_A ",
              shape_text(want_a), " and lora_B ", shape_text(want_b));
  }
  return Status::success();
}

// peft's target_modules list names module kinds ("q_proj"); each projection of such a kind must have
// been adapted. Regex targets and layer filters are not expanded here (the pairing still checks shapes).
Status check_targets_present(const Adapter& a, const std::map<std::string, std::vector<int64_t>>& specs) {
  KEV_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json_file(a.config_path));
  if (!json_has(cfg, "target_modules") || !cfg["target_modules"].is_array()) return Status::success();
  for (const char* filter : {"layers_to_transform", "layers_pattern", "exclude_modules"}) {
    if (json_set(cfg, filter)) return Status::success();
  }
  std::set<std::string> targets;
  for (const nlohmann::json& t : cfg["target_modules"]) {
    if (t.is_string()) targets.insert(t.get<std::string>());
  }
  for (const auto& [name, shape] : specs) {
    const std::string stem = name.substr(0, name.size() - 7);
    const std::string kind = stem.substr(stem.rfind('.') + 1);
    KEV_CHECK(!targets.count(kind) || a.pairs.count(name), ErrorCode::InvalidArtifact, a.file.path(),
              ": no lora_A/lora_B tensors for '", stem, "', although ", a.config_path, " targets '", kind, "'");
  }
  return Status::success();
}

// W += scale · B·A in FP32 (row-major [out, in]).
Status merge_lora(const Adapter& a, const LoraPair& pair, HostTensor& w) {
  KEV_ASSIGN_OR_RETURN(HostTensor A, a.file.read_f32(*pair.a));
  KEV_ASSIGN_OR_RETURN(HostTensor B, a.file.read_f32(*pair.b));
  const int out = static_cast<int>(w.shape[0]), in = static_cast<int>(w.shape[1]), r = static_cast<int>(a.rank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out, in, r, static_cast<float>(a.scale), B.data.data(), r,
              A.data.data(), in, 1.0f, w.data.data(), in);
  return Status::success();
}

Result<HostTensor> read_tensor(const Sources& s, const std::string& name) {
  if (name.starts_with("kev_head.")) {
    const std::string part = name.substr(9);
    if (part == "q.weight") return s.head.q_weight;
    if (part == "q.bias") return s.head.q_bias;
    if (part == "k.weight") return s.head.k_weight;
    if (part == "k.bias") return s.head.k_bias;
  }
  auto it = s.refs.find(name);
  KEV_CHECK(it != s.refs.end(), ErrorCode::InvalidArtifact, "the checkpoint has no tensor '", name, "'");
  const SafeTensorRef& ref = it->second;
  KEV_ASSIGN_OR_RETURN(HostTensor t, ref.file->read_f32(*ref.info));
  if (t.shape.size() == 3 && name.ends_with("conv1d.weight")) t.shape = {t.shape[0], t.shape[2]};
  if (s.adapter) {
    auto pair = s.adapter->pairs.find(name);
    if (pair != s.adapter->pairs.end()) KEV_TRY(merge_lora(*s.adapter, pair->second, t));
  }
  return t;
}

bool float_dtype(StDtype d) {
  return d == StDtype::F32 || d == StDtype::BF16 || d == StDtype::F16 || d == StDtype::F64;
}

// Finds every backbone tensor the model needs and checks its shape (and, for full weights, its dtype)
// from the headers.
Status resolve_backbone(Sources& s, const std::string& dir, const std::vector<WeightSpec>& specs, bool full) {
  for (const WeightSpec& spec : specs) {
    if (spec.name.starts_with("kev_head.")) continue;
    std::optional<SafeTensorRef> ref;
    for (const char* p : kPrefixes) {
      if ((ref = s.weights.find(std::string(p) + spec.name))) break;
    }
    KEV_CHECK(ref.has_value(), ErrorCode::InvalidArtifact, "'", dir, "' has no tensor '", spec.name,
              "' (looked for it also under model.language_model. and model.)");
    const SafeTensorInfo& info = *ref->info;
    const bool conv_ok = spec.name.ends_with("conv1d.weight") && info.shape.size() == 3 && info.shape[1] == 1 &&
                         info.shape[0] == spec.shape[0] && info.shape[2] == spec.shape[1];
    KEV_CHECK(info.shape == spec.shape || conv_ok, ErrorCode::InvalidArtifact, "tensor '", info.name, "' in '",
              ref->file->path(), "' has shape ", shape_text(info.shape), "; the configuration needs ",
              shape_text(spec.shape));
    KEV_CHECK(float_dtype(info.dtype), ErrorCode::InvalidArtifact, "tensor '", info.name, "' in '",
              ref->file->path(), "' is ", st_dtype_name(info.dtype), "; weights must be F32, BF16, F16 or F64");
    if (full) {
      const StDtype want = s.head.weights_dtype == "bf16" ? StDtype::BF16 : StDtype::F32;
      KEV_CHECK(info.dtype == want, ErrorCode::InvalidArtifact, "head.pt says weights_dtype ", s.head.weights_dtype,
                " but tensor '", info.name, "' in '", ref->file->path(), "' is ", st_dtype_name(info.dtype));
    }
    s.refs.emplace(spec.name, *ref);
  }
  return Status::success();
}

// Writes `v` as `dtype` (F32 or BF16) in bounded chunks.
Status write_values(ByteSink& sink, const std::vector<float>& v, StDtype dtype) {
  if (dtype == StDtype::F32) return sink.write({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<uint16_t> buf(std::min(kChunk, v.size()));
  for (size_t i = 0; i < v.size(); i += kChunk) {
    const size_t n = std::min(kChunk, v.size() - i);
    f32_to_bf16(v.data() + i, buf.data(), n);
    KEV_TRY(sink.write({reinterpret_cast<const uint8_t*>(buf.data()), n * sizeof(uint16_t)}));
  }
  return Status::success();
}

}  // namespace

bool is_checkpoint_dir(const std::string& dir) {
  return fs::exists(dir + "/head.pt") && !fs::exists(dir + "/model.json");
}

std::string default_export_dtype(const std::string& backend) { return backend == "cuda" ? "bf16" : "fp32"; }

Result<OpenedCheckpoint> open_checkpoint(const std::string& checkpoint_dir, const std::string& base_dir,
                                         double lora_scale) {
  KEV_CHECK(std::isfinite(lora_scale), ErrorCode::InvalidRequest, "LoRA scale ", lora_scale, " is not finite");
  KEV_CHECK(fs::is_directory(checkpoint_dir), ErrorCode::Io, "checkpoint directory '", checkpoint_dir,
            "' does not exist");
  const std::string head_path = checkpoint_dir + "/head.pt";
  KEV_CHECK(fs::exists(head_path), ErrorCode::InvalidArtifact, "'", checkpoint_dir,
            "' has no head.pt; a Kev checkpoint directory holds head.pt plus its adapter or weights");
  auto s = std::make_shared<Sources>();
  KEV_ASSIGN_OR_RETURN(s->head, read_head_checkpoint(head_path));
  const HeadCheckpoint& head = s->head;
  OpenedCheckpoint out;
  ImportSummary& summary = out.summary;
  KEV_ASSIGN_OR_RETURN(summary.checkpoint_id, checkpoint_id(head_path));
  summary.temperature = head.temperature;
  summary.base = head.base;
  summary.base_revision = head.base_revision;
  summary.weights = head.weights;

  const bool full = head.weights == "full";
  if (base_dir.empty() && !full) {
    return Status(ErrorCode::InvalidRequest,
                  head.base.empty()
                      ? cat("no base model given and head.pt names none: pass the Qwen3.5 base's HF directory "
                            "with --base")
                      : cat("no base model given; ", base_text(head), ": download that snapshot and pass its "
                            "directory with --base"));
  }
  KEV_CHECK(base_dir.empty() || fs::is_directory(base_dir), ErrorCode::Io, "base directory '", base_dir,
            "' does not exist (", base_text(head), ")");
  const std::string weights_dir = full ? checkpoint_dir : base_dir;
  const std::string tokenizer_dir = base_dir.empty() ? checkpoint_dir : base_dir;
  const std::string config_path = weights_dir + "/config.json";
  KEV_CHECK(fs::exists(config_path), ErrorCode::InvalidArtifact, "'", weights_dir,
            "' has no config.json, so it is not an HF checkpoint",
            full ? std::string(" (head.pt says weights = full)") : cat(" (", base_text(head), ")"));
  KEV_ASSIGN_OR_RETURN(out.config, load_model_config(config_path));
  KEV_CHECK(head.n_embd() == out.config.n_embd, ErrorCode::InvalidArtifact, "head.pt projects from d = ",
            head.n_embd(), " but ", config_path, " has hidden_size ", out.config.n_embd, "; wrong base? (",
            base_text(head), ")");
  KEV_ASSIGN_OR_RETURN(s->weights, SafetensorsSet::open_dir(weights_dir));
  const std::vector<WeightSpec> specs = weight_specs(out.config, head.head_dim);
  KEV_TRY(resolve_backbone(*s, weights_dir, specs, full));

  std::map<std::string, std::vector<int64_t>> projections;
  for (const WeightSpec& spec : specs) {
    if (spec.projection) projections.emplace(spec.name, spec.shape);
  }
  const bool has_adapter = fs::exists(checkpoint_dir + "/adapter_config.json");
  if (!full && (head.lora > 0 || has_adapter)) {
    KEV_CHECK(has_adapter, ErrorCode::InvalidArtifact, "head.pt says lora = ", head.lora, " but '", checkpoint_dir,
              "' has no adapter_config.json");
    KEV_ASSIGN_OR_RETURN(Adapter a, open_adapter_files(checkpoint_dir, head.lora, lora_scale));
    s->adapter.emplace(std::move(a));
    KEV_TRY(pair_adapter(*s->adapter, projections));
    KEV_TRY(check_targets_present(*s->adapter, projections));
    const Adapter& ad = *s->adapter;
    summary.lora_rank = ad.rank;
    summary.lora_scale = ad.scale;
    for (const auto& [name, shape] : projections) {
      const int64_t params = ad.rank * (shape[0] + shape[1]);
      summary.lora_parameters_all += params;
      if (!ad.pairs.count(name)) continue;
      ++summary.lora_modules;
      summary.lora_parameters += params;
      const std::string stem = name.substr(0, name.size() - 7);
      ++summary.merged_by_module[stem.substr(stem.rfind('.') + 1)];
    }
  }

  out.tokenizer_path = tokenizer_dir + "/tokenizer.json";
  KEV_CHECK(fs::exists(out.tokenizer_path), ErrorCode::InvalidArtifact, "'", tokenizer_dir,
            "' has no tokenizer.json; the base model's tokenizer is needed (", base_text(head),
            "; pass it with --base)");
  KEV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(out.tokenizer_path));
  KEV_ASSIGN_OR_RETURN(out.meta.special_ids, resolve_special_ids(tokenizer));

  KevMetadata& meta = out.meta;
  meta.name = dir_name(checkpoint_dir);
  meta.temperature = head.temperature;
  meta.checkpoint_id = summary.checkpoint_id;
  meta.pointer_dim = head.head_dim;
  meta.source = cat("base '", head.base, "' @ '", head.base_revision, "'; weights ", head.weights,
                    s->adapter ? cat(" (LoRA r=", s->adapter->rank, " merged in fp32)") : std::string());
  out.tensors = [s](const std::string& name) { return read_tensor(*s, name); };
  return out;
}

Status write_exported_model(const OpenedCheckpoint& ck, const ImportOptions& o) {
  KEV_CHECK(o.dtype == "fp32" || o.dtype == "bf16", ErrorCode::InvalidRequest, "dtype '", o.dtype,
            "' is not one of fp32, bf16");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot create '", o.out_dir, "': ", ec.message());

  // Each tensor is read, merged and converted only when the writer reaches it, so memory stays at one
  // tensor whatever the model size.
  SafetensorsWriter writer;
  writer.set_metadata("format", "kev-native");
  for (const WeightSpec& spec : weight_specs(ck.config, ck.meta.pointer_dim)) {
    const StDtype dtype = spec.projection && o.dtype == "bf16" ? StDtype::BF16 : StDtype::F32;
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    KEV_TRY(writer.add_producer(spec.name, dtype, spec.shape,
                                [&ck, name = spec.name, numel, dtype](ByteSink& sink) -> Status {
                                  KEV_ASSIGN_OR_RETURN(HostTensor t, ck.tensors(name));
                                  KEV_CHECK(t.numel() == numel && t.data.size() == static_cast<size_t>(numel),
                                            ErrorCode::Internal, "tensor '", name, "' has ", t.data.size(),
                                            " values; its shape needs ", numel);
                                  return write_values(sink, t.data, dtype);
                                }));
  }
  KEV_TRY(writer.write(o.out_dir + "/weights.safetensors", o.progress));

  KevMetadata meta = ck.meta;
  meta.limits = o.limits;
  meta.dtype = o.dtype;
  meta.backend = o.backend;
  {
    std::ofstream json(o.out_dir + "/model.json", std::ios::binary | std::ios::trunc);
    json << model_json_text(ck.config, meta);
    KEV_CHECK(json.good(), ErrorCode::Io, "cannot write '", o.out_dir, "/model.json'");
  }
  fs::copy_file(ck.tokenizer_path, o.out_dir + "/tokenizer.json", fs::copy_options::overwrite_existing, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot copy '", ck.tokenizer_path, "' to '", o.out_dir, "': ", ec.message());
  return Status::success();
}

Result<ImportSummary> export_checkpoint(const ImportOptions& o) {
  KEV_ASSIGN_OR_RETURN(OpenedCheckpoint ck, open_checkpoint(o.checkpoint_dir, o.base_dir, o.lora_scale));
  KEV_TRY(write_exported_model(ck, o));
  return ck.summary;
}

}  // namespace kev
