// torch.save zip archives: files written by real torch (tests/fixtures/headpt, described by JSON
// sidecars from reference/golden/make_golden.py) and hand-made ones from
// tests/fixtures/pickle/make_fixtures.py (every value kind, views, and broken or hostile files).

#include "io/torch_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/temp_dir.h"

namespace kev {
namespace {

std::string fixture(const std::string& rel) { return std::string(KEV_FIXTURES_DIR) + "/" + rel; }

#define ASSERT_FIXTURE(path)                                                                                    \
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing fixture " << (path)                                    \
                                             << " (tests/fixtures/pickle/make_fixtures.py or, for headpt/ and " \
                                                "golden/, reference/golden/make_golden.py makes it)"

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

PickleValue load(const std::string& path) {
  Result<PickleValue> r = read_torch_checkpoint(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : PickleValue();
}

const TorchTensor& tensor_at(const PickleDict& d, const std::string& key) {
  const PickleValue* v = d.find(key);
  static const TorchTensor kNoTensor;
  EXPECT_TRUE(v && v->if_tensor()) << key;
  return (v && v->if_tensor()) ? **v->if_tensor() : kNoTensor;
}

std::vector<float> f32(const TorchTensor& t) {
  Result<HostTensor> h = t.to_host_f32();
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (!h.ok()) return {};
  EXPECT_EQ(h->shape, t.shape);
  return h->data;
}

// ---- hand-made archives ----

TEST(TorchCheckpoint, ReadsEveryValueKind) {
  const std::string path = fixture("pickle/values.pt");
  ASSERT_FIXTURE(path);
  const PickleValue root = load(path);
  const PickleDict* d = root.if_dict();
  ASSERT_NE(d, nullptr);

  const TorchTensor& m = tensor_at(*d, "f32");
  EXPECT_EQ(m.dtype, TorchDtype::Float32);
  EXPECT_EQ(m.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(m.is_contiguous());
  EXPECT_EQ(f32(m), (std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f}));
  EXPECT_EQ(&tensor_at(*d, "shared"), &m);  // the same tensor object, through the memo

  const TorchTensor& tr = tensor_at(*d, "transposed");
  EXPECT_EQ(tr.storage, m.storage);  // one storage, loaded once
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(f32(tr), (std::vector<float>{-1.0f, 0.5f, -0.5f, 1.0f, 0.0f, 1.5f}));
  EXPECT_EQ(f32(tensor_at(*d, "row1")), (std::vector<float>{0.5f, 1.0f, 1.5f}));
  const TorchTensor& scalar = tensor_at(*d, "scalar");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(f32(scalar), (std::vector<float>{1.0f}));
  EXPECT_EQ(tensor_at(*d, "empty").numel(), 0);
  EXPECT_TRUE(f32(tensor_at(*d, "empty")).empty());

  const TorchTensor& bf = tensor_at(*d, "bf16");
  EXPECT_EQ(bf.dtype, TorchDtype::BFloat16);
  EXPECT_EQ(f32(bf), (std::vector<float>{1.5f, -2.25f, 0.125f, 3.0f}));
  const TorchTensor& half = tensor_at(*d, "f16");
  EXPECT_EQ(half.dtype, TorchDtype::Float16);
  EXPECT_EQ(f32(half), (std::vector<float>{0.5f, -65504.0f, std::ldexp(1.0f, -24)}));
  const TorchTensor& i64 = tensor_at(*d, "i64");
  EXPECT_EQ(i64.dtype, TorchDtype::Int64);
  ASSERT_TRUE(i64.to_int64().ok());
  EXPECT_EQ(i64.to_int64().value(), (std::vector<int64_t>{1, -2, int64_t{1} << 40}));
  EXPECT_CONTAINS(i64.to_host_f32().status().message(), "int64 tensors do not convert exactly to float32");
  EXPECT_CONTAINS(m.to_int64().status().message(), "float32 tensors are not integer tensors");
  EXPECT_EQ(f32(tensor_at(*d, "meta")), (std::vector<float>{7.0f}));
  EXPECT_EQ(f32(tensor_at(*d, "param")), (std::vector<float>{2.0f, 4.0f}));
  const PickleDict* state = d->find("state")->if_dict();
  ASSERT_NE(state, nullptr);  // an OrderedDict with a _metadata attribute (BUILD)
  EXPECT_EQ(f32(tensor_at(*state, "w")), (std::vector<float>{0.25f, 0.75f}));

  EXPECT_EQ(*d->find("int")->if_int(), 7);
  EXPECT_EQ(*d->find("neg")->if_int(), -3);
  EXPECT_EQ(*d->find("big")->if_int(), int64_t{1} << 40);
  EXPECT_EQ(*d->find("huge_neg")->if_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*d->find("float")->if_float(), 2.35);
  EXPECT_EQ(*d->find("str")->if_string(), "Qwen/Qwen3.5-0.8B-Base");
  EXPECT_EQ(*d->find("unicode")->if_string(), "caf\xc3\xa9 \xe2\x86\x92");
  EXPECT_TRUE(d->find("none")->is_none());
  EXPECT_EQ(*d->find("yes")->if_bool(), true);
  EXPECT_EQ(*d->find("no")->if_bool(), false);
  const std::vector<PickleValue>& list = *d->find("list")->if_list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(*list[1].if_string(), "a");
  const std::vector<PickleValue>& tuple = *d->find("tuple")->if_tuple();
  ASSERT_EQ(tuple.size(), 2u);
  EXPECT_EQ(*tuple[1].if_float(), 2.5);
  EXPECT_TRUE(d->find("empty_tuple")->if_tuple()->empty());
  const PickleValue* y = d->find("nested")->if_dict()->find("x")->if_dict()->find("y");
  ASSERT_TRUE(y && y->if_list());
  EXPECT_EQ(y->if_list()->size(), 2u);
  ASSERT_NE(d->find("dtype")->if_global(), nullptr);
  EXPECT_EQ(d->find("dtype")->if_global()->qualified(), "torch.bfloat16");
}

struct BadFile {
  const char* name;
  ErrorCode code;
  const char* message;
};

class TorchCheckpointRefuses : public ::testing::TestWithParam<BadFile> {};

TEST_P(TorchCheckpointRefuses, WithAClearError) {
  const BadFile& bad = GetParam();
  const std::string path = fixture(std::string("pickle/") + bad.name);
  ASSERT_FIXTURE(path);
  Result<PickleValue> r = read_torch_checkpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), bad.code) << r.status().to_string();
  EXPECT_CONTAINS(r.status().message(), bad.message);
  EXPECT_CONTAINS(r.status().message(), path);
}

INSTANTIATE_TEST_SUITE_P(
    HandMade, TorchCheckpointRefuses,
    ::testing::Values(
        BadFile{"complex_storage.pt", ErrorCode::InvalidArtifact,
                "storage '0' has type torch.ComplexFloatStorage, which is not a supported storage class"},
        BadFile{"storage_size_mismatch.pt", ErrorCode::InvalidArtifact,
                "entry 'storage_size_mismatch/data/0' has 12 bytes; the pickle says it holds 16"},
        BadFile{"missing_storage.pt", ErrorCode::InvalidArtifact, "has no entry 'missing_storage/data/0'"},
        BadFile{"compressed_storage.pt", ErrorCode::InvalidArtifact, "is compressed (method 8)"},
        BadFile{"big_endian.pt", ErrorCode::Unsupported, "storages are 'big'-endian"},
        BadFile{"storage_size_lie.pt", ErrorCode::InvalidArtifact, "cannot read the zip archive"},
        BadFile{"truncated_pickle.pt", ErrorCode::InvalidArtifact, "(truncated?)"},
        BadFile{"view_out_of_bounds.pt", ErrorCode::InvalidArtifact,
                "tensor of size [2, 2] at offset 1 reaches element 4 of storage '0', which has 4"},
        BadFile{"view_too_many_elements.pt", ErrorCode::InvalidArtifact,
                "tensor of size [4, 4] has more elements than its storage '0' (4 elements)"},
        BadFile{"legacy_magic.pt", ErrorCode::Unsupported,
                "the file uses the legacy torch serialization; re-save it with torch >= 1.6 (torch.save(obj, path))"},
        BadFile{"not_a_zip.pt", ErrorCode::InvalidArtifact, "is not a torch.save zip archive"}),
    [](const ::testing::TestParamInfo<BadFile>& info) {
      std::string name = info.param.name;
      return name.substr(0, name.find('.'));
    });

// Globals off the allow-list load as inert opaque objects; nothing is called.
TEST(TorchCheckpoint, UnknownGlobalsAreOpaque) {
  for (const auto& [name, type] : {std::pair<std::string, std::string>{"global_os_system.pt", "os.system"},
                                   {"global_builtins_eval.pt", "builtins.eval"}}) {
    const std::string path = fixture("pickle/" + name);
    ASSERT_FIXTURE(path);
    const PickleValue v = load(path);
    ASSERT_NE(v.if_opaque(), nullptr) << name;
    EXPECT_EQ(v.if_opaque()->type, type);
  }
}

TEST(TorchCheckpoint, TrainingExtrasLoadNextToTensors) {
  for (const char* name : {"extras_protocol2.pt", "extras_protocol4.pt"}) {
    SCOPED_TRACE(name);
    const std::string path = fixture(std::string("pickle/") + name);
    ASSERT_FIXTURE(path);
    const PickleValue root = load(path);
    const PickleDict* d = root.if_dict();
    ASSERT_NE(d, nullptr);
    // Protocol 2 spells bytes as _codecs.encode(str, "latin1") and sets as __builtin__.set([...]);
    // protocol 4 has SHORT_BINBYTES, EMPTY_SET/ADDITEMS and FROZENSET.
    const bool p2 = std::string(name) == "extras_protocol2.pt";
    const std::string builtins = p2 ? "__builtin__." : "builtins.";
    for (const auto& [key, type] : std::vector<std::pair<std::string, std::string>>{
             {"namespace", "argparse.Namespace"},
             {"path", "pathlib.PosixPath"},
             {"scalar", "numpy.core.multiarray.scalar"},
             {"when", "datetime.datetime"},
             {"set", builtins + "set"},
             {"frozenset", builtins + "frozenset"},
             {"bytes", p2 ? "_codecs.encode" : "builtins.bytes"}}) {
      ASSERT_NE(d->find(key), nullptr) << key;
      EXPECT_EQ(d->find(key)->type_name(), type) << key;
    }
    EXPECT_EQ(*d->find("after")->if_int(), 7);
    EXPECT_EQ(f32(tensor_at(*d, "w")), (std::vector<float>{1.0f, 2.0f}));
  }
}

TEST(TorchCheckpoint, MissingAndEmptyFiles) {
  Result<PickleValue> missing = read_torch_checkpoint(fixture("pickle/does_not_exist.pt"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::Io);

  testing::TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  testing::write_file(tmp.path("empty.pt"), "");
  Result<PickleValue> empty = read_torch_checkpoint(tmp.path("empty.pt"));
  ASSERT_FALSE(empty.ok());
  EXPECT_CONTAINS(empty.status().message(), "the file is empty");
}

TEST(TorchCheckpoint, EveryTruncatedArchiveFails) {
  const std::string path = fixture("pickle/values.pt");
  ASSERT_FIXTURE(path);
  const std::string bytes = testing::read_file(path);
  ASSERT_GT(bytes.size(), 100u);
  testing::TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  for (size_t n = 1; n < bytes.size(); n += 7) {
    testing::write_file(tmp.path("cut.pt"), std::string_view(bytes).substr(0, n));
    Result<PickleValue> r = read_torch_checkpoint(tmp.path("cut.pt"));
    EXPECT_FALSE(r.ok()) << "cut at " << n << " of " << bytes.size();
    EXPECT_EQ(r.status().code(), ErrorCode::InvalidArtifact) << r.status().to_string();
  }
}

TEST(TorchCheckpoint, CorruptStorageBytesFailTheCrcCheck) {
  const std::string path = fixture("pickle/values.pt");
  ASSERT_FIXTURE(path);
  std::string bytes = testing::read_file(path);
  // Storage "0" holds -1.0f first: 00 00 80 bf.
  const size_t at = bytes.find(std::string("\x00\x00\x80\xbf\x00\x00\x00\xbf", 8));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] = '\x3f';  // -1.0f -> 1.0f
  testing::TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  testing::write_file(tmp.path("flipped.pt"), bytes);
  Result<PickleValue> r = read_torch_checkpoint(tmp.path("flipped.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_CONTAINS(r.status().message(), "CRC");
}

// ---- archives written by torch.save ----

// Compares a decoded value with the JSON the fixture generator wrote from the Python object.
void expect_matches(const PickleValue& v, const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) {
    EXPECT_TRUE(v.is_none()) << where;
  } else if (j.is_boolean()) {
    ASSERT_TRUE(v.if_bool()) << where << " is a " << v.type_name();
    EXPECT_EQ(*v.if_bool(), j.get<bool>()) << where;
  } else if (j.is_number_integer()) {
    ASSERT_TRUE(v.if_int()) << where << " is a " << v.type_name();
    EXPECT_EQ(*v.if_int(), j.get<int64_t>()) << where;
  } else if (j.is_number_float()) {
    ASSERT_TRUE(v.if_float()) << where << " is a " << v.type_name();
    EXPECT_EQ(*v.if_float(), j.get<double>()) << where;
  } else if (j.is_string()) {
    ASSERT_TRUE(v.if_string()) << where << " is a " << v.type_name();
    EXPECT_EQ(*v.if_string(), j.get<std::string>()) << where;
  } else if (j.is_object()) {
    const PickleDict* d = v.if_dict();
    ASSERT_TRUE(d) << where << " is a " << v.type_name();
    EXPECT_EQ(d->size(), j.size()) << where;
    for (const auto& [key, value] : j.items()) {
      const PickleValue* child = d->find(key);
      ASSERT_TRUE(child) << where << " has no key " << key;
      expect_matches(*child, value, where + "." + key);
    }
  } else {
    FAIL() << where << ": unexpected JSON " << j.dump();
  }
}

void expect_tensor_matches(const TorchTensor& t, const nlohmann::json& j, const std::string& name) {
  EXPECT_EQ(t.shape, j.at("shape").get<std::vector<int64_t>>()) << name;
  EXPECT_EQ(torch_dtype_name(t.dtype), j.at("dtype").get<std::string>()) << name;
  const std::vector<float> values = f32(t);
  ASSERT_EQ(static_cast<int64_t>(values.size()), t.numel()) << name;
  ASSERT_FALSE(values.empty()) << name;
  const std::vector<double> first = j.at("first").get<std::vector<double>>();
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(static_cast<double>(values[i]), first[i]) << name << "[" << i << "]";
  EXPECT_EQ(static_cast<double>(values.back()), j.at("last").get<double>()) << name;
  double sum = 0, sum_abs = 0;
  for (float x : values) {
    sum += x;
    sum_abs += std::fabs(x);
  }
  // Only the order of the float64 additions differs from torch's.
  EXPECT_NEAR(sum, j.at("sum").get<double>(), 1e-12 * sum_abs) << name;
  EXPECT_NEAR(sum_abs, j.at("sum_abs").get<double>(), 1e-12 * sum_abs) << name;
}

void check_against_sidecar(const std::string& stem) {
  const std::string json_path = fixture("headpt/" + stem + ".json");
  const std::string pt_path = fixture("headpt/" + stem + ".pt");
  ASSERT_FIXTURE(json_path);
  ASSERT_FIXTURE(pt_path);
  std::ifstream in(json_path);
  const nlohmann::json desc = nlohmann::json::parse(in);
  Result<PickleValue> r = read_torch_checkpoint(pt_path);
  if (desc.at("expect_refuse").get<bool>()) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::Unsupported);
    EXPECT_CONTAINS(r.status().message(), "legacy torch serialization; re-save it with torch >= 1.6");
    return;
  }
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const PickleDict* root = r->if_dict();
  ASSERT_NE(root, nullptr);
  const nlohmann::json& scalars = desc.at("scalars");
  EXPECT_EQ(root->size(), scalars.size() + 1) << "keys besides 'head'";
  for (const auto& [key, value] : scalars.items()) {
    const PickleValue* v = root->find(key);
    ASSERT_TRUE(v) << stem << " has no key " << key;
    expect_matches(*v, value, key);
  }
  const PickleValue* head = root->find("head");
  ASSERT_TRUE(head && head->if_dict());
  const nlohmann::json& tensors = desc.at("tensors");
  EXPECT_EQ(head->if_dict()->size(), tensors.size());
  for (const auto& [name, t] : tensors.items()) expect_tensor_matches(tensor_at(*head->if_dict(), name), t, name);
}

TEST(TorchCheckpointTorchFiles, Fp32) { check_against_sidecar("head_fp32"); }
TEST(TorchCheckpointTorchFiles, Bf16) { check_against_sidecar("head_bf16"); }
TEST(TorchCheckpointTorchFiles, Minimal) { check_against_sidecar("head_minimal"); }
TEST(TorchCheckpointTorchFiles, LegacyIsRefusedWithAHint) { check_against_sidecar("head_legacy"); }

}  // namespace
}  // namespace kev
