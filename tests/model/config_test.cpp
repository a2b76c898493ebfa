// ModelConfig parsing: the Qwen3.5 0.8B base config (multimodal "qwen3_5" wrapper and text-only
// "qwen3_5_text" forms) against KEV_SPEC.md §1, and one error per validation rule.
#include "model/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kev {
namespace {

using nlohmann::json;

const std::string kFixtures = std::string(KEV_FIXTURES_DIR) + "/config/";

std::string read_fixture(const std::string& name) {
  std::ifstream in(kFixtures + name, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_0_8b(const ModelConfig& c) {
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.n_embd, 1024);
  EXPECT_EQ(c.n_layers, 24);
  EXPECT_EQ(c.n_vocab, 248320);
  EXPECT_EQ(c.n_ff, 3584);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.n_rot, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.gdn_n_k_heads, 16);
  EXPECT_EQ(c.gdn_n_v_heads, 16);
  EXPECT_EQ(c.gdn_k_dim, 128);
  EXPECT_EQ(c.gdn_v_dim, 128);
  EXPECT_EQ(c.gdn_conv_kernel, 4);
  EXPECT_EQ(c.gdn_conv_channels(), 6144);
  ASSERT_EQ(c.layer_types.size(), 24u);
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(c.layer_types[i], (i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::GatedDeltaNet) << i;
  }
  EXPECT_EQ(c.n_gdn_layers(), 18);
  EXPECT_EQ(c.n_attn_layers(), 6);
  EXPECT_TRUE(c.summary().starts_with("qwen3_5_text d=1024 layers=24 (18 GDN + 6 attention) vocab=248320"))
      << c.summary();
}

TEST(ModelConfig, MultimodalWrapperFixture) {
  const std::string text = read_fixture("qwen3_5_0.8b_base.json");
  ASSERT_FALSE(text.empty()) << "missing fixture " << kFixtures << "qwen3_5_0.8b_base.json";
  Result<ModelConfig> c = parse_model_config(text);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_0_8b(c.value());
}

TEST(ModelConfig, TextOnlyFixtureWithLegacyRopeFields) {
  Result<ModelConfig> c = load_model_config(kFixtures + "qwen3_5_text_0.8b.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_0_8b(c.value());
}

TEST(ModelConfig, FileErrors) {
  Result<ModelConfig> missing = load_model_config(kFixtures + "no_such_config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::Io);
  EXPECT_NE(missing.status().message().find("no_such_config.json"), std::string::npos);

  Result<ModelConfig> malformed = parse_model_config("{\"model_type\": ");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_NE(malformed.status().message().find("not valid JSON"), std::string::npos);

  Result<ModelConfig> not_object = parse_model_config("[1]");
  ASSERT_FALSE(not_object.ok());
  EXPECT_EQ(not_object.status().code(), ErrorCode::InvalidArtifact);
}

// ---- one error per rule ---------------------------------------------------------------------------

struct BadCase {
  std::string name;
  std::function<void(json& root, json& text)> mutate;  // edits the wrapper fixture
  ErrorCode code;
  std::vector<std::string> needles;  // all must appear in the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class ModelConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ModelConfigErrors, NamesTheField) {
  const BadCase& bad = GetParam();
  const std::string text = read_fixture("qwen3_5_0.8b_base.json");
  ASSERT_FALSE(text.empty()) << "missing fixture " << kFixtures << "qwen3_5_0.8b_base.json";
  json root = json::parse(text);
  bad.mutate(root, root["text_config"]);
  Result<ModelConfig> c = parse_model_config(root.dump());
  ASSERT_FALSE(c.ok()) << bad.name << " was accepted";
  EXPECT_EQ(c.status().code(), bad.code) << c.status().to_string();
  for (const std::string& n : bad.needles) {
    EXPECT_NE(c.status().message().find(n), std::string::npos) << c.status().to_string() << "\nwant: " << n;
  }
}

BadCase missing_field(const std::string& field) {
  return {"missing_" + field, [field](json&, json& t) { t.erase(field); }, ErrorCode::InvalidArtifact,
          {"missing field '" + field + "'", "text_config"}};
}

BadCase set_field(const std::string& name, const std::string& field, json value, ErrorCode code,
                  std::vector<std::string> needles) {
  return {name, [field, value](json&, json& t) { t[field] = value; }, code, std::move(needles)};
}

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases;
  for (const char* f : {"hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "rms_norm_eps", "linear_num_key_heads",
                        "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                        "linear_conv_kernel_dim"}) {
    cases.push_back(missing_field(f));
  }
  const ErrorCode bad = ErrorCode::InvalidArtifact, unsupported = ErrorCode::Unsupported;
  cases.push_back(set_field("zero_hidden", "hidden_size", 0, bad, {"'hidden_size' is 0", "[1, 1048576]"}));
  cases.push_back(set_field("negative_heads", "num_attention_heads", -8, bad, {"'num_attention_heads' is -8"}));
  cases.push_back(set_field("huge_hidden", "hidden_size", int64_t{1} << 40, bad, {"'hidden_size'", "1048576"}));
  cases.push_back(set_field("fractional_ff", "intermediate_size", 3584.5, bad, {"'intermediate_size' must be an integer"}));
  cases.push_back(set_field("string_vocab", "vocab_size", "248320", bad, {"'vocab_size' must be an integer"}));
  cases.push_back(set_field("zero_gdn_heads", "linear_num_key_heads", 0, bad, {"'linear_num_key_heads' is 0"}));
  cases.push_back(set_field("zero_eps", "rms_norm_eps", 0.0, bad, {"rms_norm_eps"}));
  cases.push_back(set_field("string_eps", "rms_norm_eps", "1e-6", bad, {"'rms_norm_eps' must be a number"}));

  cases.push_back({"short_layer_types",
                   [](json&, json& t) { t["layer_types"].erase(t["layer_types"].size() - 1); }, bad,
                   {"'layer_types' has 23 entries but num_hidden_layers is 24"}});
  cases.push_back(set_field("layers_disagree", "num_hidden_layers", 32, bad, {"24 entries", "32"}));
  cases.push_back({"unknown_layer_type", [](json&, json& t) { t["layer_types"][5] = "sliding_attention"; },
                   unsupported, {"layer_types[5]", "sliding_attention"}});
  cases.push_back(set_field("layer_types_not_list", "layer_types", "hybrid", bad, {"'layer_types' must be a list"}));
  cases.push_back({"no_layer_pattern",
                   [](json&, json& t) {
                     t.erase("layer_types");
                     t.erase("full_attention_interval");
                   },
                   bad, {"missing field 'layer_types' (or 'full_attention_interval')"}});
  cases.push_back({"zero_interval",
                   [](json&, json& t) {
                     t.erase("layer_types");
                     t["full_attention_interval"] = 0;
                   },
                   bad, {"'full_attention_interval' is 0"}});

  cases.push_back(set_field("kv_heads_not_divisor", "num_key_value_heads", 3, bad,
                            {"num_attention_heads (8) is not a multiple of num_key_value_heads (3)"}));
  cases.push_back(set_field("gdn_heads_not_multiple", "linear_num_value_heads", 24, bad,
                            {"linear_num_value_heads (24) is not a multiple of linear_num_key_heads (16)"}));

  auto rope = [](const std::string& name, const std::string& key, json value, ErrorCode code,
                 std::vector<std::string> needles) {
    return BadCase{name, [key, value](json&, json& t) { t["rope_parameters"][key] = value; }, code, std::move(needles)};
  };
  cases.push_back(rope("odd_rotary", "partial_rotary_factor", 69.0 / 256.0, bad, {"must be even"}));
  cases.push_back(rope("fractional_rotary", "partial_rotary_factor", 0.3, bad, {"not a whole number"}));
  cases.push_back(rope("rotary_over_head_dim", "partial_rotary_factor", 1.5, bad, {"partial_rotary_factor is 1.5"}));
  cases.push_back(rope("rope_yarn", "rope_type", "yarn", unsupported, {"rope_parameters", "rope_type 'yarn'"}));
  cases.push_back(rope("rope_linear", "rope_type", "linear", unsupported, {"rope_type 'linear'"}));
  cases.push_back(rope("rope_dynamic", "rope_type", "dynamic", unsupported, {"rope_type 'dynamic'"}));
  cases.push_back(rope("bad_theta", "rope_theta", -1.0, bad, {"rope_theta is -1"}));
  cases.push_back(rope("string_theta", "rope_theta", "1e7", bad, {"'rope_theta' must be a number"}));
  cases.push_back(rope("mrope_section_sum", "mrope_section", json::array({11, 11, 11}), bad,
                       {"mrope_section [11,11,11] sums to 33", "32"}));
  cases.push_back(rope("mrope_section_negative", "mrope_section", json::array({-1, 11, 22}), bad, {"mrope_section"}));
  cases.push_back(rope("mrope_interleaved_type", "mrope_interleaved", "yes", bad, {"mrope_interleaved"}));
  cases.push_back({"missing_theta", [](json&, json& t) { t["rope_parameters"].erase("rope_theta"); }, bad,
                   {"missing field 'rope_parameters.rope_theta' (or 'rope_theta')"}});
  cases.push_back({"missing_rotary_factor", [](json&, json& t) { t["rope_parameters"].erase("partial_rotary_factor"); },
                   bad, {"missing field 'rope_parameters.partial_rotary_factor'"}});
  cases.push_back(set_field("rope_not_object", "rope_parameters", 10000000, bad, {"'rope_parameters' must be an object"}));
  cases.push_back(set_field("legacy_rope_scaling_linear", "rope_scaling", json{{"type", "linear"}, {"factor", 2.0}},
                            unsupported, {"rope_scaling", "type 'linear'"}));

  cases.push_back(set_field("attention_bias", "attention_bias", true, unsupported, {"attention_bias=true"}));
  cases.push_back(set_field("no_output_gate", "attn_output_gate", false, unsupported, {"attn_output_gate=false"}));
  cases.push_back(set_field("gelu", "hidden_act", "gelu", unsupported, {"hidden_act 'gelu'"}));

  cases.push_back({"other_model_type", [](json& r, json&) { r["model_type"] = "llama"; }, unsupported,
                   {"model_type 'llama'"}});
  cases.push_back({"no_model_type", [](json& r, json&) { r.erase("model_type"); }, bad, {"missing field 'model_type'"}});
  cases.push_back({"no_text_config", [](json& r, json&) { r.erase("text_config"); }, bad, {"'text_config'"}});
  cases.push_back({"moe_text_config", [](json&, json& t) { t["model_type"] = "qwen3_5_moe_text"; }, unsupported,
                   {"model_type 'qwen3_5_moe_text'"}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Rules, ModelConfigErrors, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ModelConfig, LayerTypesFromIntervalAndTopLevelRope) {
  json root = json::parse(read_fixture("qwen3_5_0.8b_base.json"), nullptr, false);
  ASSERT_TRUE(root.is_object()) << "missing fixture qwen3_5_0.8b_base.json";
  json& t = root["text_config"];
  t.erase("layer_types");
  t["full_attention_interval"] = 2;
  t.erase("rope_parameters");
  t["rope_theta"] = 5e6;
  t["partial_rotary_factor"] = 0.5;
  Result<ModelConfig> c = parse_model_config(root.dump());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->n_attn_layers(), 12);
  EXPECT_EQ(c->layer_types[0], LayerType::GatedDeltaNet);
  EXPECT_EQ(c->layer_types[1], LayerType::FullAttention);
  EXPECT_EQ(c->n_rot, 128);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
}

TEST(ModelConfig, TextOnlyErrorsNameTheTopLevelFields) {
  json t = json::parse(read_fixture("qwen3_5_text_0.8b.json"), nullptr, false);
  ASSERT_TRUE(t.is_object()) << "missing fixture qwen3_5_text_0.8b.json";
  t.erase("rope_theta");
  Result<ModelConfig> c = parse_model_config(t.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing field 'rope_scaling.rope_theta' (or 'rope_theta')"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace kev
