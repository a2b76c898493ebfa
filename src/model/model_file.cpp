#include "model/model_file.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "io/json_util.h"

namespace kev {

using nlohmann::ordered_json;

namespace {

ordered_json hf_text_config(const ModelConfig& c) {
  ordered_json j;
  j["model_type"] = "qwen3_5_text";
  j["hidden_size"] = c.n_embd;
  j["num_hidden_layers"] = c.n_layers;
  j["vocab_size"] = c.n_vocab;
  j["intermediate_size"] = c.n_ff;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_eps;
  ordered_json types = ordered_json::array();
  for (LayerType t : c.layer_types) types.push_back(t == LayerType::FullAttention ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_head_kv;
  j["head_dim"] = c.head_dim;
  j["attn_output_gate"] = c.attn_output_gate;
  j["attention_bias"] = false;
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", static_cast<double>(c.n_rot) / static_cast<double>(c.head_dim)}};
  j["linear_num_key_heads"] = c.gdn_n_k_heads;
  j["linear_num_value_heads"] = c.gdn_n_v_heads;
  j["linear_key_head_dim"] = c.gdn_k_dim;
  j["linear_value_head_dim"] = c.gdn_v_dim;
  j["linear_conv_kernel_dim"] = c.gdn_conv_kernel;
  return j;
}

Result<int32_t> read_id(const nlohmann::json& obj, const char* key, const std::string& context) {
  KEV_ASSIGN_OR_RETURN(int64_t v, json_int(obj, key, context));
  KEV_CHECK(v >= 0 && v < INT32_MAX, ErrorCode::InvalidArtifact, context, ".", key, " is ", v,
            "; token ids are non-negative 32-bit integers");
  return static_cast<int32_t>(v);
}

constexpr int64_t kMaxOptionsCap = 255;

}  // namespace

Status validate_limits(const Limits& l) {
  KEV_CHECK(l.max_prefix >= 1, ErrorCode::InvalidRequest, "max_prefix is ", l.max_prefix, "; it must be at least 1");
  KEV_CHECK(l.max_context >= l.max_prefix, ErrorCode::InvalidRequest, "max_context (", l.max_context,
            ") must be at least max_prefix (", l.max_prefix, ")");
  KEV_CHECK(l.max_options >= 1 && l.max_options <= kMaxOptionsCap, ErrorCode::InvalidRequest, "max_options is ",
            l.max_options, "; it must be in 1..", kMaxOptionsCap);
  KEV_CHECK(l.max_questions >= 0, ErrorCode::InvalidRequest, "max_questions is ", l.max_questions,
            "; use 0 for no per-pass cap");
  KEV_CHECK(l.pass_token_budget >= 1, ErrorCode::InvalidRequest, "pass_token_budget is ", l.pass_token_budget,
            "; it must be at least 1");
  return Status::success();
}

std::string hf_text_config_json(const ModelConfig& config) { return hf_text_config(config).dump(2); }

std::string model_json_text(const ModelConfig& config, const KevMetadata& kev) {
  ordered_json j;
  j["format"] = kModelFormat;
  j["format_version"] = kModelFormatVersion;
  j["name"] = kev.name;
  j["architecture"] = hf_text_config(config);
  ordered_json k;
  k["temperature"] = kev.temperature;
  k["checkpoint_id"] = kev.checkpoint_id;
  k["pointer_dim"] = kev.pointer_dim;
  k["special_ids"] = {{"state", kev.special_ids.state},
                      {"question", kev.special_ids.question},
                      {"option_open", kev.special_ids.option_open},
                      {"option_close", kev.special_ids.option_close},
                      {"decide", kev.special_ids.decide},
                      {"pad", kev.special_ids.pad}};
  k["limits"] = {{"max_prefix", kev.limits.max_prefix},
                 {"max_context", kev.limits.max_context},
                 {"max_questions", kev.limits.max_questions},
                 {"max_options", kev.limits.max_options},
                 {"pass_token_budget", kev.limits.pass_token_budget}};
  k["dtype"] = kev.dtype;
  k["backend"] = kev.backend;
  k["source"] = kev.source;
  j["kev"] = k;
  return j.dump(2) + "\n";
}

Result<ModelFile> read_model_file(const std::string& dir) {
  const std::string path = dir + "/model.json";
  KEV_CHECK(std::filesystem::is_directory(dir), ErrorCode::Io, "model directory '", dir, "' does not exist");
  KEV_CHECK(std::filesystem::exists(path), ErrorCode::InvalidArtifact, "'", dir,
            "' has no model.json; create an exported model with kev_export (see docs/model-format.md)");
  KEV_ASSIGN_OR_RETURN(nlohmann::json root, read_json_file(path));
  KEV_ASSIGN_OR_RETURN(std::string format, json_string(root, "format", path));
  KEV_CHECK(format == kModelFormat, ErrorCode::InvalidArtifact, path, ": format is '", format, "', expected '",
            kModelFormat, "'");
  KEV_ASSIGN_OR_RETURN(int64_t version, json_int(root, "format_version", path));
  KEV_CHECK(version == kModelFormatVersion, ErrorCode::InvalidArtifact, path, ": format_version ", version,
            " is not supported by this build (it reads version ", kModelFormatVersion,
            "); re-export the model with this build's kev_export");

  ModelFile m;
  m.dir = dir;
  KEV_CHECK(json_has(root, "architecture"), ErrorCode::InvalidArtifact, path, ": missing 'architecture'");
  KEV_ASSIGN_OR_RETURN(m.config, parse_model_config(root["architecture"].dump()));
  KEV_CHECK(json_has(root, "kev") && root["kev"].is_object(), ErrorCode::InvalidArtifact, path,
            ": missing the 'kev' metadata object");
  const nlohmann::json& k = root["kev"];
  const std::string ctx = path + " kev";
  KevMetadata& meta = m.kev;
  if (json_has(root, "name")) {
    KEV_ASSIGN_OR_RETURN(meta.name, json_string(root, "name", path));
  }
  if (meta.name.empty()) meta.name = std::filesystem::path(dir).filename().string();
  KEV_ASSIGN_OR_RETURN(meta.temperature, json_number(k, "temperature", ctx));
  KEV_CHECK(std::isfinite(meta.temperature) && meta.temperature > 0, ErrorCode::InvalidArtifact, ctx,
            ".temperature is ", meta.temperature, "; it must be finite and positive");
  KEV_ASSIGN_OR_RETURN(meta.checkpoint_id, json_string(k, "checkpoint_id", ctx));
  KEV_ASSIGN_OR_RETURN(meta.pointer_dim, json_int(k, "pointer_dim", ctx));
  KEV_CHECK(meta.pointer_dim > 0 && meta.pointer_dim <= 65536, ErrorCode::InvalidArtifact, ctx, ".pointer_dim is ",
            meta.pointer_dim, "; expected 1..65536");
  KEV_CHECK(json_has(k, "special_ids") && k["special_ids"].is_object(), ErrorCode::InvalidArtifact, ctx,
            ": missing 'special_ids'");
  const nlohmann::json& ids = k["special_ids"];
  const std::string ids_ctx = ctx + ".special_ids";
  KEV_ASSIGN_OR_RETURN(meta.special_ids.state, read_id(ids, "state", ids_ctx));
  KEV_ASSIGN_OR_RETURN(meta.special_ids.question, read_id(ids, "question", ids_ctx));
  KEV_ASSIGN_OR_RETURN(meta.special_ids.option_open, read_id(ids, "option_open", ids_ctx));
  KEV_ASSIGN_OR_RETURN(meta.special_ids.option_close, read_id(ids, "option_close", ids_ctx));
  KEV_ASSIGN_OR_RETURN(meta.special_ids.decide, read_id(ids, "decide", ids_ctx));
  KEV_ASSIGN_OR_RETURN(meta.special_ids.pad, read_id(ids, "pad", ids_ctx));
  KEV_CHECK(json_has(k, "limits") && k["limits"].is_object(), ErrorCode::InvalidArtifact, ctx, ": missing 'limits'");
  const nlohmann::json& lim = k["limits"];
  const std::string lim_ctx = ctx + ".limits";
  KEV_ASSIGN_OR_RETURN(meta.limits.max_prefix, json_int(lim, "max_prefix", lim_ctx));
  KEV_ASSIGN_OR_RETURN(meta.limits.max_context, json_int(lim, "max_context", lim_ctx));
  KEV_ASSIGN_OR_RETURN(meta.limits.max_questions, json_int(lim, "max_questions", lim_ctx));
  KEV_ASSIGN_OR_RETURN(meta.limits.max_options, json_int(lim, "max_options", lim_ctx));
  KEV_ASSIGN_OR_RETURN(meta.limits.pass_token_budget, json_int(lim, "pass_token_budget", lim_ctx));
  if (Status st = validate_limits(meta.limits); !st.ok()) {
    return Status(ErrorCode::InvalidArtifact, cat(lim_ctx, ": ", st.message()));
  }
  KEV_ASSIGN_OR_RETURN(meta.dtype, json_string(k, "dtype", ctx));
  KEV_CHECK(meta.dtype == "fp32" || meta.dtype == "bf16", ErrorCode::InvalidArtifact, ctx, ".dtype '", meta.dtype,
            "' is not one of fp32, bf16");
  KEV_ASSIGN_OR_RETURN(meta.backend, json_string(k, "backend", ctx));
  if (json_has(k, "source")) {
    KEV_ASSIGN_OR_RETURN(meta.source, json_string(k, "source", ctx));
  }
  return m;
}

}  // namespace kev
