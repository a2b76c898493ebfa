// SHA-256 against the FIPS 180-2 vectors, streamed files across the 1 MiB read chunk, and errors.
#include "io/sha256.h"

#include <gtest/gtest.h>

#include <string>

#include "io/temp_dir.h"

namespace kev {
namespace {

using testing::TempDir;
using testing::write_file;

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(as_bytes("abc")).value(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(as_bytes("")).value(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(as_bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")).value(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, FileMatchesKnownVectorAndInMemoryDigest) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  write_file(tmp.path("abc.txt"), "abc");
  Result<std::string> abc = sha256_file_hex(tmp.path("abc.txt"));
  ASSERT_TRUE(abc.ok()) << abc.status().to_string();
  EXPECT_EQ(abc.value(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  write_file(tmp.path("empty"), "");
  EXPECT_EQ(sha256_file_hex(tmp.path("empty")).value(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

  // One million 'a' (FIPS 180-2 vector), then a file spanning several read chunks.
  write_file(tmp.path("million"), std::string(1000000, 'a'));
  EXPECT_EQ(sha256_file_hex(tmp.path("million")).value(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  std::string big((size_t{3} << 20) + 7, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_file(tmp.path("big"), big);
  EXPECT_EQ(sha256_file_hex(tmp.path("big")).value(), sha256_hex(as_bytes(big)).value());
}

TEST(Sha256, MissingFileIsIoError) {
  TempDir tmp;
  Result<std::string> r = sha256_file_hex(tmp.path("head.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::Io);
  EXPECT_NE(r.status().message().find("head.pt"), std::string::npos);
}

TEST(Sha256, DirectoryIsIoError) {
  TempDir tmp;
  Result<std::string> r = sha256_file_hex(tmp.dir());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::Io) << r.status().to_string();
}

}  // namespace
}  // namespace kev
