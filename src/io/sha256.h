// SHA-256 digests (OpenSSL's libcrypto EVP interface), as lower-case hex strings. Used for checkpoint
// ids ("sha256:" + sha256_file_hex("head.pt")) and for recording the source of an export.
//
//   KEV_ASSIGN_OR_RETURN(std::string hex, kev::sha256_file_hex("head.pt"));   // 64 hex digits
//
// Contracts: files are streamed in fixed-size chunks (memory use does not grow with file size); an
// empty file hashes fine. Errors: ErrorCode::Io for unreadable files, Internal if libcrypto fails.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kev/result.h"

namespace kev {

Result<std::string> sha256_file_hex(const std::string& path);
Result<std::string> sha256_hex(std::span<const uint8_t> bytes);

}  // namespace kev
