// Golden parity against HF transformers (tests/fixtures/golden, made by reference/golden/make_golden.py
// from Qwen3_5TextModel in float64; docs/golden.md). The fixture is an upstream-layout checkpoint (HF
// config.json + model.safetensors + head.pt + tokenizer.json): it goes through export_checkpoint, then
// the Engine; the encoding, the reused state, the logits and the probabilities are compared.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "golden_support.h"
#include "io/safetensors.h"
#include "kev/kev.h"
#include "model/checkpoint_import.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {
namespace {

using golden::check_requests;
using golden::ExportedModel;
using golden::json;
using golden::read_json;
const std::string kGolden = golden::golden_dir();

// Tolerances (docs/numerics.md): against HF's float64 values; HF's own float32 run lands at 2.8e-6 (p),
// 2.7e-5 (logits) and 5e-5 (state).
constexpr double kProbTol = 1e-5;
constexpr double kLogitTol = 1e-4;
constexpr double kStateTol = 2e-4;

TEST(Golden, CpuMatchesHfProbabilitiesAndLogits) {
  const json expected = read_json(kGolden + "/expected.json");
  ExportedModel model(kGolden + "/tiny", kGolden + "/tiny", "tiny");
  auto engine = Engine::load(model.dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->info().checkpoint_id, expected["head"]["checkpoint_id"].get<std::string>());
  EXPECT_DOUBLE_EQ(engine->info().temperature, expected["head"]["temperature"].get<double>());
  double worst_p = 0, worst_z = 0;
  check_requests(*engine, expected, &worst_p, &worst_z);
  EXPECT_LE(worst_p, kProbTol);
  EXPECT_LE(worst_z, kLogitTol);
  std::printf("golden: max |Δp| = %.3g, max |Δlogit| = %.3g over %zu requests\n", worst_p, worst_z,
              expected["requests"].size());
}

TEST(Golden, EncodingMatchesTheReferenceEncoder) {
  const json expected = read_json(kGolden + "/expected.json");
  auto tok = Tokenizer::load(kGolden + "/tiny/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto ids = resolve_special_ids(*tok);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(ids->state, expected["delimiters"]["state"].get<int32_t>());
  EXPECT_EQ(ids->question, expected["delimiters"]["question"].get<int32_t>());
  EXPECT_EQ(ids->option_open, expected["delimiters"]["open"].get<int32_t>());
  EXPECT_EQ(ids->option_close, expected["delimiters"]["close"].get<int32_t>());
  EXPECT_EQ(ids->decide, expected["delimiters"]["decide"].get<int32_t>());
  EXPECT_EQ(ids->pad, expected["delimiters"]["pad"].get<int32_t>());
  Encoder encoder(*tok, *ids, Limits{});
  for (const json& r : expected["requests"]) {
    auto request = parse_request(r["body"].dump());
    ASSERT_TRUE(request.ok());
    const int64_t Ls = r["Ls"].get<int64_t>();
    for (size_t q = 0; q < request->questions.size(); ++q) {
      auto row = encoder.encode_question(request->questions[q], Ls);
      ASSERT_TRUE(row.ok()) << row.status().to_string();
      const json& eq = r["questions"][q];
      EXPECT_EQ(row->tokens, eq["row_ids"].get<std::vector<int32_t>>()) << r["name"] << " " << eq["id"];
      EXPECT_EQ(row->close_offsets, eq["close"].get<std::vector<int32_t>>());
      EXPECT_EQ(row->decide_offset, eq["decide"].get<int32_t>());
    }
  }
}

// Batch composition: every question of every request asked alone on the same prefix vs all together.
// OpenBLAS's sgemm is not row-invariant (a row's result depends on how many rows share the call), so
// this is FP reassociation, not bitwise equality (docs/numerics.md).
TEST(Golden, QuestionsTogetherEqualQuestionsAlone) {
  const json expected = read_json(kGolden + "/expected.json");
  ExportedModel model(kGolden + "/tiny", kGolden + "/tiny", "batch");
  auto engine = Engine::load(model.dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  double worst = 0;
  for (const json& r : expected["requests"]) {
    auto request = parse_request(r["body"].dump());
    ASSERT_TRUE(request.ok());
    auto prefix = engine->prefill(request->state_text);
    ASSERT_TRUE(prefix.ok());
    auto together = engine->evaluate(*prefix, request->questions);
    ASSERT_TRUE(together.ok());
    for (size_t q = 0; q < request->questions.size(); ++q) {
      auto alone = engine->evaluate(*prefix, {request->questions[q]});
      ASSERT_TRUE(alone.ok());
      for (size_t j = 0; j < alone->answers[0].probabilities.size(); ++j)
        worst = std::max(worst, std::fabs(alone->answers[0].probabilities[j] - together->answers[q].probabilities[j]));
    }
  }
  EXPECT_LE(worst, 1e-6);
  std::printf("golden: questions together vs alone, max |Δp| = %.3g\n", worst);
}

// The reused state after the state pass (conv, recurrent, K/V) against HF's own cache.
TEST(Golden, StateSnapshotMatchesHfCache) {
  const json expected = read_json(kGolden + "/expected.json");
  auto tensors = SafetensorsFile::open(kGolden + "/expected_tensors.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
  ExportedModel dir(kGolden + "/tiny", kGolden + "/tiny", "state");
  auto model = read_model_file(dir.dir);
  ASSERT_TRUE(model.ok());
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  auto weights = load_model_weights(**backend, *model);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  const ModelConfig cfg = model->config;
  ModelRunner runner(*backend, cfg, std::move(*weights), 1.0);

  double worst[4] = {0, 0, 0, 0};  // conv, recurrent, k, v
  for (size_t r = 0; r < expected["requests"].size(); ++r) {
    const json& req = expected["requests"][r];
    const auto ids = req["state_ids"].get<std::vector<int32_t>>();
    auto prefix = runner.prefill(ids);
    ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
    const int64_t Ls = static_cast<int64_t>(ids.size());
    size_t ig = 0, ia = 0;
    for (int64_t il = 0; il < cfg.n_layers; ++il) {
      const std::string base = "r" + std::to_string(r) + ".state.L" + std::to_string(il);
      auto compare = [&](const Tensor& ours, const std::string& name, bool kv, double* w) {
        auto ref = tensors->read_f32(name);
        ASSERT_TRUE(ref.ok()) << ref.status().to_string();
        std::vector<float> got(static_cast<size_t>(ours.numel()));
        ASSERT_TRUE((*backend)->download(ours, got.data(), got.size() * 4).ok());
        ASSERT_EQ(got.size(), ref->data.size()) << name;
        const int64_t H = cfg.n_head_kv, hd = cfg.head_dim;
        for (size_t i = 0; i < got.size(); ++i) {
          // ours [Ls, H_kv, hd]; HF's [H_kv, Ls, hd]
          size_t j = i;
          if (kv) {
            const int64_t t = static_cast<int64_t>(i) / (H * hd), h = (static_cast<int64_t>(i) / hd) % H, e = static_cast<int64_t>(i) % hd;
            j = static_cast<size_t>((h * Ls + t) * hd + e);
          }
          *w = std::max(*w, static_cast<double>(std::fabs(got[i] - ref->data[j])));
        }
      };
      if (cfg.layer_types[il] == LayerType::GatedDeltaNet) {
        compare(prefix->conv[ig], base + ".conv", false, &worst[0]);
        compare(prefix->recurrent[ig], base + ".recurrent", false, &worst[1]);
        ++ig;
      } else {
        compare(prefix->k[ia], base + ".k", true, &worst[2]);
        compare(prefix->v[ia], base + ".v", true, &worst[3]);
        ++ia;
      }
    }
  }
  EXPECT_LE(worst[0], kStateTol);
  EXPECT_LE(worst[1], kStateTol);
  EXPECT_LE(worst[2], kStateTol);
  EXPECT_LE(worst[3], kStateTol);
  std::printf("golden state: max |Δ| conv %.3g, recurrent %.3g, K %.3g, V %.3g\n", worst[0], worst[1], worst[2], worst[3]);
}

// The upstream layout with a peft LoRA adapter over the tiny base, merged at import (tests/fixtures/upstream).
TEST(Golden, LoraCheckpointMatchesPeftMergedModel) {
  const std::string up = std::string(KEV_FIXTURES_DIR) + "/upstream";
  const json expected = read_json(up + "/expected.json");
  ExportedModel model(up, kGolden + "/tiny", "lora");
  auto engine = Engine::load(model.dir, {});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  double worst_p = 0, worst_z = 0;
  check_requests(*engine, expected, &worst_p, &worst_z);
  EXPECT_LE(worst_p, kProbTol);
  EXPECT_LE(worst_z, kLogitTol);
  std::printf("lora golden: max |Δp| = %.3g, max |Δlogit| = %.3g\n", worst_p, worst_z);
}

}  // namespace
}  // namespace kev
