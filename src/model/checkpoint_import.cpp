#include "model/checkpoint_import.h"

#include <cblas.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "common/bf16.h"
#include "common/check.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/head_checkpoint.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

namespace {

namespace fs = std::filesystem;

// Our names are HF text-decoder names without a prefix; checkpoints add one of these.
constexpr const char* kPrefixes[] = {"model.language_model.", "model.", ""};

struct Adapter {
  SafetensorsFile file;
  int64_t rank = 0;
  double scale = 0;  // s·α/r (or s·α/√r)
};

Result<std::optional<SafeTensorRef>> find_hf(const SafetensorsSet& set, const std::string& name) {
  for (const char* p : kPrefixes) {
    if (auto ref = set.find(std::string(p) + name)) return std::optional<SafeTensorRef>(ref);
  }
  return std::optional<SafeTensorRef>();
}

Result<Adapter> open_adapter(const std::string& dir, int64_t head_rank, double user_scale) {
  const std::string cfg_path = dir + "/adapter_config.json";
  KEV_CHECK(fs::exists(cfg_path), ErrorCode::InvalidArtifact, "head.pt says lora = ", head_rank, " but '", dir,
            "' has no adapter_config.json");
  KEV_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json_file(cfg_path));
  KEV_ASSIGN_OR_RETURN(int64_t r, json_int(cfg, "r", cfg_path));
  KEV_ASSIGN_OR_RETURN(double alpha, json_number(cfg, "lora_alpha", cfg_path));
  KEV_CHECK(r > 0, ErrorCode::InvalidArtifact, cfg_path, ": r is ", r, "; it must be positive");
  KEV_CHECK(head_rank == 0 || head_rank == r, ErrorCode::InvalidArtifact, cfg_path, ": r is ", r,
            " but head.pt records lora = ", head_rank);
  bool rslora = false;
  if (json_has(cfg, "use_rslora") && !cfg["use_rslora"].is_null()) {
    KEV_ASSIGN_OR_RETURN(rslora, json_bool(cfg, "use_rslora", cfg_path));
  }
  for (const char* refused : {"trainable_token_indices", "modules_to_save"}) {
    KEV_CHECK(!json_has(cfg, refused) || cfg[refused].is_null() || cfg[refused].empty(), ErrorCode::Unsupported,
              cfg_path, ": '", refused, "' is set; Kev adapters never train extra tokens or modules, refusing");
  }
  KEV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(dir + "/adapter_model.safetensors"));
  const double rd = static_cast<double>(r);
  return Adapter{std::move(file), r, user_scale * (rslora ? alpha / std::sqrt(rd) : alpha / rd)};
}

// "layers.3.mlp.up_proj.weight" -> "base_model.model.layers.3.mlp.up_proj.lora_A.weight" (peft naming).
std::string lora_name(const std::string& weight_name, const char* which) {
  const std::string stem = weight_name.substr(0, weight_name.size() - std::string(".weight").size());
  return cat("base_model.model.", stem, ".lora_", which, ".weight");
}

Status merge_lora(const Adapter& a, const std::string& name, HostTensor& w, std::set<std::string>& used,
                  ImportSummary& summary) {
  const std::string an = lora_name(name, "A"), bn = lora_name(name, "B");
  const SafeTensorInfo* ai = a.file.find(an);
  const SafeTensorInfo* bi = a.file.find(bn);
  if (!ai && !bi) return Status::success();  // a module the adapter does not target
  KEV_CHECK(ai && bi, ErrorCode::InvalidArtifact, "adapter has only one of '", an, "' and '", bn, "'");
  KEV_ASSIGN_OR_RETURN(HostTensor A, a.file.read_f32(*ai));
  KEV_ASSIGN_OR_RETURN(HostTensor B, a.file.read_f32(*bi));
  const int64_t out = w.shape[0], in = w.shape[1], r = a.rank;
  KEV_CHECK(A.shape == std::vector<int64_t>({r, in}) && B.shape == std::vector<int64_t>({out, r}),
            ErrorCode::InvalidArtifact, "adapter tensors for '", name, "' have shapes A ", A.shape.size() == 2 ? cat("[", A.shape[0], ",", A.shape[1], "]") : "?",
            " and B ", B.shape.size() == 2 ? cat("[", B.shape[0], ",", B.shape[1], "]") : "?", "; the weight [", out, ",", in,
            "] with rank ", r, " needs A [", r, ",", in, "] and B [", out, ",", r, "]");
  // W += scale · B·A, FP32 accumulation in BLAS.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(out), static_cast<int>(in),
              static_cast<int>(r), static_cast<float>(a.scale), B.data.data(), static_cast<int>(r), A.data.data(),
              static_cast<int>(in), 1.0f, w.data.data(), static_cast<int>(in));
  used.insert(an);
  used.insert(bn);
  ++summary.lora_modules;
  summary.lora_parameters += r * (in + out);
  return Status::success();
}

}  // namespace

Result<ImportSummary> export_checkpoint(const ImportOptions& o) {
  ImportSummary summary;
  const std::string head_path = o.checkpoint_dir + "/head.pt";
  KEV_CHECK(fs::exists(head_path), ErrorCode::InvalidArtifact, "'", o.checkpoint_dir,
            "' has no head.pt; a Kev checkpoint directory holds head.pt plus its adapter or weights");
  KEV_ASSIGN_OR_RETURN(HeadCheckpoint head, read_head_checkpoint(head_path));
  KEV_ASSIGN_OR_RETURN(summary.checkpoint_id, checkpoint_id(head_path));
  summary.temperature = head.temperature;
  KEV_CHECK(o.dtype == "fp32" || o.dtype == "bf16", ErrorCode::InvalidRequest, "dtype '", o.dtype,
            "' is not one of fp32, bf16");

  const bool full = head.weights == "full";
  if (o.base_dir.empty() && !full) {
    return Status(ErrorCode::InvalidRequest,
                  cat("no base model given; head.pt names base '", head.base, "' at revision '", head.base_revision,
                      "': pass its HF directory with --base"));
  }
  const std::string weights_dir = full ? o.checkpoint_dir : o.base_dir;
  const std::string base_dir = o.base_dir.empty() ? o.checkpoint_dir : o.base_dir;
  KEV_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(weights_dir + "/config.json"));
  KEV_CHECK(head.n_embd() == config.n_embd, ErrorCode::InvalidArtifact, "head.pt projects from d = ", head.n_embd(),
            " but the backbone has hidden_size ", config.n_embd);
  KEV_ASSIGN_OR_RETURN(SafetensorsSet weights, SafetensorsSet::open_dir(weights_dir));

  std::optional<Adapter> adapter;
  if (!full && head.lora > 0) {
    KEV_ASSIGN_OR_RETURN(Adapter a, open_adapter(o.checkpoint_dir, head.lora, o.lora_scale));
    adapter.emplace(std::move(a));
    summary.lora_rank = adapter->rank;
  }

  KEV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(base_dir + "/tokenizer.json"));
  KEV_ASSIGN_OR_RETURN(SpecialIds ids, resolve_special_ids(tokenizer));

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot create '", o.out_dir, "': ", ec.message());

  // Merge in FP32 one tensor at a time, then store in the export dtype (one rounding).
  SafetensorsWriter writer;
  writer.set_metadata("format", "kev-native");
  std::set<std::string> used;
  for (const WeightSpec& spec : weight_specs(config, head.head_dim)) {
    HostTensor t;
    if (spec.name.starts_with("kev_head.")) {
      const std::string part = spec.name.substr(9);
      t = part == "q.weight" ? head.q_weight : part == "q.bias" ? head.q_bias : part == "k.weight" ? head.k_weight : head.k_bias;
    } else {
      KEV_ASSIGN_OR_RETURN(std::optional<SafeTensorRef> ref, find_hf(weights, spec.name));
      KEV_CHECK(ref.has_value(), ErrorCode::InvalidArtifact, "'", weights_dir, "' has no tensor '", spec.name,
                "' (also looked for it under model.language_model. and model.)");
      if (full && head.weights_dtype == "bf16") {
        KEV_CHECK(ref->info->dtype == StDtype::BF16, ErrorCode::InvalidArtifact, "head.pt says weights_dtype bf16 but '",
                  ref->info->name, "' is ", st_dtype_name(ref->info->dtype));
      }
      KEV_ASSIGN_OR_RETURN(t, ref->file->read_f32(*ref->info));
      if (spec.name.ends_with("conv1d.weight") && t.shape.size() == 3) t.shape = {t.shape[0], t.shape[2]};
      KEV_CHECK(t.shape == spec.shape, ErrorCode::InvalidArtifact, "tensor '", ref->info->name,
                "' has the wrong shape for this configuration");
      if (adapter && spec.projection) KEV_TRY(merge_lora(*adapter, spec.name, t, used, summary));
    }
    const StDtype dtype = spec.projection && o.dtype == "bf16" ? StDtype::BF16 : StDtype::F32;
    KEV_TRY(writer.add_f32(spec.name, std::move(t), dtype));
  }
  if (adapter) {
    for (const SafeTensorInfo& info : adapter->file.tensors()) {
      KEV_CHECK(used.count(info.name), ErrorCode::InvalidArtifact, "adapter tensor '", info.name,
                "' matches no adapted module of the backbone (unknown target or layer)");
    }
  }
  KEV_TRY(writer.write(o.out_dir + "/weights.safetensors", o.progress));

  KevMetadata meta;
  meta.name = fs::path(o.checkpoint_dir).filename().string();
  meta.temperature = head.temperature;
  meta.checkpoint_id = summary.checkpoint_id;
  meta.pointer_dim = head.head_dim;
  meta.special_ids = ids;
  meta.limits = o.limits;
  meta.dtype = o.dtype;
  meta.backend = o.backend;
  meta.source = cat("base '", head.base, "' @ '", head.base_revision, "'; weights ", head.weights,
                    adapter ? cat(" (LoRA r=", adapter->rank, " merged in fp32)") : std::string());
  {
    std::ofstream json(o.out_dir + "/model.json");
    json << model_json_text(config, meta);
    KEV_CHECK(json.good(), ErrorCode::Io, "cannot write '", o.out_dir, "/model.json'");
  }
  fs::copy_file(base_dir + "/tokenizer.json", o.out_dir + "/tokenizer.json", fs::copy_options::overwrite_existing, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot copy the tokenizer to '", o.out_dir, "': ", ec.message());
  return summary;
}

}  // namespace kev
