// json_util: parse errors with positions, file errors, and typed getters naming the field.
#include "io/json_util.h"

#include <gtest/gtest.h>

#include <string>

#include "io/temp_dir.h"

namespace kev {
namespace {

using testing::TempDir;
using testing::write_file;

bool mentions(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

TEST(JsonUtil, ParsesAndReportsErrorOffset) {
  Result<nlohmann::json> ok = parse_json(R"({"a": [1, 2]})", "test");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value()["a"][1], 2);

  Result<nlohmann::json> bad = parse_json(R"({"a": [1, 2})", "my.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(bad.status(), "my.json")) << bad.status().message();
  EXPECT_TRUE(mentions(bad.status(), "at byte 12")) << bad.status().message();

  EXPECT_FALSE(parse_json("", "empty").ok());
  EXPECT_FALSE(parse_json("{} trailing", "trailing").ok());
  EXPECT_FALSE(parse_json("\"\xff\xfe\"", "bad utf8").ok());
}

TEST(JsonUtil, DeepNestingParsesWithoutExhaustingTheStack) {
  // nlohmann's parser and destructor are iterative; a recursive one would overflow here.
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  Result<nlohmann::json> r = parse_json(deep, "deep");
  EXPECT_TRUE(r.ok());
}

TEST(JsonUtil, FileErrors) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  Result<nlohmann::json> missing = read_json_file(tmp.path("config.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::Io);
  EXPECT_TRUE(mentions(missing.status(), "config.json"));

  Result<nlohmann::json> dir = read_json_file(tmp.dir());
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), ErrorCode::Io);

  write_file(tmp.path("bad.json"), "{\"x\": }");
  Result<nlohmann::json> bad = read_json_file(tmp.path("bad.json"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(mentions(bad.status(), "bad.json"));

  write_file(tmp.path("good.json"), "{\"x\": 1}");
  EXPECT_EQ(read_json_file(tmp.path("good.json")).value()["x"], 1);
  EXPECT_EQ(read_text_file(tmp.path("good.json")).value(), "{\"x\": 1}");
}

TEST(JsonUtil, TypedGetters) {
  const nlohmann::json obj = nlohmann::json::parse(
      R"({"i": 7, "neg": -3, "f": 1.5, "big": 18446744073709551615, "b": true, "s": "hi", "n": null})");
  EXPECT_EQ(json_int(obj, "i", "ctx").value(), 7);
  EXPECT_EQ(json_int(obj, "neg", "ctx").value(), -3);
  EXPECT_EQ(json_number(obj, "i", "ctx").value(), 7.0);
  EXPECT_EQ(json_number(obj, "f", "ctx").value(), 1.5);
  EXPECT_EQ(json_bool(obj, "b", "ctx").value(), true);
  EXPECT_EQ(json_string(obj, "s", "ctx").value(), "hi");
  EXPECT_TRUE(json_has(obj, "n"));
  EXPECT_FALSE(json_has(obj, "zz"));
  EXPECT_FALSE(json_has(nlohmann::json::array(), "i"));

  Status missing = json_int(obj, "zz", "config.json").status();
  EXPECT_EQ(missing.code(), ErrorCode::InvalidArtifact);
  EXPECT_EQ(missing.message(), "config.json: missing field 'zz'");
  Status not_int = json_int(obj, "f", "cfg").status();
  EXPECT_TRUE(mentions(not_int, "'f' must be an integer, got 1.5")) << not_int.message();
  EXPECT_FALSE(json_int(obj, "big", "cfg").ok());
  EXPECT_FALSE(json_int(obj, "s", "cfg").ok());
  EXPECT_FALSE(json_number(obj, "s", "cfg").ok());
  EXPECT_FALSE(json_bool(obj, "i", "cfg").ok());
  Status not_string = json_string(obj, "i", "cfg").status();
  EXPECT_TRUE(mentions(not_string, "'i' must be a string, got 7")) << not_string.message();
  EXPECT_FALSE(json_int(nlohmann::json(5), "i", "cfg").ok());
}

TEST(JsonUtil, ExcerptIsShort) {
  const nlohmann::json long_array(std::vector<int>(1000, 1));
  const std::string e = json_excerpt(long_array);
  EXPECT_LE(e.size(), 63u);
  EXPECT_TRUE(e.ends_with("..."));
}

}  // namespace
}  // namespace kev
