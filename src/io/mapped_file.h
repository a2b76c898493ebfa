// MappedFile: a whole file memory-mapped read-only, for zero-copy access to weight files.
//
//   KEV_ASSIGN_OR_RETURN(kev::MappedFile f, kev::MappedFile::open("model.safetensors"));
//   std::span<const uint8_t> all = f.bytes();   // valid while `f` (or what it was moved into) lives
//
// Contracts: open() fails with ErrorCode::Io naming the path for a missing or unreadable file, a
// directory or other non-regular file, and an empty file (nothing to map). The object is move-only;
// moving keeps the mapping (and spans into it) valid. The mapping is private and read-only; if another
// process truncates the file while it is mapped, reads past the new end fault (SIGBUS) — a limitation
// of mmap that callers accept for weight files they own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "kev/result.h"

namespace kev {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kev
