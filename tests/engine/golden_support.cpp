#include "golden_support.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/check.h"
#include "model/checkpoint_import.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/encode.h"

namespace kev::golden {

namespace fs = std::filesystem;

std::string golden_dir() { return std::string(KEV_FIXTURES_DIR) + "/golden"; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  return json::parse(in);
}

ExportedModel::ExportedModel(const std::string& checkpoint, const std::string& base, const std::string& name)
    : dir((fs::temp_directory_path() / ("kev-golden-" + name + "-" + std::to_string(::getpid()))).string()) {
  ImportOptions o;
  o.checkpoint_dir = checkpoint;
  o.base_dir = base;
  o.out_dir = dir;
  auto summary = export_checkpoint(o);
  EXPECT_TRUE(summary.ok()) << summary.status().to_string();
}

ExportedModel::~ExportedModel() { fs::remove_all(dir); }

void check_requests(Engine& engine, const json& expected, double* worst_p, double* worst_z) {
  *worst_p = *worst_z = 0;
  for (const json& r : expected["requests"]) {
    auto request = parse_request(r["body"].dump());
    ASSERT_TRUE(request.ok()) << r["name"] << ": " << request.status().to_string();
    EXPECT_EQ(escape_control_tokens(request->state_text), r["state_text"].get<std::string>()) << r["name"];
    auto prefix = engine.prefill(request->state_text);
    ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
    EXPECT_EQ(prefix->tokens(), r["state_ids"].get<std::vector<int32_t>>()) << r["name"];
    auto answers = engine.evaluate(*prefix, request->questions);
    ASSERT_TRUE(answers.ok()) << r["name"] << ": " << answers.status().to_string();
    const json& qs = r["questions"];
    ASSERT_EQ(answers->answers.size(), qs.size());
    for (size_t q = 0; q < qs.size(); ++q) {
      const Answer& a = answers->answers[q];
      const auto p = qs[q]["probabilities"].get<std::vector<double>>();
      const auto z = qs[q]["logits"].get<std::vector<double>>();
      ASSERT_EQ(a.probabilities.size(), p.size()) << r["name"] << " " << a.id;
      EXPECT_EQ(a.option_keys, qs[q]["keys"].get<std::vector<std::string>>());
      for (size_t j = 0; j < p.size(); ++j) {
        *worst_p = std::max(*worst_p, std::fabs(a.probabilities[j] - p[j]));
        *worst_z = std::max(*worst_z, std::fabs(a.logits[j] - z[j]));
      }
    }
  }
}

namespace {

struct Runner {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
};

Result<Runner> make_runner(const ModelFile& model, const std::string& backend_name) {
  Runner r;
  KEV_ASSIGN_OR_RETURN(r.backend, create_backend(backend_name, BackendOptions{}));
  KEV_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(*r.backend, model));
  r.runner = std::make_unique<ModelRunner>(r.backend, model.config, std::move(weights), 1.0);
  return r;
}

Result<std::vector<float>> read_back(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  KEV_TRY(b.download(t, v.data(), v.size() * sizeof(float)));
  return v;
}

Status max_diff(Runner& a, const Tensor& ta, Runner& b, const Tensor& tb, double* worst) {
  KEV_ASSIGN_OR_RETURN(std::vector<float> va, read_back(*a.backend, ta));
  KEV_ASSIGN_OR_RETURN(std::vector<float> vb, read_back(*b.backend, tb));
  KEV_CHECK(va.size() == vb.size(), ErrorCode::Internal, "state tensors differ in size");
  for (size_t i = 0; i < va.size(); ++i) *worst = std::max(*worst, static_cast<double>(std::fabs(va[i] - vb[i])));
  return Status::success();
}

}  // namespace

Result<BackendDiff> compare_with_cpu(const std::string& model_dir, const std::string& backend, const json& expected) {
  BackendDiff d;
  KEV_ASSIGN_OR_RETURN(ModelFile model, read_model_file(model_dir));
  {
    KEV_ASSIGN_OR_RETURN(Runner cpu, make_runner(model, "cpu"));
    KEV_ASSIGN_OR_RETURN(Runner dev, make_runner(model, backend));
    for (const json& r : expected["requests"]) {
      const auto ids = r["state_ids"].get<std::vector<int32_t>>();
      KEV_ASSIGN_OR_RETURN(PrefixState pc, cpu.runner->prefill(ids));
      KEV_ASSIGN_OR_RETURN(PrefixState pd, dev.runner->prefill(ids));
      for (size_t i = 0; i < pc.conv.size(); ++i) {
        KEV_TRY(max_diff(cpu, pc.conv[i], dev, pd.conv[i], &d.conv));
        KEV_TRY(max_diff(cpu, pc.recurrent[i], dev, pd.recurrent[i], &d.recurrent));
      }
      for (size_t i = 0; i < pc.k.size(); ++i) {
        KEV_TRY(max_diff(cpu, pc.k[i], dev, pd.k[i], &d.k));
        KEV_TRY(max_diff(cpu, pc.v[i], dev, pd.v[i], &d.v));
      }
    }
  }
  Options co, go;
  go.backend = backend;
  KEV_ASSIGN_OR_RETURN(Engine cpu, Engine::load(model_dir, co));
  KEV_ASSIGN_OR_RETURN(Engine dev, Engine::load(model_dir, go));
  for (const json& r : expected["requests"]) {
    KEV_ASSIGN_OR_RETURN(Request request, parse_request(r["body"].dump()));
    KEV_ASSIGN_OR_RETURN(Answers ac, cpu.system_one(request.state_text, request.questions));
    KEV_ASSIGN_OR_RETURN(Answers ad, dev.system_one(request.state_text, request.questions));
    for (size_t q = 0; q < ac.answers.size(); ++q)
      for (size_t j = 0; j < ac.answers[q].logits.size(); ++j)
        d.logits = std::max(d.logits, std::fabs(ac.answers[q].logits[j] - ad.answers[q].logits[j]));
  }
  return d;
}

}  // namespace kev::golden
