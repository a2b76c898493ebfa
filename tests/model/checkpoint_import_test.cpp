// Upstream checkpoint import (model/checkpoint_import.h): the LoRA fixture merged against peft's own
// merge, the scale variants checked by hand, deterministic exports, and corrupt or mismatched
// checkpoints, each made by copying tests/fixtures/{golden/tiny,upstream} into a temp dir and editing
// the copy (fixtures are never modified).
#include "model/checkpoint_import.h"

#include <zip.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io/temp_dir.h"
#include "model/head_checkpoint.h"
#include "model/model_file.h"

namespace kev {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const std::string kFixtures = KEV_FIXTURES_DIR;
const std::string kBase = kFixtures + "/golden/tiny";
const std::string kUpstream = kFixtures + "/upstream";

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

#define ASSERT_FIXTURES()                                                                                      \
  ASSERT_TRUE(fs::exists(kBase + "/head.pt") && fs::exists(kUpstream + "/adapter_model.safetensors"))         \
      << "missing fixtures under " << kFixtures << " (reference/golden/make_golden.py makes them)"

// A copy of a fixture directory in a fresh temp dir.
class Copy {
 public:
  explicit Copy(const std::string& src) {
    EXPECT_TRUE(tmp_.ok());
    fs::copy(src, dir(), fs::copy_options::recursive);
  }
  std::string dir() const { return tmp_.path("ck"); }
  std::string path(const std::string& name) const { return dir() + "/" + name; }

 private:
  TempDir tmp_;
};

struct Entry {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Entry> read_entries(const std::string& path) {
  std::vector<Entry> out;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return out;
  for (const SafeTensorInfo& t : f->tensors()) {
    const auto bytes = f->bytes(t);
    out.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(bytes.begin(), bytes.end())});
  }
  return out;
}

void write_entries(const std::string& path, const std::vector<Entry>& entries) {
  SafetensorsWriter w;
  for (const Entry& e : entries) ASSERT_TRUE(w.add(e.name, e.dtype, e.shape, e.bytes).ok()) << e.name;
  const Status st = w.write(path);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

Entry f32_entry(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, StDtype::F32, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * 4, 0)};
}

// Rewrites the safetensors file at `path` keeping the tensors `keep` accepts, then appending `extra`.
void edit_safetensors(const std::string& path, const std::function<bool(const Entry&)>& keep,
                      const std::vector<Entry>& extra = {}) {
  std::vector<Entry> kept;
  for (Entry& e : read_entries(path)) {
    if (keep(e)) kept.push_back(std::move(e));
  }
  kept.insert(kept.end(), extra.begin(), extra.end());
  write_entries(path, kept);
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump(2);
}

// Applies `edit` to the pickle (<stem>/data.pkl) of a torch.save zip, rewriting the archive with libzip
// (which recomputes the CRCs the reader verifies).
void edit_pickle(const std::string& path, const std::function<void(std::string&)>& edit) {
  int err = 0;
  zip_t* z = zip_open(path.c_str(), 0, &err);
  ASSERT_NE(z, nullptr) << "cannot open " << path << " as zip (" << err << ")";
  zip_int64_t index = -1;
  for (zip_int64_t i = 0; i < zip_get_num_entries(z, 0); ++i) {
    if (std::string(zip_get_name(z, static_cast<zip_uint64_t>(i), 0)).ends_with("/data.pkl")) index = i;
  }
  ASSERT_GE(index, 0) << path << " has no data.pkl";
  zip_stat_t st;
  ASSERT_EQ(zip_stat_index(z, static_cast<zip_uint64_t>(index), 0, &st), 0);
  std::string pkl(st.size, '\0');
  zip_file_t* f = zip_fopen_index(z, static_cast<zip_uint64_t>(index), 0);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(zip_fread(f, pkl.data(), pkl.size()), static_cast<zip_int64_t>(pkl.size()));
  zip_fclose(f);
  edit(pkl);
  zip_source_t* src = zip_source_buffer(z, pkl.data(), pkl.size(), 0);
  ASSERT_NE(src, nullptr);
  ASSERT_EQ(zip_file_replace(z, static_cast<zip_uint64_t>(index), src, 0), 0) << zip_strerror(z);
  ASSERT_EQ(zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0), 0);
  ASSERT_EQ(zip_close(z), 0) << zip_strerror(z);
}

// Replaces a protocol-2 BINUNICODE string by another of the same length.
void replace_pickle_string(std::string& pkl, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  const std::string op = std::string("X") + static_cast<char>(from.size()) + std::string(3, '\0');
  const size_t at = pkl.find(op + from);
  ASSERT_NE(at, std::string::npos) << "pickle has no string '" << from << "'";
  pkl.replace(at + op.size(), from.size(), to);
}

Status open_error(const std::string& checkpoint, const std::string& base, double scale = 1.0) {
  auto r = open_checkpoint(checkpoint, base, scale);
  return r.ok() ? Status(ErrorCode::Internal, "opened without error") : r.status();
}

HostTensor read_base(const std::string& name) {
  auto f = SafetensorsFile::open(kBase + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  auto t = f->read_f32(name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : HostTensor();
}

// W + scale·B·A in double for the adapter of `name` in `adapter_path`.
std::vector<double> merged_by_hand(const std::string& adapter_path, const std::string& name, double scale) {
  const HostTensor w = read_base(name);
  auto f = SafetensorsFile::open(adapter_path);
  EXPECT_TRUE(f.ok());
  const std::string stem = "base_model.model." + name.substr(0, name.size() - 7);
  auto a = f->read_f32(stem + ".lora_A.weight");
  auto b = f->read_f32(stem + ".lora_B.weight");
  EXPECT_TRUE(a.ok() && b.ok());
  const int64_t out = w.shape[0], in = w.shape[1], r = a->shape[0];
  std::vector<double> m(w.data.begin(), w.data.end());
  for (int64_t i = 0; i < out; ++i) {
    for (int64_t j = 0; j < in; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(b->data[i * r + k]) * double(a->data[k * in + j]);
      m[i * in + j] += scale * acc;
    }
  }
  return m;
}

void expect_merged(const OpenedCheckpoint& ck, const std::string& adapter_path, const std::string& name, double scale) {
  auto got = ck.tensors(name);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  const std::vector<double> want = merged_by_hand(adapter_path, name, scale);
  ASSERT_EQ(got->data.size(), want.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(got->data[i] - want[i]));
    largest = std::max(largest, std::fabs(want[i]));
  }
  EXPECT_LE(worst, 1e-6 * std::max(1.0, largest)) << name;
  const HostTensor base = read_base(name);
  double moved = 0;
  for (size_t i = 0; i < want.size(); ++i) moved = std::max(moved, std::fabs(want[i] - base.data[i]));
  EXPECT_GT(moved, 1e-4) << name << ": the adapter should change the weight";
}

// ---- the LoRA fixture --------------------------------------------------------------------------

TEST(CheckpointImport, OpensThePeftFixtureAndSummarisesIt) {
  ASSERT_FIXTURES();
  auto ck = open_checkpoint(kUpstream, kBase);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ImportSummary& s = ck->summary;
  auto id = checkpoint_id(kUpstream + "/head.pt");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(s.checkpoint_id, *id);
  EXPECT_EQ(ck->meta.checkpoint_id, *id);
  EXPECT_DOUBLE_EQ(s.temperature, 2.35);
  EXPECT_DOUBLE_EQ(ck->meta.temperature, 2.35);
  EXPECT_EQ(s.lora_rank, 16);
  EXPECT_DOUBLE_EQ(s.lora_scale, 2.0);
  // 6 GDN layers x (5 mixer + 3 MLP) + 2 attention layers x (4 + 3).
  EXPECT_EQ(s.lora_modules, 62);
  EXPECT_EQ(s.merged_by_module.size(), 12u);
  EXPECT_EQ(s.lora_parameters, s.lora_parameters_all);
  EXPECT_EQ(ck->tokenizer_path, kBase + "/tokenizer.json");
  EXPECT_EQ(ck->meta.pointer_dim, 256);
  EXPECT_EQ(ck->config.n_embd, 64);
}

TEST(CheckpointImport, MergedWeightsMatchPeftAndAHandComputation) {
  ASSERT_FIXTURES();
  auto ck = open_checkpoint(kUpstream, kBase);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(kUpstream + "/expected.json"));
  for (const auto& [name, sum] : expected.at("merged_weight_sums_fp64").items()) {
    auto t = ck->tensors(name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    double ours = 0;
    for (float v : t->data) ours += v;
    EXPECT_NEAR(ours, sum.get<double>(), 1e-4) << name;
  }
  for (const auto& [name, first] : expected.at("merged_weight_samples_fp64").items()) {
    auto t = ck->tensors(name);
    ASSERT_TRUE(t.ok());
    for (size_t i = 0; i < first.size(); ++i) EXPECT_NEAR(t->data[i], first[i].get<double>(), 1e-6) << name;
  }
  expect_merged(*ck, kUpstream + "/adapter_model.safetensors", "layers.0.linear_attn.in_proj_b.weight", 2.0);
  expect_merged(*ck, kUpstream + "/adapter_model.safetensors", "layers.3.self_attn.k_proj.weight", 2.0);
  // Not adapted: bit-identical to the base.
  auto norm = ck->tensors("layers.0.input_layernorm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->data, read_base("layers.0.input_layernorm.weight").data);
  auto conv = ck->tensors("layers.0.linear_attn.conv1d.weight");
  ASSERT_TRUE(conv.ok());
  EXPECT_EQ(conv->shape, (std::vector<int64_t>{256, 4}));
}

TEST(CheckpointImport, RsLoraAndTheUserScaleChangeTheMergeScale) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  edit_json(c.path("adapter_config.json"), [](nlohmann::json& j) { j["use_rslora"] = true; });
  auto ck = open_checkpoint(c.dir(), kBase, 0.5);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const double scale = 0.5 * 32.0 / std::sqrt(16.0);  // s·α/√r = 4
  EXPECT_DOUBLE_EQ(ck->summary.lora_scale, scale);
  expect_merged(*ck, c.path("adapter_model.safetensors"), "layers.0.linear_attn.in_proj_b.weight", scale);
  expect_merged(*ck, c.path("adapter_model.safetensors"), "layers.7.mlp.down_proj.weight", scale);
}

TEST(CheckpointImport, NoAdapterMeansTheBaseWeights) {
  ASSERT_FIXTURES();
  auto ck = open_checkpoint(kBase, kBase);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->summary.lora_rank, 0);
  EXPECT_EQ(ck->summary.lora_modules, 0);
  auto w = ck->tensors("layers.0.mlp.up_proj.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->data, read_base("layers.0.mlp.up_proj.weight").data);
  auto q = ck->tensors("kev_head.q.weight");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->shape, (std::vector<int64_t>{256, 64}));
}

TEST(CheckpointImport, RecognisesCheckpointDirectoriesAndDefaultDtypes) {
  ASSERT_FIXTURES();
  EXPECT_TRUE(is_checkpoint_dir(kUpstream));
  EXPECT_TRUE(is_checkpoint_dir(kBase));
  EXPECT_FALSE(is_checkpoint_dir(kFixtures + "/config"));
  EXPECT_EQ(default_export_dtype("cuda"), "bf16");
  EXPECT_EQ(default_export_dtype("cpu"), "fp32");
  EXPECT_EQ(default_export_dtype("webgpu"), "fp32");
}

// ---- exports -----------------------------------------------------------------------------------

TEST(CheckpointImport, ExportingTwiceGivesIdenticalBytes) {
  ASSERT_FIXTURES();
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  std::string bytes[2], json[2];
  for (int i = 0; i < 2; ++i) {
    ImportOptions o;
    o.checkpoint_dir = kUpstream;
    o.base_dir = kBase;
    o.out_dir = tmp.path("out" + std::to_string(i));
    uint64_t last = 0, total = 0;
    o.progress = [&](uint64_t done, uint64_t all) {
      EXPECT_GE(done, last);
      last = done;
      total = all;
    };
    auto s = export_checkpoint(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(last, total);
    bytes[i] = testing::read_file(o.out_dir + "/weights.safetensors");
    json[i] = testing::read_file(o.out_dir + "/model.json");
    EXPECT_EQ(testing::read_file(o.out_dir + "/tokenizer.json"), testing::read_file(kBase + "/tokenizer.json"));
  }
  ASSERT_FALSE(bytes[0].empty());
  EXPECT_TRUE(bytes[0] == bytes[1]) << "weights.safetensors differs between two exports";
  EXPECT_EQ(json[0], json[1]);

  // The file holds exactly the merged tensors, all F32 in an fp32 export.
  auto ck = open_checkpoint(kUpstream, kBase);
  ASSERT_TRUE(ck.ok());
  auto f = SafetensorsFile::open(tmp.path("out0/weights.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  for (const WeightSpec& spec : weight_specs(ck->config, ck->meta.pointer_dim)) {
    const SafeTensorInfo* info = f->find(spec.name);
    ASSERT_NE(info, nullptr) << spec.name;
    EXPECT_EQ(info->dtype, StDtype::F32) << spec.name;
    auto stored = f->read_f32(*info);
    auto merged = ck->tensors(spec.name);
    ASSERT_TRUE(stored.ok() && merged.ok());
    EXPECT_EQ(stored->data, merged->data) << spec.name;
  }
  auto model = read_model_file(tmp.path("out0"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->kev.checkpoint_id, ck->summary.checkpoint_id);
  EXPECT_EQ(model->kev.dtype, "fp32");
}

TEST(CheckpointImport, Bf16ExportRoundsProjectionsOnceAndKeepsTheRestF32) {
  ASSERT_FIXTURES();
  TempDir tmp;
  ImportOptions o;
  o.checkpoint_dir = kUpstream;
  o.base_dir = kBase;
  o.out_dir = tmp.path("bf16");
  o.dtype = "bf16";
  o.backend = "cuda";
  o.limits.max_prefix = 100;
  o.limits.max_context = 200;
  ASSERT_TRUE(export_checkpoint(o).ok());
  auto f = SafetensorsFile::open(o.out_dir + "/weights.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->find("layers.0.mlp.up_proj.weight")->dtype, StDtype::BF16);
  EXPECT_EQ(f->find("layers.0.linear_attn.A_log")->dtype, StDtype::F32);
  EXPECT_EQ(f->find("layers.0.linear_attn.dt_bias")->dtype, StDtype::F32);
  EXPECT_EQ(f->find("norm.weight")->dtype, StDtype::F32);
  EXPECT_EQ(f->find("kev_head.q.weight")->dtype, StDtype::F32);
  auto model = read_model_file(o.out_dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->kev.dtype, "bf16");
  EXPECT_EQ(model->kev.backend, "cuda");
  EXPECT_EQ(model->kev.limits.max_prefix, 100);
  EXPECT_EQ(model->kev.limits.max_context, 200);
}

// ---- bad inputs --------------------------------------------------------------------------------

TEST(CheckpointImportErrors, MissingHeadPt) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  fs::remove(c.path("head.pt"));
  const Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "has no head.pt");
}

TEST(CheckpointImportErrors, TruncatedHeadPt) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  const std::string bytes = testing::read_file(c.path("head.pt"));
  testing::write_file(c.path("head.pt"), std::string_view(bytes).substr(0, bytes.size() / 2));
  const Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact) << st.to_string();
  EXPECT_CONTAINS(st.message(), "head.pt");
}

TEST(CheckpointImportErrors, MissingBaseSaysWhichToPass) {
  ASSERT_FIXTURES();
  Status st = open_error(kUpstream, "");
  EXPECT_EQ(st.code(), ErrorCode::InvalidRequest);
  EXPECT_CONTAINS(st.message(), "'kev-golden-tiny'");
  EXPECT_CONTAINS(st.message(), "revision '0000000000000000000000000000000000000000'");
  EXPECT_CONTAINS(st.message(), "--base");
  TempDir tmp;
  st = open_error(kUpstream, tmp.path("no-such-base"));
  EXPECT_EQ(st.code(), ErrorCode::Io);
  EXPECT_CONTAINS(st.message(), "no-such-base");
  EXPECT_CONTAINS(st.message(), "kev-golden-tiny");
}

TEST(CheckpointImportErrors, HeadWidthDiffersFromTheBase) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  fs::copy_file(kFixtures + "/pickle/head_ok.pt", c.path("head.pt"), fs::copy_options::overwrite_existing);
  const Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "d = 3");
  EXPECT_CONTAINS(st.message(), "hidden_size 64");
  EXPECT_CONTAINS(st.message(), "Qwen/Qwen3.5-0.8B-Base");
}

TEST(CheckpointImportErrors, MissingAdapterTensor) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  edit_safetensors(c.path("adapter_model.safetensors"),
                   [](const Entry& e) { return e.name != "base_model.model.layers.2.mlp.up_proj.lora_B.weight"; });
  Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "'layers.2.mlp.up_proj' has lora_A but no lora_B");

  // Both halves gone: the module is still a target of adapter_config.json.
  edit_safetensors(c.path("adapter_model.safetensors"),
                   [](const Entry& e) { return e.name != "base_model.model.layers.2.mlp.up_proj.lora_A.weight"; });
  st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "no lora_A/lora_B tensors for 'layers.2.mlp.up_proj'");
  EXPECT_CONTAINS(st.message(), "targets 'up_proj'");
}

TEST(CheckpointImportErrors, WrongLoraShape) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  const std::string name = "base_model.model.layers.0.mlp.up_proj.lora_A.weight";
  edit_safetensors(c.path("adapter_model.safetensors"), [&](const Entry& e) { return e.name != name; },
                   {f32_entry(name, {8, 64})});
  const Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "'layers.0.mlp.up_proj.weight' has lora_A [8,64]");
  EXPECT_CONTAINS(st.message(), "needs lora_A [16,64] and lora_B [128,16]");
}

TEST(CheckpointImportErrors, LeftoverAdapterTensor) {
  ASSERT_FIXTURES();
  for (const std::string name : {"base_model.model.layers.9.mlp.up_proj.lora_A.weight",
                                 "base_model.model.layers.0.mlp.up_proj.lora_embedding_A",
                                 "base_model.model.layers.0.input_layernorm.lora_A.weight",
                                 "base_model.model.layers.0.self_attn.q_proj.lora_A.weight"}) {
    Copy c(kUpstream);
    edit_safetensors(c.path("adapter_model.safetensors"), [](const Entry&) { return true; },
                     {f32_entry(name, {16, 64})});
    const Status st = open_error(c.dir(), kBase);
    EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact) << name;
    EXPECT_CONTAINS(st.message(), "'" + name + "' matches no adapted projection");
  }
}

TEST(CheckpointImportErrors, RefusesModulesToSaveAndOtherPeftFeatures) {
  ASSERT_FIXTURES();
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"modules_to_save", {"lm_head"}},
      {"trainable_token_indices", {248060, 248061}},
      {"use_dora", true},
      {"rank_pattern", {{"q_proj", 8}}},
  };
  for (const auto& [key, value] : cases) {
    Copy c(kUpstream);
    edit_json(c.path("adapter_config.json"), [&](nlohmann::json& j) { j[key] = value; });
    const Status st = open_error(c.dir(), kBase);
    EXPECT_EQ(st.code(), ErrorCode::Unsupported) << key;
    EXPECT_CONTAINS(st.message(), "'" + key + "' is set");
  }
}

TEST(CheckpointImportErrors, AdapterRankDisagreesWithHeadPt) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  edit_json(c.path("adapter_config.json"), [](nlohmann::json& j) { j["r"] = 8; });
  const Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "r is 8 but head.pt records lora = 16");
}

TEST(CheckpointImportErrors, MissingAdapterFiles) {
  ASSERT_FIXTURES();
  Copy c(kUpstream);
  fs::remove(c.path("adapter_model.safetensors"));
  Status st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "no adapter_model.safetensors");
  fs::remove(c.path("adapter_config.json"));
  st = open_error(c.dir(), kBase);
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "head.pt says lora = 16");
}

TEST(CheckpointImportErrors, MissingBaseTensor) {
  ASSERT_FIXTURES();
  Copy base(kBase);
  edit_safetensors(base.path("model.safetensors"),
                   [](const Entry& e) { return e.name != "layers.5.linear_attn.A_log"; });
  const Status st = open_error(kUpstream, base.dir());
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "has no tensor 'layers.5.linear_attn.A_log'");
}

TEST(CheckpointImportErrors, WrongBaseTensorShape) {
  ASSERT_FIXTURES();
  Copy base(kBase);
  edit_safetensors(base.path("model.safetensors"),
                   [](const Entry& e) { return e.name != "layers.1.mlp.gate_proj.weight"; },
                   {f32_entry("layers.1.mlp.gate_proj.weight", {64, 64})});
  const Status st = open_error(kUpstream, base.dir());
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "'layers.1.mlp.gate_proj.weight'");
  EXPECT_CONTAINS(st.message(), "shape [64,64]; the configuration needs [128,64]");
}

// head.pt with weights = "full" and weights_dtype = "bf16": the golden head with two same-length strings
// swapped in its pickle ('fp32' -> 'bf16'; the 'lora' key -> 'full', which "weights" refers back to).
void make_full_bf16_checkpoint(const Copy& c) {
  edit_pickle(c.path("head.pt"), [](std::string& pkl) {
    replace_pickle_string(pkl, "fp32", "bf16");
    replace_pickle_string(pkl, "lora", "full");
  });
  auto head = read_head_checkpoint(c.path("head.pt"));
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  ASSERT_EQ(head->weights, "full");
  ASSERT_EQ(head->weights_dtype, "bf16");
}

TEST(CheckpointImportErrors, FullWeightsOfTheWrongDtype) {
  ASSERT_FIXTURES();
  Copy c(kBase);
  make_full_bf16_checkpoint(c);
  const Status st = open_error(c.dir(), "");
  EXPECT_EQ(st.code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(st.message(), "head.pt says weights_dtype bf16 but tensor 'embed_tokens.weight'");
  EXPECT_CONTAINS(st.message(), "is F32");
}

TEST(CheckpointImport, FullBf16WeightsLoadWithoutABase) {
  ASSERT_FIXTURES();
  Copy c(kBase);
  make_full_bf16_checkpoint(c);
  std::vector<Entry> entries;
  {
    auto f = SafetensorsFile::open(c.path("model.safetensors"));
    ASSERT_TRUE(f.ok());
    SafetensorsWriter w;
    for (const SafeTensorInfo& t : f->tensors()) {
      auto v = f->read_f32(t);
      ASSERT_TRUE(v.ok());
      ASSERT_TRUE(w.add_f32(t.name, *v, StDtype::BF16).ok());
    }
    ASSERT_TRUE(w.write(c.path("model.safetensors.new")).ok());
  }
  fs::rename(c.path("model.safetensors.new"), c.path("model.safetensors"));
  auto ck = open_checkpoint(c.dir(), "");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->summary.weights, "full");
  EXPECT_EQ(ck->summary.lora_rank, 0);
  auto t = ck->tensors("layers.0.mlp.up_proj.weight");
  ASSERT_TRUE(t.ok());
  const HostTensor base = read_base("layers.0.mlp.up_proj.weight");
  for (size_t i = 0; i < base.data.size(); ++i) {
    ASSERT_LE(std::fabs(t->data[i] - base.data[i]), 4e-3 * std::fabs(base.data[i])) << i;
  }
}

TEST(CheckpointImportErrors, NonFiniteLoraScale) {
  ASSERT_FIXTURES();
  const Status st = open_error(kUpstream, kBase, std::nan(""));
  EXPECT_EQ(st.code(), ErrorCode::InvalidRequest);
  EXPECT_CONTAINS(st.message(), "LoRA scale");
}

}  // namespace
}  // namespace kev
