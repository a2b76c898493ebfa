// safetensors (https://github.com/huggingface/safetensors) reading and writing.
//
//   KEV_ASSIGN_OR_RETURN(kev::SafetensorsFile f, kev::SafetensorsFile::open("adapter_model.safetensors"));
//   for (const kev::SafeTensorInfo& t : f.tensors()) use(t.name, t.dtype, t.shape, f.bytes(t));
//   KEV_ASSIGN_OR_RETURN(kev::HostTensor w, f.read_f32("base_model.model.layers.0.mlp.up_proj.lora_A.weight"));
//
//   KEV_ASSIGN_OR_RETURN(kev::SafetensorsSet base, kev::SafetensorsSet::open_dir("Qwen3.5-0.8B-Base"));
//   if (auto ref = base.find("model.language_model.norm.weight")) use(ref->file->bytes(*ref->info));
//
//   kev::SafetensorsWriter w;
//   KEV_TRY(w.add_f32("norm.weight", std::move(norm), kev::StDtype::BF16));   // converted while writing
//   w.set_metadata("format", "pt");
//   KEV_TRY(w.write("weights.safetensors", [](uint64_t done, uint64_t total) { ... }));
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section) plus an optional "__metadata__" map of strings.
//
// Reader contracts: open() maps the file and validates everything before returning: the header length
// lies within the file (and under 100 MB, the reference implementation's limit), the header is a JSON
// object, every dtype is known, shapes are non-negative and their element counts do not overflow,
// every [begin, end) lies in the data section with end - begin == numel * element size, and the tensors
// tile the data section exactly (sorted by offset: no gap, no overlap, no trailing bytes). Any failure is
// InvalidArtifact (Unsupported for a dtype name this reader does not know) naming the file, the tensor
// and the offending values. After a successful open, bytes() and read_f32() cannot read out of bounds.
// Spans from bytes() point into the mapping and live as long as the SafetensorsFile (moves keep them).
// Tensor data need not be aligned in the file; read_f32() copies without assuming alignment.
//
// Writer contracts: tensors are written in insertion order with contiguous data offsets, the header is
// padded with spaces to a multiple of 8 bytes (as the reference writer does), and data is streamed
// tensor by tensor — no buffer the size of the file is ever built. The file is written to a temporary
// name next to `path` and renamed into place only when complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/host_tensor.h"
#include "io/mapped_file.h"
#include "kev/result.h"

namespace kev {

// The dtypes of the safetensors format this reader understands. Only the float types can be widened
// by read_f32(); the rest can still be listed and read as raw bytes.
enum class StDtype { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

const char* st_dtype_name(StDtype dtype);                    // "F32", "BF16", ...
std::optional<StDtype> st_dtype_from_name(std::string_view name);
size_t st_dtype_size(StDtype dtype);                         // bytes per element

struct SafeTensorInfo {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the file (not of the data section)
  uint64_t size = 0;    // bytes: numel() * st_dtype_size(dtype)

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data-offset order, i.e. the order of their bytes in the file.
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const SafeTensorInfo* find(std::string_view name) const;

  // `info` must come from this file's tensors() or find().
  std::span<const uint8_t> bytes(const SafeTensorInfo& info) const;
  // F32 copied; BF16, F16 widened exactly; F64 rounded to nearest. Other dtypes: Unsupported.
  Result<HostTensor> read_f32(std::string_view name) const;
  Result<HostTensor> read_f32(const SafeTensorInfo& info) const;

 private:
  explicit SafetensorsFile(MappedFile file) : file_(std::move(file)) {}
  Status parse_header();

  MappedFile file_;
  std::map<std::string, std::string> metadata_;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
};

// A tensor located in one file of a SafetensorsSet; pointers live as long as the set.
struct SafeTensorRef {
  const SafetensorsFile* file = nullptr;
  const SafeTensorInfo* info = nullptr;
};

// Several safetensors files seen as one name space (a sharded HF checkpoint).
class SafetensorsSet {
 public:
  // Opens, in order of preference: `dir`/model.safetensors.index.json (its weight_map names the
  // shards); `dir`/model.safetensors; every *.safetensors file in `dir`. Errors (InvalidArtifact) for
  // a shard the index names that does not exist, a weight_map entry whose shard lacks that tensor, a
  // tensor name present in two files, and a directory with no safetensors file; Io when `dir` is not
  // a readable directory.
  static Result<SafetensorsSet> open_dir(const std::string& dir);
  // The given files, which must not share tensor names.
  static Result<SafetensorsSet> open_files(const std::vector<std::string>& paths);

  std::optional<SafeTensorRef> find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return index_.size(); }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  Result<HostTensor> read_f32(std::string_view name) const;

 private:
  Status add_file(SafetensorsFile file);

  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> index_;  // name -> (file, tensor)
};

// Where a tensor producer writes its bytes during SafetensorsWriter::write().
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status write(std::span<const uint8_t> bytes) = 0;
};

// Writes exactly the tensor's declared byte size to the sink, in as many pieces as it likes.
using TensorProducer = std::function<Status(ByteSink& sink)>;

class SafetensorsWriter {
 public:
  // Each add*() checks the name (non-empty, not "__metadata__", not already added) and that the shape
  // is non-negative without overflow; errors are InvalidRequest.
  Status add(std::string name, StDtype dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  // `bytes` is not copied: the caller keeps it alive and unchanged until write() returns.
  Status add_view(std::string name, StDtype dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes);
  Status add_producer(std::string name, StDtype dtype, std::vector<int64_t> shape, TensorProducer producer);
  // Stores `tensor` as `dtype` (F32, BF16 or F16), converted in small chunks during write().
  Status add_f32(std::string name, HostTensor tensor, StDtype dtype);
  void set_metadata(std::string key, std::string value);

  // `progress(done, total)` is called with data-section bytes written so far, after each piece.
  Status write(const std::string& path, const std::function<void(uint64_t done, uint64_t total)>& progress = {}) const;

 private:
  struct Entry {
    std::string name;
    StDtype dtype;
    std::vector<int64_t> shape;
    uint64_t size;
    TensorProducer producer;
  };
  Status check_new(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape, uint64_t* size) const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kev
