#include "model/config.h"

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "io/json_util.h"

namespace kev {
namespace {

using nlohmann::json;

// Limits that keep every derived size (e.g. 2·H_k·d_k + H_v·d_v, vocab·d) far from int64 overflow.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 26;

// Field lookups in one config object, with errors naming `context`.field.
class Fields {
 public:
  Fields(const json& obj, std::string context) : obj_(obj), context_(std::move(context)) {}

  const std::string& context() const { return context_; }
  const json& object() const { return obj_; }
  const json* get(std::string_view key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  Result<int64_t> positive(std::string_view key, int64_t max = kMaxDim) const {
    KEV_ASSIGN_OR_RETURN(int64_t v, json_int(obj_, key, context_));
    KEV_CHECK(v > 0 && v <= max, ErrorCode::InvalidArtifact, context_, ": field '", key, "' is ", v,
              "; it must be in [1, ", max, "]");
    return v;
  }

  // A boolean whose only supported value is `supported`, which is also its transformers default.
  Status require_flag(std::string_view key, bool supported, std::string_view why) const {
    if (get(key) == nullptr) return Status::success();
    KEV_ASSIGN_OR_RETURN(bool v, json_bool(obj_, key, context_));
    KEV_CHECK(v == supported, ErrorCode::Unsupported, context_, ": ", key, "=", v ? "true" : "false",
              " is not supported (", why, ")");
    return Status::success();
  }

 private:
  const json& obj_;
  std::string context_;
};

Status parse_layer_types(const Fields& f, ModelConfig& c) {
  if (const json* types = f.get("layer_types")) {
    KEV_CHECK(types->is_array(), ErrorCode::InvalidArtifact, f.context(),
              ": field 'layer_types' must be a list of \"linear_attention\" / \"full_attention\", got ",
              json_excerpt(*types));
    KEV_CHECK(static_cast<int64_t>(types->size()) == c.n_layers, ErrorCode::InvalidArtifact, f.context(),
              ": 'layer_types' has ", types->size(), " entries but num_hidden_layers is ", c.n_layers);
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "linear_attention") {
        c.layer_types.push_back(LayerType::GatedDeltaNet);
      } else if (t == "full_attention") {
        c.layer_types.push_back(LayerType::FullAttention);
      } else {
        return Status(ErrorCode::Unsupported, cat(f.context(), ": layer_types[", i, "] is ", json_excerpt(t),
                                                  "; supported: \"linear_attention\", \"full_attention\""));
      }
    }
    return Status::success();
  }
  KEV_CHECK(f.get("full_attention_interval") != nullptr, ErrorCode::InvalidArtifact, f.context(),
            ": missing field 'layer_types' (or 'full_attention_interval')");
  KEV_ASSIGN_OR_RETURN(int64_t interval, f.positive("full_attention_interval"));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::GatedDeltaNet);
  }
  return Status::success();
}

// RoPE settings live in rope_parameters (transformers >= 5) or rope_scaling (older files; it wins
// when both are present, as in transformers), with rope_theta / partial_rotary_factor falling back to
// the top level. Multimodal RoPE (mrope_section, interleaved or not) reduces to plain RoPE for text,
// where all position planes carry the same index, so it is accepted as "default".
Status parse_rope(const Fields& f, ModelConfig& c) {
  const json* rope = f.get("rope_scaling");
  std::string rope_key = "rope_scaling";
  if (rope == nullptr) {
    rope = f.get("rope_parameters");
    rope_key = "rope_parameters";
  }
  static const json kEmpty = json::object();
  if (rope != nullptr) {
    KEV_CHECK(rope->is_object(), ErrorCode::InvalidArtifact, f.context(), ": field '", rope_key,
              "' must be an object, got ", json_excerpt(*rope));
  } else {
    rope = &kEmpty;
  }
  const Fields r(*rope, cat(f.context(), ".", rope_key));

  std::string rope_type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (r.get(key) == nullptr) continue;
    KEV_ASSIGN_OR_RETURN(rope_type, json_string(*rope, key, r.context()));
    KEV_CHECK(rope_type == "default" || rope_type == "mrope", ErrorCode::Unsupported, r.context(), ": ", key,
              " '", rope_type, "' is not supported (only \"default\" RoPE, optionally multimodal)");
    break;
  }

  // A number from the rope object, else from the top level (errors name whichever was read).
  auto number = [&](std::string_view key) -> Result<double> {
    if (r.get(key) != nullptr) return json_number(*rope, key, r.context());
    KEV_CHECK(f.get(key) != nullptr, ErrorCode::InvalidArtifact, f.context(), ": missing field '", rope_key, ".",
              key, "' (or '", key, "')");
    return json_number(f.object(), key, f.context());
  };

  KEV_ASSIGN_OR_RETURN(c.rope_theta, number("rope_theta"));
  KEV_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 1.0, ErrorCode::InvalidArtifact, f.context(),
            ": rope_theta is ", c.rope_theta, "; it must be a finite number above 1");

  KEV_ASSIGN_OR_RETURN(double factor, number("partial_rotary_factor"));
  KEV_CHECK(factor > 0.0 && factor <= 1.0, ErrorCode::InvalidArtifact, f.context(), ": partial_rotary_factor is ",
            factor, "; it must be in (0, 1]");
  const double rot = factor * static_cast<double>(c.head_dim);
  c.n_rot = std::llround(rot);
  KEV_CHECK(std::fabs(rot - static_cast<double>(c.n_rot)) < 1e-6, ErrorCode::InvalidArtifact, f.context(),
            ": partial_rotary_factor ", factor, " times head_dim ", c.head_dim, " is ", rot,
            ", not a whole number of rotary dimensions");
  KEV_CHECK(c.n_rot >= 2 && c.n_rot % 2 == 0 && c.n_rot <= c.head_dim, ErrorCode::InvalidArtifact, f.context(),
            ": rotary dimensions (head_dim ", c.head_dim, " x partial_rotary_factor ", factor, " = ", c.n_rot,
            ") must be even, at least 2 and at most head_dim");

  if (const json* section = r.get("mrope_section")) {
    KEV_CHECK(section->is_array(), ErrorCode::InvalidArtifact, r.context(),
              ": mrope_section must be a list of integers, got ", json_excerpt(*section));
    int64_t sum = 0;
    for (const json& s : *section) {
      KEV_CHECK(s.is_number_unsigned() && s.get<uint64_t>() <= static_cast<uint64_t>(kMaxDim),
                ErrorCode::InvalidArtifact, r.context(), ": mrope_section entry ", json_excerpt(s),
                " is not a small non-negative integer");
      sum += s.get<int64_t>();
    }
    KEV_CHECK(2 * sum == c.n_rot, ErrorCode::InvalidArtifact, r.context(), ": mrope_section ", json_excerpt(*section),
              " sums to ", sum, " frequency pairs, but the rotary dimensions hold ", c.n_rot / 2);
  }
  if (r.get("mrope_interleaved") != nullptr) KEV_TRY(json_bool(*rope, "mrope_interleaved", r.context()));
  return Status::success();
}

Result<ModelConfig> parse_text_config(const json& obj, const std::string& context) {
  KEV_CHECK(obj.is_object(), ErrorCode::InvalidArtifact, context, " must be a JSON object, got ", json_excerpt(obj));
  const Fields f(obj, context);
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  KEV_ASSIGN_OR_RETURN(c.n_embd, f.positive("hidden_size"));
  KEV_ASSIGN_OR_RETURN(c.n_layers, f.positive("num_hidden_layers", 4096));
  KEV_ASSIGN_OR_RETURN(c.n_vocab, f.positive("vocab_size", kMaxVocab));
  KEV_ASSIGN_OR_RETURN(c.n_ff, f.positive("intermediate_size"));
  KEV_TRY(parse_layer_types(f, c));

  KEV_ASSIGN_OR_RETURN(c.rms_eps, json_number(obj, "rms_norm_eps", context));
  KEV_CHECK(c.rms_eps > 0.0 && c.rms_eps < 1.0, ErrorCode::InvalidArtifact, context, ": rms_norm_eps is ",
            c.rms_eps, "; it must be in (0, 1)");
  if (f.get("hidden_act") != nullptr) {
    KEV_ASSIGN_OR_RETURN(std::string act, json_string(obj, "hidden_act", context));
    KEV_CHECK(act == "silu", ErrorCode::Unsupported, context, ": hidden_act '", act,
              "' is not supported (the MLP is SwiGLU: \"silu\")");
  }

  KEV_ASSIGN_OR_RETURN(c.n_head, f.positive("num_attention_heads"));
  KEV_ASSIGN_OR_RETURN(c.n_head_kv, f.positive("num_key_value_heads"));
  KEV_ASSIGN_OR_RETURN(c.head_dim, f.positive("head_dim"));
  KEV_CHECK(c.n_head % c.n_head_kv == 0, ErrorCode::InvalidArtifact, context, ": num_attention_heads (", c.n_head,
            ") is not a multiple of num_key_value_heads (", c.n_head_kv, ")");
  KEV_TRY(f.require_flag("attn_output_gate", true, "Qwen3.5 attention has a sigmoid output gate"));
  c.attn_output_gate = true;
  KEV_TRY(f.require_flag("attention_bias", false, "the backbone's projections have no bias"));
  KEV_TRY(parse_rope(f, c));

  KEV_ASSIGN_OR_RETURN(c.gdn_n_k_heads, f.positive("linear_num_key_heads"));
  KEV_ASSIGN_OR_RETURN(c.gdn_n_v_heads, f.positive("linear_num_value_heads"));
  KEV_ASSIGN_OR_RETURN(c.gdn_k_dim, f.positive("linear_key_head_dim"));
  KEV_ASSIGN_OR_RETURN(c.gdn_v_dim, f.positive("linear_value_head_dim"));
  KEV_ASSIGN_OR_RETURN(c.gdn_conv_kernel, f.positive("linear_conv_kernel_dim", 64));
  KEV_CHECK(c.gdn_n_v_heads % c.gdn_n_k_heads == 0, ErrorCode::InvalidArtifact, context,
            ": linear_num_value_heads (", c.gdn_n_v_heads, ") is not a multiple of linear_num_key_heads (",
            c.gdn_n_k_heads, ")");
  return c;
}

Result<ModelConfig> parse_config_object(const json& root, const std::string& source) {
  KEV_CHECK(root.is_object(), ErrorCode::InvalidArtifact, source, " must be a JSON object, got ", json_excerpt(root));
  KEV_ASSIGN_OR_RETURN(std::string model_type, json_string(root, "model_type", source));
  if (model_type == "qwen3_5_text") return parse_text_config(root, source);
  KEV_CHECK(model_type == "qwen3_5", ErrorCode::Unsupported, source, ": model_type '", model_type,
            "' is not supported (expected \"qwen3_5\" or \"qwen3_5_text\")");
  const std::string context = source + " text_config";
  auto text = root.find("text_config");
  KEV_CHECK(text != root.end() && text->is_object(), ErrorCode::InvalidArtifact, source,
            ": model_type \"qwen3_5\" needs a 'text_config' object");
  if (text->contains("model_type")) {
    KEV_ASSIGN_OR_RETURN(std::string inner, json_string(*text, "model_type", context));
    KEV_CHECK(inner == "qwen3_5_text", ErrorCode::Unsupported, context, ": model_type '", inner,
              "' is not supported (expected \"qwen3_5_text\")");
  }
  return parse_text_config(*text, context);
}

}  // namespace

int64_t ModelConfig::n_gdn_layers() const {
  int64_t n = 0;
  for (LayerType t : layer_types) n += t == LayerType::GatedDeltaNet ? 1 : 0;
  return n;
}

int64_t ModelConfig::n_attn_layers() const {
  int64_t n = 0;
  for (LayerType t : layer_types) n += t == LayerType::FullAttention ? 1 : 0;
  return n;
}

std::string ModelConfig::summary() const {
  return cat(model_type, " d=", n_embd, " layers=", n_layers, " (", n_gdn_layers(), " GDN + ", n_attn_layers(),
             " attention) vocab=", n_vocab, " ff=", n_ff, " attn=", n_head, "/", n_head_kv, "x", head_dim,
             " rot=", n_rot, " theta=", rope_theta, " gdn=", gdn_n_k_heads, "/", gdn_n_v_heads, " k", gdn_k_dim,
             " v", gdn_v_dim, " conv", gdn_conv_kernel);
}

Result<ModelConfig> parse_model_config(std::string_view json_text) {
  KEV_ASSIGN_OR_RETURN(json root, parse_json(json_text, "config"));
  return parse_config_object(root, "config");
}

Result<ModelConfig> load_model_config(const std::string& path) {
  KEV_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  const std::string source = cat("'", path, "'");
  KEV_ASSIGN_OR_RETURN(json root, parse_json(text, source));
  return parse_config_object(root, source);
}

}  // namespace kev
