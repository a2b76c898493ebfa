// Engine::load on an upstream checkpoint directory (head.pt + peft adapter, tests/fixtures/upstream,
// over tests/fixtures/golden/tiny): the answers equal peft's merged model within the golden tolerance,
// and equal those of the kev_export'ed directory bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/temp_dir.h"
#include "kev/kev.h"
#include "model/checkpoint_import.h"

namespace kev {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // request bodies keep their key order

const std::string kBase = std::string(KEV_FIXTURES_DIR) + "/golden/tiny";
const std::string kUpstream = std::string(KEV_FIXTURES_DIR) + "/upstream";

json expected_requests() {
  std::ifstream in(kUpstream + "/expected.json");
  EXPECT_TRUE(in.good()) << "missing fixture " << kUpstream << "/expected.json";
  return in.good() ? json::parse(in)["requests"] : json::array();
}

std::vector<Answers> run_all(Engine& engine, const json& requests) {
  std::vector<Answers> out;
  for (const json& r : requests) {
    auto request = parse_request(r["body"].dump());
    EXPECT_TRUE(request.ok()) << request.status().to_string();
    if (!request.ok()) continue;
    auto answers = engine.system_one(request->state_text, request->questions);
    EXPECT_TRUE(answers.ok()) << answers.status().to_string();
    if (answers.ok()) out.push_back(std::move(*answers));
  }
  return out;
}

TEST(CheckpointLoad, DirectLoadMatchesPeftAndTheExportBitForBit) {
  const json requests = expected_requests();
  ASSERT_FALSE(requests.empty());
  Options direct_opts;
  direct_opts.base_dir = kBase;
  auto direct = Engine::load(kUpstream, direct_opts);
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();

  testing::TempDir tmp;
  ImportOptions o;
  o.checkpoint_dir = kUpstream;
  o.base_dir = kBase;
  o.out_dir = tmp.path("exported");
  auto summary = export_checkpoint(o);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  auto exported = Engine::load(o.out_dir, {});
  ASSERT_TRUE(exported.ok()) << exported.status().to_string();

  EXPECT_EQ(direct->info().checkpoint_id, exported->info().checkpoint_id);
  EXPECT_EQ(direct->info().checkpoint_id, summary->checkpoint_id);
  EXPECT_DOUBLE_EQ(direct->info().temperature, 2.35);
  EXPECT_EQ(direct->info().dtype, "fp32");
  EXPECT_EQ(direct->info().limits.max_prefix, Limits{}.max_prefix);
  EXPECT_EQ(direct->info().limits.max_context, Limits{}.max_context);

  const std::vector<Answers> a = run_all(*direct, requests);
  const std::vector<Answers> b = run_all(*exported, requests);
  ASSERT_EQ(a.size(), requests.size());
  ASSERT_EQ(b.size(), requests.size());
  double worst_p = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].answers.size(), b[r].answers.size());
    for (size_t q = 0; q < a[r].answers.size(); ++q) {
      const Answer& x = a[r].answers[q];
      EXPECT_EQ(x.logits, b[r].answers[q].logits) << "request " << r << " question " << x.id;
      EXPECT_EQ(x.probabilities, b[r].answers[q].probabilities) << "request " << r << " question " << x.id;
      const auto p = requests[r]["questions"][q]["probabilities"].get<std::vector<double>>();
      ASSERT_EQ(x.probabilities.size(), p.size());
      for (size_t j = 0; j < p.size(); ++j) worst_p = std::max(worst_p, std::fabs(x.probabilities[j] - p[j]));
    }
  }
  EXPECT_LE(worst_p, 1e-5);
  std::printf("direct checkpoint load: max |Δp| vs peft = %.3g; identical to the export\n", worst_p);
}

TEST(CheckpointLoad, OverriddenLimitsAndLoraScaleApply) {
  Options opts;
  opts.base_dir = kBase;
  opts.override_limits = true;
  opts.limits.max_prefix = 50;
  opts.limits.max_context = 90;
  opts.lora_scale = 0;  // the base model with the Kev head
  auto engine = Engine::load(kUpstream, opts);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EXPECT_EQ(engine->info().limits.max_prefix, 50);
  EXPECT_EQ(engine->info().limits.max_context, 90);
  Options plain;
  plain.base_dir = kBase;
  auto merged = Engine::load(kUpstream, plain);
  ASSERT_TRUE(merged.ok());
  const Questions qs = {{"q", Noul{"Is this a refund request?", "", ""}}};
  auto a = engine->system_one("I want my money back.", qs);
  auto b = merged->system_one("I want my money back.", qs);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->answers[0].logits, b->answers[0].logits) << "scale 0 should drop the adapter";
}

TEST(CheckpointLoad, WithoutBaseTheErrorNamesIt) {
  auto engine = Engine::load(kUpstream, {});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), ErrorCode::InvalidRequest);
  const std::string msg = engine.status().message();
  EXPECT_NE(msg.find("kev-golden-tiny"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--base"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kev
