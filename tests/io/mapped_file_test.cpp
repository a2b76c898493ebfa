// MappedFile: contents, moves, and the Io errors for missing, empty, directory and unreadable paths.
#include "io/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "io/temp_dir.h"

namespace kev {
namespace {

using testing::TempDir;
using testing::write_file;

TEST(MappedFile, MapsContentsAndSurvivesMoves) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  write_file(tmp.path("a.bin"), std::string("hello\0world", 11));
  Result<MappedFile> f = MappedFile::open(tmp.path("a.bin"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->size(), 11u);
  const uint8_t* data = f->bytes().data();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data), 11), std::string("hello\0world", 11));
  MappedFile moved = std::move(f).value();
  EXPECT_EQ(moved.bytes().data(), data);  // moving keeps the mapping
  EXPECT_EQ(moved.path(), tmp.path("a.bin"));
  MappedFile other = std::move(moved);
  EXPECT_EQ(other.size(), 11u);
  EXPECT_EQ(other.bytes()[6], 'w');
}

TEST(MappedFile, MissingFileIsIoError) {
  TempDir tmp;
  Result<MappedFile> f = MappedFile::open(tmp.path("nope.bin"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::Io);
  EXPECT_NE(f.status().message().find("nope.bin"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("No such file"), std::string::npos) << f.status().message();
}

TEST(MappedFile, EmptyFileIsIoError) {
  TempDir tmp;
  write_file(tmp.path("empty.bin"), "");
  Result<MappedFile> f = MappedFile::open(tmp.path("empty.bin"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::Io);
  EXPECT_NE(f.status().message().find("empty"), std::string::npos) << f.status().message();
}

TEST(MappedFile, DirectoryIsIoError) {
  TempDir tmp;
  Result<MappedFile> f = MappedFile::open(tmp.dir());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::Io);
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().message();
}

TEST(MappedFile, UnreadableFileIsIoError) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: file permissions are not enforced";
  TempDir tmp;
  write_file(tmp.path("secret.bin"), "x");
  ASSERT_EQ(::chmod(tmp.path("secret.bin").c_str(), 0), 0);
  Result<MappedFile> f = MappedFile::open(tmp.path("secret.bin"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::Io);
  EXPECT_NE(f.status().message().find("Permission denied"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace kev
