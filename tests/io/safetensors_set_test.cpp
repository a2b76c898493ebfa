// SafetensorsSet: single file, sharded index, directory scan, and the errors for inconsistent shards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io/temp_dir.h"

namespace kev {
namespace {

using testing::TempDir;
using testing::write_file;

bool mentions(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

// Writes a file holding one F32 scalar per name, the value being the name's length.
void write_shard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (const std::string& n : names) {
    ASSERT_TRUE(w.add_f32(n, HostTensor({1}, {static_cast<float>(n.size())}), StDtype::F32).ok());
  }
  ASSERT_TRUE(w.write(path).ok());
}

const char* kIndex = R"({"metadata": {"total_size": 12}, "weight_map": {
  "model.a": "model-00001-of-00002.safetensors",
  "model.bb": "model-00001-of-00002.safetensors",
  "model.ccc": "model-00002-of-00002.safetensors"}})";

TEST(SafetensorsSet, SingleModelFile) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  write_shard(tmp.path("model.safetensors"), {"x", "yy"});
  write_shard(tmp.path("ignored.safetensors"), {"x"});  // model.safetensors wins over a scan
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->size(), 2u);
  EXPECT_EQ(set->files().size(), 1u);
  EXPECT_EQ(set->names(), (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(set->read_f32("yy")->data, std::vector<float>{2.0f});
  EXPECT_FALSE(set->find("zz").has_value());
  Result<HostTensor> missing = set->read_f32("zz");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(mentions(missing.status(), "'zz'"));
}

TEST(SafetensorsSet, ShardedIndex) {
  TempDir tmp;
  write_shard(tmp.path("model-00001-of-00002.safetensors"), {"model.a", "model.bb"});
  write_shard(tmp.path("model-00002-of-00002.safetensors"), {"model.ccc"});
  write_file(tmp.path("model.safetensors.index.json"), kIndex);
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->files().size(), 2u);
  EXPECT_EQ(set->names(), (std::vector<std::string>{"model.a", "model.bb", "model.ccc"}));
  std::optional<SafeTensorRef> ref = set->find("model.ccc");
  ASSERT_TRUE(ref.has_value());
  EXPECT_TRUE(ref->file->path().ends_with("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ref->info->name, "model.ccc");
  EXPECT_EQ(ref->file->read_f32(*ref->info)->data, std::vector<float>{9.0f});
  EXPECT_EQ(set->read_f32("model.a")->data, std::vector<float>{7.0f});

  // The set and the references into it stay valid when the set is moved.
  SafetensorsSet moved = std::move(set).value();
  EXPECT_EQ(moved.read_f32("model.bb")->data, std::vector<float>{8.0f});
}

TEST(SafetensorsSet, IndexNamesMissingShard) {
  TempDir tmp;
  write_shard(tmp.path("model-00001-of-00002.safetensors"), {"model.a", "model.bb"});
  write_file(tmp.path("model.safetensors.index.json"), kIndex);
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(set.status(), "shard 'model-00002-of-00002.safetensors', which does not exist"))
      << set.status().message();
}

TEST(SafetensorsSet, IndexMapsNameToShardWithoutIt) {
  TempDir tmp;
  write_shard(tmp.path("model-00001-of-00002.safetensors"), {"model.a"});
  write_shard(tmp.path("model-00002-of-00002.safetensors"), {"model.ccc", "model.bb"});
  write_file(tmp.path("model.safetensors.index.json"), kIndex);
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(set.status(), "maps 'model.bb' to shard 'model-00001-of-00002.safetensors', which has no such tensor"))
      << set.status().message();
}

TEST(SafetensorsSet, DuplicateNamesAcrossShards) {
  TempDir tmp;
  write_shard(tmp.path("model-00001-of-00002.safetensors"), {"model.a", "model.bb"});
  write_shard(tmp.path("model-00002-of-00002.safetensors"), {"model.ccc", "model.a"});
  write_file(tmp.path("model.safetensors.index.json"), kIndex);
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_FALSE(set.ok());
  EXPECT_TRUE(mentions(set.status(), "tensor 'model.a' appears in both")) << set.status().message();

  // The same without an index (directory scan).
  std::filesystem::remove(tmp.path("model.safetensors.index.json"));
  Result<SafetensorsSet> scanned = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_FALSE(scanned.ok());
  EXPECT_TRUE(mentions(scanned.status(), "model-00001-of-00002.safetensors")) << scanned.status().message();
  EXPECT_TRUE(mentions(scanned.status(), "model-00002-of-00002.safetensors")) << scanned.status().message();
}

TEST(SafetensorsSet, BadIndexFiles) {
  TempDir tmp;
  write_shard(tmp.path("model-00001-of-00002.safetensors"), {"model.a"});
  const std::string index = tmp.path("model.safetensors.index.json");
  auto open_error = [&](const std::string& text) {
    write_file(index, text);
    Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
    EXPECT_FALSE(set.ok()) << text;
    return set.ok() ? Status() : set.status();
  };
  Status malformed = open_error("{\"weight_map\": {");
  EXPECT_EQ(malformed.code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(malformed, "model.safetensors.index.json")) << malformed.message();
  EXPECT_TRUE(mentions(open_error("{}"), "no 'weight_map' object"));
  EXPECT_TRUE(mentions(open_error("[]"), "no 'weight_map' object"));
  EXPECT_TRUE(mentions(open_error(R"({"weight_map": {"model.a": 3}})"), "expected a file name"));
  EXPECT_TRUE(mentions(open_error(R"({"weight_map": {"model.a": "../model-00001-of-00002.safetensors"}})"),
                       "not a plain file name"));
  EXPECT_TRUE(mentions(open_error(R"({"weight_map": {"model.a": ""}})"), "not a plain file name"));
  // A shard that exists but is corrupt reports the shard's own error.
  write_file(tmp.path("model-00002-of-00002.safetensors"), "garbage!!");
  Status corrupt = open_error(kIndex);
  EXPECT_TRUE(mentions(corrupt, "model-00002-of-00002.safetensors")) << corrupt.message();
}

TEST(SafetensorsSet, DirectoryScanAndErrors) {
  TempDir tmp;
  Result<SafetensorsSet> none = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(none.status(), "contains no .safetensors file"));

  Result<SafetensorsSet> not_dir = SafetensorsSet::open_dir(tmp.path("nowhere"));
  ASSERT_FALSE(not_dir.ok());
  EXPECT_EQ(not_dir.status().code(), ErrorCode::Io);

  write_shard(tmp.path("b.safetensors"), {"two"});
  write_shard(tmp.path("a.safetensors"), {"one"});
  write_file(tmp.path("notes.txt"), "not a tensor file");
  Result<SafetensorsSet> set = SafetensorsSet::open_dir(tmp.dir());
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ASSERT_EQ(set->files().size(), 2u);
  EXPECT_TRUE(set->files()[0].path().ends_with("a.safetensors"));  // sorted
  EXPECT_EQ(set->names(), (std::vector<std::string>{"one", "two"}));
}

TEST(SafetensorsSet, OpenFiles) {
  TempDir tmp;
  write_shard(tmp.path("adapter_model.safetensors"), {"lora_A", "lora_B"});
  write_shard(tmp.path("head.safetensors"), {"q"});
  Result<SafetensorsSet> set =
      SafetensorsSet::open_files({tmp.path("adapter_model.safetensors"), tmp.path("head.safetensors")});
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->size(), 3u);
  Result<SafetensorsSet> missing = SafetensorsSet::open_files({tmp.path("nope.safetensors")});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::Io);
}

}  // namespace
}  // namespace kev
