#include "io/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/check.h"

namespace kev {
namespace {

struct EvpCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using EvpCtx = std::unique_ptr<EVP_MD_CTX, EvpCtxDeleter>;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

Result<EvpCtx> new_sha256_ctx() {
  EvpCtx ctx(EVP_MD_CTX_new());
  KEV_CHECK(ctx != nullptr, ErrorCode::Internal, "EVP_MD_CTX_new failed");
  KEV_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, ErrorCode::Internal,
            "EVP_DigestInit_ex(sha256) failed");
  return ctx;
}

Result<std::string> finish_hex(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KEV_CHECK(EVP_DigestFinal_ex(ctx, digest, &len) == 1, ErrorCode::Internal, "EVP_DigestFinal_ex failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace

Result<std::string> sha256_hex(std::span<const uint8_t> bytes) {
  KEV_ASSIGN_OR_RETURN(EvpCtx ctx, new_sha256_ctx());
  KEV_CHECK(EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) == 1, ErrorCode::Internal,
            "EVP_DigestUpdate failed");
  return finish_hex(ctx.get());
}

Result<std::string> sha256_file_hex(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("cannot open '", path, "': ", std::strerror(err)));
  }
  KEV_ASSIGN_OR_RETURN(EvpCtx ctx, new_sha256_ctx());
  std::vector<unsigned char> chunk(size_t{1} << 20);
  for (;;) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), file.get());
    if (n > 0) {
      KEV_CHECK(EVP_DigestUpdate(ctx.get(), chunk.data(), n) == 1, ErrorCode::Internal,
                "EVP_DigestUpdate failed");
    }
    if (n < chunk.size()) {
      if (std::ferror(file.get())) {
        const int err = errno;
        return Status(ErrorCode::Io, cat("error reading '", path, "': ", std::strerror(err)));
      }
      break;
    }
  }
  return finish_hex(ctx.get());
}

}  // namespace kev
