// Kev head.pt semantics: real torch.save files (tests/fixtures/headpt with JSON sidecars, and the
// golden/upstream heads) and hand-made variants from tests/fixtures/pickle/make_fixtures.py.

#include "model/head_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kev {
namespace {

std::string fixture(const std::string& rel) { return std::string(KEV_FIXTURES_DIR) + "/" + rel; }

#define ASSERT_FIXTURE(path)                                                                                 \
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing fixture " << (path)                                 \
                                             << " (tests/fixtures/pickle/make_fixtures.py or, for headpt/, " \
                                                "golden/ and upstream/, reference/golden/make_golden.py makes it)"

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

HeadCheckpoint load(const std::string& path) {
  Result<HeadCheckpoint> r = read_head_checkpoint(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : HeadCheckpoint();
}

// ---- files written by torch.save ----

void expect_tensor_matches(const HostTensor& t, const nlohmann::json& j, const std::string& name) {
  EXPECT_EQ(t.shape, j.at("shape").get<std::vector<int64_t>>()) << name;
  ASSERT_EQ(static_cast<int64_t>(t.data.size()), t.numel()) << name;
  ASSERT_FALSE(t.data.empty()) << name;
  const std::vector<double> first = j.at("first").get<std::vector<double>>();
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(static_cast<double>(t.data[i]), first[i]) << name << "[" << i << "]";
  EXPECT_EQ(static_cast<double>(t.data.back()), j.at("last").get<double>()) << name;
  double sum = 0, sum_abs = 0;
  for (float x : t.data) {
    sum += x;
    sum_abs += std::fabs(x);
  }
  EXPECT_NEAR(sum, j.at("sum").get<double>(), 1e-12 * sum_abs) << name;
  EXPECT_NEAR(sum_abs, j.at("sum_abs").get<double>(), 1e-12 * sum_abs) << name;
}

void check_against_sidecar(const std::string& stem) {
  const std::string pt = fixture("headpt/" + stem + ".pt");
  const std::string json = fixture("headpt/" + stem + ".json");
  ASSERT_FIXTURE(pt);
  ASSERT_FIXTURE(json);
  const nlohmann::json desc = read_json(json);

  Result<std::string> id = checkpoint_id(pt);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_EQ(id.value(), desc.at("checkpoint_id").get<std::string>());

  Result<HeadCheckpoint> r = read_head_checkpoint(pt);
  if (desc.at("expect_refuse").get<bool>()) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::Unsupported);
    EXPECT_CONTAINS(r.status().message(), "re-save it with torch >= 1.6 (torch.save(obj, path))");
    return;
  }
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const HeadCheckpoint& h = r.value();
  const nlohmann::json& s = desc.at("scalars");
  EXPECT_EQ(h.base, s.value("base", ""));
  EXPECT_EQ(h.base_revision, s.value("base_revision", ""));
  EXPECT_EQ(h.lora, s.value("lora", 0));
  EXPECT_EQ(h.head_dim, s.value("head_dim", 256));
  EXPECT_EQ(h.option_isolation, s.value("option_isolation", false));
  EXPECT_EQ(h.special_embeddings, s.value("special_embeddings", false));
  EXPECT_EQ(h.weights_dtype, s.value("weights_dtype", "fp32"));
  EXPECT_EQ(h.temperature, s.value("temperature", 1.0));
  EXPECT_EQ(h.weights, s.value("weights", "lora"));
  if (s.contains("holdout")) {
    ASSERT_TRUE(h.holdout.has_value());
    EXPECT_EQ(*h.holdout, s.at("holdout").get<double>());
  } else {
    EXPECT_FALSE(h.holdout.has_value());
  }
  std::vector<std::string> extras;
  for (const auto& [key, value] : s.items()) {
    if (key == "temperature_fit" || key == "args") extras.push_back(key);
  }
  std::vector<std::string> got = h.extra_keys;
  std::sort(got.begin(), got.end());
  std::sort(extras.begin(), extras.end());
  EXPECT_EQ(got, extras);

  const nlohmann::json& t = desc.at("tensors");
  expect_tensor_matches(h.q_weight, t.at("q.weight"), "q.weight");
  expect_tensor_matches(h.q_bias, t.at("q.bias"), "q.bias");
  expect_tensor_matches(h.k_weight, t.at("k.weight"), "k.weight");
  expect_tensor_matches(h.k_bias, t.at("k.bias"), "k.bias");
  EXPECT_EQ(h.n_embd(), t.at("q.weight").at("shape")[1].get<int64_t>());
}

TEST(HeadCheckpointTorchFiles, Fp32) { check_against_sidecar("head_fp32"); }
TEST(HeadCheckpointTorchFiles, Bf16WidensExactly) { check_against_sidecar("head_bf16"); }
TEST(HeadCheckpointTorchFiles, MinimalTakesDefaults) { check_against_sidecar("head_minimal"); }
TEST(HeadCheckpointTorchFiles, LegacyIsRefused) { check_against_sidecar("head_legacy"); }

TEST(HeadCheckpointTorchFiles, GoldenAndUpstreamHeads) {
  const std::string golden_json = fixture("golden/expected.json");
  const std::string upstream_json = fixture("upstream/expected.json");
  ASSERT_FIXTURE(golden_json);
  ASSERT_FIXTURE(upstream_json);

  const nlohmann::json golden = read_json(golden_json).at("head");
  const std::string tiny = fixture("golden/" + golden.at("file").get<std::string>());
  ASSERT_FIXTURE(tiny);
  const HeadCheckpoint g = load(tiny);
  EXPECT_EQ(g.temperature, golden.at("temperature").get<double>());
  EXPECT_EQ(g.head_dim, golden.at("head_dim").get<int64_t>());
  EXPECT_EQ(g.q_weight.shape[0], g.head_dim);
  Result<std::string> id = checkpoint_id(tiny);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_EQ(id.value(), golden.at("checkpoint_id").get<std::string>());

  const nlohmann::json upstream = read_json(upstream_json).at("head");
  const std::string up = fixture("upstream/" + upstream.at("file").get<std::string>());
  ASSERT_FIXTURE(up);
  const HeadCheckpoint u = load(up);
  EXPECT_EQ(u.temperature, upstream.at("temperature").get<double>());
  EXPECT_EQ(u.lora, upstream.at("lora").get<int64_t>());
  Result<std::string> uid = checkpoint_id(up);
  ASSERT_TRUE(uid.ok()) << uid.status().to_string();
  EXPECT_EQ(uid.value(), "sha256:" + upstream.at("sha256").get<std::string>());
}

// ---- hand-made files ----

// make_fixtures.py fills each head tensor with start + i/8.
std::vector<float> ramp(float start, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) / 8.0f;
  return v;
}

TEST(HeadCheckpoint, ReadsEveryField) {
  const std::string path = fixture("pickle/head_ok.pt");
  ASSERT_FIXTURE(path);
  const HeadCheckpoint h = load(path);
  EXPECT_EQ(h.base, "Qwen/Qwen3.5-0.8B-Base");
  EXPECT_EQ(h.base_revision, "dc7cdfe2ee4154fa7e30f5b51ca41bfa40174e68");
  EXPECT_EQ(h.lora, 16);
  EXPECT_EQ(h.head_dim, 4);
  EXPECT_FALSE(h.option_isolation);
  EXPECT_FALSE(h.special_embeddings);
  EXPECT_EQ(h.weights_dtype, "fp32");
  EXPECT_EQ(h.temperature, 2.35);
  EXPECT_EQ(h.weights, "lora");
  ASSERT_TRUE(h.holdout.has_value());
  EXPECT_EQ(*h.holdout, 0.1);
  EXPECT_EQ(h.extra_keys, (std::vector<std::string>{"temperature_fit", "args"}));
  EXPECT_EQ(h.q_weight.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(h.q_weight.data, ramp(-1.0f, 12));
  EXPECT_EQ(h.q_bias.data, ramp(0.5f, 4));
  EXPECT_EQ(h.k_weight.data, ramp(1.0f, 12));
  EXPECT_EQ(h.k_bias.data, ramp(-0.5f, 4));
  EXPECT_EQ(h.n_embd(), 3);
}

TEST(HeadCheckpoint, Bf16HeadAndNoneHoldout) {
  const std::string path = fixture("pickle/head_bf16.pt");
  ASSERT_FIXTURE(path);
  const HeadCheckpoint h = load(path);
  EXPECT_EQ(h.weights_dtype, "bf16");
  EXPECT_FALSE(h.holdout.has_value());
  EXPECT_EQ(h.q_weight.data, ramp(-1.0f, 12));  // i/8 steps are exact in bfloat16
}

TEST(HeadCheckpoint, DefaultsForMissingKeys) {
  const std::string path = fixture("pickle/head_defaults.pt");
  ASSERT_FIXTURE(path);
  const HeadCheckpoint h = load(path);
  EXPECT_EQ(h.lora, 0);
  EXPECT_EQ(h.head_dim, 256);
  EXPECT_EQ(h.temperature, 1.0);
  EXPECT_EQ(h.weights, "lora");
  EXPECT_EQ(h.weights_dtype, "fp32");
  EXPECT_FALSE(h.holdout.has_value());
  EXPECT_TRUE(h.extra_keys.empty());
  EXPECT_EQ(h.k_weight.shape, (std::vector<int64_t>{256, 2}));
}

// Upstream files keep argparse.Namespace training arguments; they are opaque and ignored.
TEST(HeadCheckpoint, OpaqueTrainingArgsAreIgnored) {
  const std::string path = fixture("pickle/head_args_namespace.pt");
  ASSERT_FIXTURE(path);
  const HeadCheckpoint h = load(path);
  EXPECT_EQ(h.temperature, 2.35);
  EXPECT_EQ(h.lora, 16);
  EXPECT_EQ(h.extra_keys, (std::vector<std::string>{"temperature_fit", "args"}));
  EXPECT_EQ(h.q_weight.data, ramp(-1.0f, 12));
  EXPECT_EQ(h.k_bias.data, ramp(-0.5f, 4));
}

TEST(HeadCheckpoint, MissingFile) {
  Result<HeadCheckpoint> r = read_head_checkpoint(fixture("pickle/no_such_head.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::Io);
  Result<std::string> id = checkpoint_id(fixture("pickle/no_such_head.pt"));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), ErrorCode::Io);
}

struct BadHead {
  const char* name;
  ErrorCode code;
  const char* message;
};

class HeadCheckpointRefuses : public ::testing::TestWithParam<BadHead> {};

TEST_P(HeadCheckpointRefuses, WithAClearError) {
  const BadHead& bad = GetParam();
  const std::string path = fixture(std::string("pickle/") + bad.name);
  ASSERT_FIXTURE(path);
  Result<HeadCheckpoint> r = read_head_checkpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), bad.code) << r.status().to_string();
  EXPECT_CONTAINS(r.status().message(), bad.message);
  EXPECT_CONTAINS(r.status().message(), path);
}

INSTANTIATE_TEST_SUITE_P(
    HandMade, HeadCheckpointRefuses,
    ::testing::Values(
        BadHead{"head_temperature_zero.pt", ErrorCode::InvalidArtifact,
                "'temperature' is 0; it must be finite and > 0"},
        BadHead{"head_temperature_negative.pt", ErrorCode::InvalidArtifact, "'temperature' is -1.5"},
        BadHead{"head_temperature_nan.pt", ErrorCode::InvalidArtifact, "'temperature' is nan"},
        BadHead{"head_temperature_str.pt", ErrorCode::InvalidArtifact,
                "'temperature' has type str; expected int or float"},
        BadHead{"head_option_isolation.pt", ErrorCode::Unsupported,
                "released Kev checkpoints never set option_isolation; refusing"},
        BadHead{"head_special_embeddings.pt", ErrorCode::Unsupported, "'special_embeddings' is true"},
        BadHead{"head_weights_merged.pt", ErrorCode::InvalidArtifact,
                "'weights' is 'merged'; expected \"lora\" or \"full\""},
        BadHead{"head_lora_str.pt", ErrorCode::InvalidArtifact, "'lora' has type str; expected int"},
        BadHead{"head_base_int.pt", ErrorCode::InvalidArtifact, "'base' has type int; expected str"},
        BadHead{"head_missing_head.pt", ErrorCode::InvalidArtifact, "required key 'head' is missing"},
        BadHead{"head_not_dict.pt", ErrorCode::InvalidArtifact, "holds a value of type list"},
        BadHead{"head_k_width_mismatch.pt", ErrorCode::InvalidArtifact,
                "'head.k.weight' has shape [4, 2]; expected [4, 3] to match q.weight"},
        BadHead{"head_dim_mismatch.pt", ErrorCode::InvalidArtifact,
                "'head.q.weight' has shape [4, 3]; expected [8, d] with head_dim 8"},
        BadHead{"head_bias_shape.pt", ErrorCode::InvalidArtifact, "'head.q.bias' has shape [5]; expected [4]"},
        BadHead{"head_missing_k_bias.pt", ErrorCode::InvalidArtifact, "'head' has no 'k.bias' tensor"},
        BadHead{"head_extra_tensor.pt", ErrorCode::InvalidArtifact, "'head' has an unexpected entry 'scale'"},
        BadHead{"head_int64_weight.pt", ErrorCode::InvalidArtifact, "'head.q.bias' is int64"},
        BadHead{"head_nan_weight.pt", ErrorCode::InvalidArtifact, "'head.k.bias' element 1 is nan"},
        BadHead{"global_os_system.pt", ErrorCode::InvalidArtifact,
                "holds a value of type os.system; expected the dict Kev's trainer saves"},
        BadHead{"head_temperature_numpy.pt", ErrorCode::InvalidArtifact,
                "'temperature' is a numpy.core.multiarray.scalar object, which this reader does not decode; "
                "expected int or float"},
        BadHead{"head_weight_opaque.pt", ErrorCode::InvalidArtifact,
                "'head.q.weight' is a pathlib.PosixPath object, which this reader does not decode; expected tensor"},
        BadHead{"legacy_magic.pt", ErrorCode::Unsupported, "legacy torch serialization"}),
    [](const ::testing::TestParamInfo<BadHead>& info) {
      std::string name = info.param.name;
      return name.substr(0, name.find('.'));
    });

}  // namespace
}  // namespace kev
