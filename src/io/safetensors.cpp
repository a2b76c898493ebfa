#include "io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/bf16.h"
#include "common/check.h"
#include "common/parallel.h"
#include "io/json_util.h"

namespace kev {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";
constexpr int64_t kWidenGrain = 1 << 20;  // elements per thread when widening BF16/F16 tensors

struct DtypeRow {
  StDtype dtype;
  const char* name;
  size_t size;
};
constexpr std::array<DtypeRow, 15> kDtypes = {{
    {StDtype::BOOL, "BOOL", 1},   {StDtype::U8, "U8", 1},     {StDtype::I8, "I8", 1},
    {StDtype::F8_E5M2, "F8_E5M2", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::I16, "I16", 2},
    {StDtype::U16, "U16", 2},     {StDtype::F16, "F16", 2},   {StDtype::BF16, "BF16", 2},
    {StDtype::I32, "I32", 4},     {StDtype::U32, "U32", 4},   {StDtype::F32, "F32", 4},
    {StDtype::F64, "F64", 8},     {StDtype::I64, "I64", 8},   {StDtype::U64, "U64", 8},
}};

const DtypeRow& dtype_row(StDtype dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.dtype == dtype) return row;
  }
  return kDtypes[0];  // unreachable: every enumerator has a row
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element count of `shape`, or nullopt when a dimension is negative or the product of the non-zero
// dimensions exceeds 2^63 - 1 (so that every later size and stride computation fits in int64).
std::optional<uint64_t> checked_numel(const std::vector<int64_t>& shape) {
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero_product, static_cast<uint64_t>(d), &nonzero_product)) return std::nullopt;
    if (nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  }
  return has_zero ? 0 : nonzero_product;
}

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status invalid(const std::string& path, const std::string& what) {
  return Status(ErrorCode::InvalidArtifact, cat("safetensors file '", path, "': ", what));
}

}  // namespace

const char* st_dtype_name(StDtype dtype) { return dtype_row(dtype).name; }
size_t st_dtype_size(StDtype dtype) { return dtype_row(dtype).size; }

std::optional<StDtype> st_dtype_from_name(std::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (name == row.name) return row.dtype;
  }
  return std::nullopt;
}

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ------------------------------------------------------------------------------

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size == 0) return invalid(path, "the file is empty (0 bytes); expected at least an 8-byte header length");
  KEV_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  SafetensorsFile file(std::move(mapped));
  KEV_TRY(file.parse_header());
  return file;
}

Status SafetensorsFile::parse_header() {
  const std::string& path = file_.path();
  const std::span<const uint8_t> all = file_.bytes();
  if (all.size() < 8) {
    return invalid(path, cat("the file has ", all.size(), " bytes, too few for the 8-byte header length"));
  }
  const uint64_t header_len = read_le_u64(all.data());
  const uint64_t after_prefix = all.size() - 8;
  if (header_len > after_prefix) {
    return invalid(path, cat("header length ", header_len, " runs past the end of the file (", after_prefix,
                             " bytes follow the length prefix)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return invalid(path, cat("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  const std::string_view text(reinterpret_cast<const char*>(all.data() + 8), header_len);
  Result<nlohmann::json> parsed = parse_json(text, cat("safetensors header of '", path, "'"));
  if (!parsed) return parsed.status();
  const nlohmann::json& header = parsed.value();
  if (!header.is_object()) return invalid(path, cat("the header is not a JSON object: ", json_excerpt(header)));

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = all.size() - data_start;
  struct Span {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) return invalid(path, cat("__metadata__ is not an object: ", json_excerpt(entry)));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return invalid(path, cat("__metadata__ value for '", key, "' is not a string: ", json_excerpt(value)));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = cat("tensor '", name, "'");
    if (!entry.is_object()) return invalid(path, cat(where, " is not an object: ", json_excerpt(entry)));

    Result<std::string> dtype_name = json_string(entry, "dtype", where);
    if (!dtype_name) return invalid(path, dtype_name.status().message());
    const std::optional<StDtype> dtype = st_dtype_from_name(dtype_name.value());
    if (!dtype) {
      return Status(ErrorCode::Unsupported, cat("safetensors file '", path, "': ", where, " has dtype '",
                                                dtype_name.value(), "', which this reader does not support"));
    }

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return invalid(path, cat(where, ": 'shape' must be an array of non-negative integers"));
    }
    std::vector<int64_t> shape;
    for (const nlohmann::json& d : *shape_it) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid(path, cat(where, " has an invalid dimension ", json_excerpt(d), " in shape ",
                                 json_excerpt(*shape_it), " (dimensions are integers in [0, 2^63))"));
      }
      shape.push_back(d.get<int64_t>());
    }
    const std::optional<uint64_t> numel = checked_numel(shape);
    uint64_t nbytes = 0;
    if (!numel || __builtin_mul_overflow(*numel, st_dtype_size(*dtype), &nbytes)) {
      return invalid(path, cat(where, " has shape ", shape_string(shape), ", whose size overflows 64 bits"));
    }

    auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return invalid(path, cat(where, ": 'data_offsets' must be [begin, end] with non-negative integers, got ",
                               offsets_it == entry.end() ? std::string("nothing") : json_excerpt(*offsets_it)));
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end) return invalid(path, cat(where, " has data_offsets [", begin, ", ", end, "] with begin > end"));
    if (end > data_size) {
      return invalid(path, cat(where, " has data_offsets [", begin, ", ", end, "] past the end of the data section (",
                               data_size, " bytes)"));
    }
    if (end - begin != nbytes) {
      return invalid(path, cat(where, " has ", end - begin, " bytes in data_offsets [", begin, ", ", end,
                               "], but ", st_dtype_name(*dtype), " shape ", shape_string(shape), " needs ", nbytes));
    }
    spans.push_back({begin, end, tensors_.size()});
    tensors_.push_back(SafeTensorInfo{name, *dtype, std::move(shape), data_start + begin, nbytes});
  }

  // The tensors must tile the data section: the reference implementation rejects gaps, overlaps and
  // trailing bytes, and so do we (a gap or overlap usually means a corrupt or hand-edited header).
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Span* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin < covered) {
      return invalid(path, cat("tensor '", tensors_[s.tensor].name, "' [", s.begin, ", ", s.end, ") overlaps tensor '",
                               tensors_[previous->tensor].name, "' [", previous->begin, ", ", previous->end, ")"));
    }
    if (s.begin > covered) {
      return invalid(path, cat("data bytes [", covered, ", ", s.begin, ") belong to no tensor (before tensor '",
                               tensors_[s.tensor].name, "')"));
    }
    covered = s.end;
    previous = &s;
  }
  if (covered != data_size) {
    return invalid(path, cat("the data section has ", data_size, " bytes but the tensors cover only ", covered,
                             " (", data_size - covered, " trailing bytes)"));
  }

  std::vector<SafeTensorInfo> ordered;
  ordered.reserve(tensors_.size());
  for (const Span& s : spans) ordered.push_back(std::move(tensors_[s.tensor]));
  tensors_ = std::move(ordered);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return Status::success();
}

const SafeTensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const SafeTensorInfo& info) const {
  return file_.bytes().subspan(info.offset, info.size);
}

Result<HostTensor> SafetensorsFile::read_f32(std::string_view name) const {
  const SafeTensorInfo* info = find(name);
  KEV_CHECK(info != nullptr, ErrorCode::InvalidArtifact, "safetensors file '", path(), "' has no tensor '", name, "'");
  return read_f32(*info);
}

Result<HostTensor> SafetensorsFile::read_f32(const SafeTensorInfo& info) const {
  const std::span<const uint8_t> src = bytes(info);
  const size_t n = static_cast<size_t>(info.numel());
  HostTensor out(info.shape, std::vector<float>(n));
  float* dst = out.data.data();
  switch (info.dtype) {
    case StDtype::F32:
      if (n > 0) std::memcpy(dst, src.data(), n * sizeof(float));
      break;
    case StDtype::BF16:
    case StDtype::F16: {
      const bool bf16 = info.dtype == StDtype::BF16;
      parallel_chunks(static_cast<int64_t>(n), kWidenGrain, [&](int64_t begin, int64_t end) {
        for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
          uint16_t h;
          std::memcpy(&h, src.data() + 2 * i, 2);  // the file gives no alignment guarantee
          dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
      });
      break;
    }
    case StDtype::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src.data() + 8 * i, 8);
        dst[i] = static_cast<float>(d);
      }
      break;
    default:
      return Status(ErrorCode::Unsupported, cat("tensor '", info.name, "' in '", path(), "' has dtype ",
                                                st_dtype_name(info.dtype), "; only F32, BF16, F16 and F64 read as float"));
  }
  return out;
}

// ---- SafetensorsSet -------------------------------------------------------------------------------

Status SafetensorsSet::add_file(SafetensorsFile file) {
  const size_t file_index = files_.size();
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const std::string& name = file.tensors()[i].name;
    auto [it, inserted] = index_.emplace(name, std::make_pair(file_index, i));
    if (!inserted) {
      return Status(ErrorCode::InvalidArtifact, cat("tensor '", name, "' appears in both '",
                                                    files_[it->second.first].path(), "' and '", file.path(), "'"));
    }
  }
  files_.push_back(std::move(file));
  return Status::success();
}

Result<SafetensorsSet> SafetensorsSet::open_files(const std::vector<std::string>& paths) {
  SafetensorsSet set;
  for (const std::string& p : paths) {
    KEV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(p));
    KEV_TRY(set.add_file(std::move(file)));
  }
  return set;
}

Result<SafetensorsSet> SafetensorsSet::open_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status(ErrorCode::Io, cat("'", dir, "' is not a directory", ec ? ": " + ec.message() : std::string()));
  }
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    KEV_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file(index_path.string()));
    const std::string where = cat("'", index_path.string(), "'");
    auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      return Status(ErrorCode::InvalidArtifact, cat(where, " has no 'weight_map' object"));
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return Status(ErrorCode::InvalidArtifact,
                      cat(where, " maps '", name, "' to ", json_excerpt(shard), ", expected a file name"));
      }
      const std::string file = shard.get<std::string>();
      // Shards are plain file names next to the index; anything else could read outside `dir`.
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
        return Status(ErrorCode::InvalidArtifact,
                      cat(where, " maps '", name, "' to '", file, "', which is not a plain file name"));
      }
      shards.insert(file);
    }
    std::vector<std::string> paths;
    for (const std::string& shard : shards) {
      const fs::path p = root / shard;
      if (!fs::exists(p, ec)) {
        return Status(ErrorCode::InvalidArtifact, cat(where, " lists shard '", shard, "', which does not exist in '", dir, "'"));
      }
      paths.push_back(p.string());
    }
    KEV_ASSIGN_OR_RETURN(SafetensorsSet set, open_files(paths));
    for (const auto& [name, shard] : map_it->items()) {
      const std::optional<SafeTensorRef> ref = set.find(name);
      const std::string expected = (root / shard.get<std::string>()).string();
      if (!ref || ref->file->path() != expected) {
        return Status(ErrorCode::InvalidArtifact,
                      cat(where, " maps '", name, "' to shard '", shard.get<std::string>(), "', which has no such tensor"));
      }
    }
    return set;
  }

  const fs::path single = root / "model.safetensors";
  if (fs::exists(single, ec)) return open_files({single.string()});

  std::vector<std::string> paths;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) paths.push_back(it->path().string());
  }
  if (ec) return Status(ErrorCode::Io, cat("cannot list '", dir, "': ", ec.message()));
  if (paths.empty()) return Status(ErrorCode::InvalidArtifact, cat("'", dir, "' contains no .safetensors file"));
  std::sort(paths.begin(), paths.end());
  return open_files(paths);
}

std::optional<SafeTensorRef> SafetensorsSet::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  const SafetensorsFile& file = files_[it->second.first];
  return SafeTensorRef{&file, &file.tensors()[it->second.second]};
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& entry : index_) out.push_back(entry.first);
  return out;
}

Result<HostTensor> SafetensorsSet::read_f32(std::string_view name) const {
  const std::optional<SafeTensorRef> ref = find(name);
  KEV_CHECK(ref.has_value(), ErrorCode::InvalidArtifact, "no tensor '", name, "' in ", files_.size(),
            " safetensors file(s)", files_.empty() ? std::string() : cat(" (first: '", files_[0].path(), "')"));
  return ref->file->read_f32(*ref->info);
}

// ---- SafetensorsWriter ----------------------------------------------------------------------------

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};

// Counts what a producer writes and refuses anything past the tensor's declared size.
class FileSink : public ByteSink {
 public:
  FileSink(std::FILE* file, const std::string& tmp_path, const std::string& tensor, uint64_t limit,
           uint64_t* total_done, uint64_t total,
           const std::function<void(uint64_t, uint64_t)>& progress)
      : file_(file), tmp_path_(tmp_path), tensor_(tensor), limit_(limit), total_done_(total_done),
        total_(total), progress_(progress) {}

  Status write(std::span<const uint8_t> bytes) override {
    if (bytes.size() > limit_ - written_) {
      return Status(ErrorCode::Internal, cat("producer for tensor '", tensor_, "' wrote more than its ", limit_, " bytes"));
    }
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
      const int err = errno;
      return Status(ErrorCode::Io, cat("error writing '", tmp_path_, "': ", std::strerror(err)));
    }
    written_ += bytes.size();
    *total_done_ += bytes.size();
    if (progress_) progress_(*total_done_, total_);
    return Status::success();
  }
  uint64_t written() const { return written_; }

 private:
  std::FILE* file_;
  const std::string& tmp_path_;
  const std::string& tensor_;
  uint64_t limit_;
  uint64_t written_ = 0;
  uint64_t* total_done_;
  uint64_t total_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
};

}  // namespace

Status SafetensorsWriter::check_new(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape,
                                    uint64_t* size) const {
  KEV_CHECK(!name.empty(), ErrorCode::InvalidRequest, "safetensors tensor names must not be empty");
  KEV_CHECK(name != kMetadataKey, ErrorCode::InvalidRequest, "'", kMetadataKey, "' is reserved, not a tensor name");
  for (const Entry& e : entries_) {
    KEV_CHECK(e.name != name, ErrorCode::InvalidRequest, "tensor '", name, "' was already added");
  }
  const std::optional<uint64_t> numel = checked_numel(shape);
  KEV_CHECK(numel.has_value() && !__builtin_mul_overflow(*numel, st_dtype_size(dtype), size), ErrorCode::InvalidRequest,
            "tensor '", name, "' has shape ", shape_string(shape), " (negative or overflowing)");
  return Status::success();
}

Status SafetensorsWriter::add(std::string name, StDtype dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  uint64_t size = 0;
  KEV_TRY(check_new(name, dtype, shape, &size));
  KEV_CHECK(owned->size() == size, ErrorCode::InvalidRequest, "tensor '", name, "' has ", owned->size(), " bytes; ",
            st_dtype_name(dtype), " shape ", shape_string(shape), " needs ", size);
  entries_.push_back({std::move(name), dtype, std::move(shape), size,
                      [owned](ByteSink& sink) { return sink.write(*owned); }});
  return Status::success();
}

Status SafetensorsWriter::add_view(std::string name, StDtype dtype, std::vector<int64_t> shape,
                                   std::span<const uint8_t> bytes) {
  uint64_t size = 0;
  KEV_TRY(check_new(name, dtype, shape, &size));
  KEV_CHECK(bytes.size() == size, ErrorCode::InvalidRequest, "tensor '", name, "' has ", bytes.size(), " bytes; ",
            st_dtype_name(dtype), " shape ", shape_string(shape), " needs ", size);
  entries_.push_back({std::move(name), dtype, std::move(shape), size, [bytes](ByteSink& sink) { return sink.write(bytes); }});
  return Status::success();
}

Status SafetensorsWriter::add_producer(std::string name, StDtype dtype, std::vector<int64_t> shape,
                                       TensorProducer producer) {
  uint64_t size = 0;
  KEV_TRY(check_new(name, dtype, shape, &size));
  KEV_CHECK(static_cast<bool>(producer), ErrorCode::InvalidRequest, "tensor '", name, "' has no producer");
  entries_.push_back({std::move(name), dtype, std::move(shape), size, std::move(producer)});
  return Status::success();
}

Status SafetensorsWriter::add_f32(std::string name, HostTensor tensor, StDtype dtype) {
  KEV_CHECK(dtype == StDtype::F32 || dtype == StDtype::BF16 || dtype == StDtype::F16, ErrorCode::InvalidRequest,
            "tensor '", name, "': add_f32 stores F32, BF16 or F16, not ", st_dtype_name(dtype));
  uint64_t size = 0;
  KEV_TRY(check_new(name, dtype, tensor.shape, &size));
  KEV_CHECK(tensor.data.size() == static_cast<size_t>(tensor.numel()), ErrorCode::InvalidRequest, "tensor '", name,
            "' has ", tensor.data.size(), " values but shape ", shape_string(tensor.shape), " holds ", tensor.numel());
  std::vector<int64_t> shape = tensor.shape;
  auto owned = std::make_shared<HostTensor>(std::move(tensor));
  // Pieces of 64 Ki elements keep the conversion buffer small and progress reports frequent.
  TensorProducer producer = [owned, dtype](ByteSink& sink) -> Status {
    constexpr size_t kChunk = size_t{1} << 16;
    const std::vector<float>& v = owned->data;
    std::vector<uint16_t> buf(dtype == StDtype::F32 ? 0 : std::min(kChunk, v.size()));
    for (size_t i = 0; i < v.size(); i += kChunk) {
      const size_t n = std::min(kChunk, v.size() - i);
      if (dtype == StDtype::F32) {
        KEV_TRY(sink.write({reinterpret_cast<const uint8_t*>(v.data() + i), n * sizeof(float)}));
        continue;
      }
      if (dtype == StDtype::BF16) {
        f32_to_bf16(v.data() + i, buf.data(), n);
      } else {
        f32_to_f16(v.data() + i, buf.data(), n);
      }
      KEV_TRY(sink.write({reinterpret_cast<const uint8_t*>(buf.data()), n * sizeof(uint16_t)}));
    }
    return Status::success();
  };
  entries_.push_back({std::move(name), dtype, std::move(shape), size, std::move(producer)});
  return Status::success();
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

Status SafetensorsWriter::write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header[kMetadataKey] = metadata_;
  uint64_t total = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {total, total + e.size}}};
    total += e.size;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    return Status(ErrorCode::InvalidRequest, cat("cannot encode the safetensors header for '", path, "': ", ex.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<uint8_t, 8> length{};
  for (size_t i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp_path = cat(path, ".tmp.", ::getpid());
  // Declared before the FILE so that it outlives fclose's final flush.
  std::vector<char> buffer(size_t{4} << 20);
  // Any early return below leaves a partial temporary file; remove it (after the FILE is closed, as
  // destruction runs in reverse order) so that failures leave no debris.
  struct TmpRemover {
    const std::string& p;
    bool armed = true;
    ~TmpRemover() {
      if (armed) std::remove(p.c_str());
    }
  } remover{tmp_path};
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(tmp_path.c_str(), "wb"));
  if (!file) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("cannot create '", tmp_path, "': ", std::strerror(err)));
  }
  std::setvbuf(file.get(), buffer.data(), _IOFBF, buffer.size());
  if (std::fwrite(length.data(), 1, length.size(), file.get()) != length.size() ||
      std::fwrite(text.data(), 1, text.size(), file.get()) != text.size()) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("error writing '", tmp_path, "': ", std::strerror(err)));
  }
  uint64_t done = 0;
  for (const Entry& e : entries_) {
    FileSink sink(file.get(), tmp_path, e.name, e.size, &done, total, progress);
    KEV_TRY(e.producer(sink));
    KEV_CHECK(sink.written() == e.size, ErrorCode::Internal, "producer for tensor '", e.name, "' wrote ",
              sink.written(), " bytes; ", st_dtype_name(e.dtype), " shape ", shape_string(e.shape), " needs ", e.size);
  }
  if (std::fflush(file.get()) != 0 || ::fsync(::fileno(file.get())) != 0) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("error writing '", tmp_path, "': ", std::strerror(err)));
  }
  const int close_result = std::fclose(file.release());
  if (close_result != 0) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("error closing '", tmp_path, "': ", std::strerror(err)));
  }
  std::error_code ec;
  fs::rename(tmp_path, path, ec);
  if (ec) return Status(ErrorCode::Io, cat("cannot rename '", tmp_path, "' to '", path, "': ", ec.message()));
  remover.armed = false;
  return Status::success();
}

}  // namespace kev
