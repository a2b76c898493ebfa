#include "io/torch_checkpoint.h"

#include <zip.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "common/bf16.h"
#include "common/check.h"

namespace kev {

static_assert(std::endian::native == std::endian::little, "storages are little-endian and read in place");

const char* torch_dtype_name(TorchDtype dtype) {
  switch (dtype) {
    case TorchDtype::Float32:
      return "float32";
    case TorchDtype::Float64:
      return "float64";
    case TorchDtype::Float16:
      return "float16";
    case TorchDtype::BFloat16:
      return "bfloat16";
    case TorchDtype::Int64:
      return "int64";
    case TorchDtype::Int32:
      return "int32";
    case TorchDtype::Int16:
      return "int16";
    case TorchDtype::Int8:
      return "int8";
    case TorchDtype::UInt8:
      return "uint8";
    case TorchDtype::Bool:
      return "bool";
  }
  return "unknown";
}

size_t torch_dtype_size(TorchDtype dtype) {
  switch (dtype) {
    case TorchDtype::Float64:
    case TorchDtype::Int64:
      return 8;
    case TorchDtype::Float32:
    case TorchDtype::Int32:
      return 4;
    case TorchDtype::Float16:
    case TorchDtype::BFloat16:
    case TorchDtype::Int16:
      return 2;
    case TorchDtype::Int8:
    case TorchDtype::UInt8:
    case TorchDtype::Bool:
      return 1;
  }
  return 1;
}

// ---- tensors ----

namespace {

// Calls f(i, s) for each element in row-major order: i counts output elements, s is the element's
// index in the storage. The view was checked against the storage when it was built.
template <class F>
void for_each_element(const TorchTensor& t, F f) {
  const int64_t n = t.numel();
  if (n == 0) return;
  if (t.is_contiguous()) {
    for (int64_t i = 0; i < n; ++i) f(i, t.storage_offset + i);
    return;
  }
  std::vector<int64_t> index(t.shape.size(), 0);
  int64_t s = t.storage_offset;
  for (int64_t i = 0; i < n; ++i) {
    f(i, s);
    for (size_t d = t.shape.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) {
        s += t.strides[d];
        break;
      }
      s -= (t.shape[d] - 1) * t.strides[d];
      index[d] = 0;
    }
  }
}

template <class T>
T element(const TorchStorage& storage, int64_t s) {
  T v;
  std::memcpy(&v, storage.bytes.data() + static_cast<size_t>(s) * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

int64_t TorchTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TorchTensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

Result<HostTensor> TorchTensor::to_host_f32() const {
  KEV_CHECK(storage != nullptr, ErrorCode::Internal, "tensor has no storage");
  HostTensor out;
  out.shape = shape;
  out.data.resize(static_cast<size_t>(numel()));
  float* dst = out.data.data();
  const TorchStorage& st = *storage;
  switch (dtype) {
    case TorchDtype::Float32:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<float>(st, s); });
      break;
    case TorchDtype::BFloat16:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = bf16_to_f32(element<uint16_t>(st, s)); });
      break;
    case TorchDtype::Float16:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = f16_to_f32(element<uint16_t>(st, s)); });
      break;
    default:
      return Status(ErrorCode::InvalidArtifact,
                    cat(torch_dtype_name(dtype), " tensors do not convert exactly to float32"));
  }
  return out;
}

Result<std::vector<int64_t>> TorchTensor::to_int64() const {
  KEV_CHECK(storage != nullptr, ErrorCode::Internal, "tensor has no storage");
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  int64_t* dst = out.data();
  const TorchStorage& st = *storage;
  switch (dtype) {
    case TorchDtype::Int64:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<int64_t>(st, s); });
      break;
    case TorchDtype::Int32:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<int32_t>(st, s); });
      break;
    case TorchDtype::Int16:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<int16_t>(st, s); });
      break;
    case TorchDtype::Int8:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<int8_t>(st, s); });
      break;
    case TorchDtype::UInt8:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<uint8_t>(st, s); });
      break;
    case TorchDtype::Bool:
      for_each_element(*this, [&](int64_t i, int64_t s) { dst[i] = element<uint8_t>(st, s) != 0; });
      break;
    default:
      return Status(ErrorCode::InvalidArtifact, cat(torch_dtype_name(dtype), " tensors are not integer tensors"));
  }
  return out;
}

// ---- the archive ----

namespace {

constexpr size_t kMaxPickleBytes = size_t{64} << 20;  // head.pt pickles are a few KiB
constexpr size_t kMaxRank = 16;

struct StorageType {
  const char* name;
  TorchDtype dtype;
};
// The legacy typed-storage class names torch.save still writes into persistent ids.
constexpr std::array<StorageType, 10> kStorageTypes{{
    {"FloatStorage", TorchDtype::Float32},
    {"DoubleStorage", TorchDtype::Float64},
    {"HalfStorage", TorchDtype::Float16},
    {"BFloat16Storage", TorchDtype::BFloat16},
    {"LongStorage", TorchDtype::Int64},
    {"IntStorage", TorchDtype::Int32},
    {"ShortStorage", TorchDtype::Int16},
    {"CharStorage", TorchDtype::Int8},
    {"ByteStorage", TorchDtype::UInt8},
    {"BoolStorage", TorchDtype::Bool},
}};

// torch.dtype objects pickle as these globals (e.g. a dtype kept among training arguments).
constexpr std::array<std::string_view, 15> kDtypeNames{"float32", "float",    "float64", "double", "float16",
                                                       "half",    "bfloat16", "int64",   "long",   "int32",
                                                       "int",     "int16",    "int8",    "uint8",  "bool"};

std::optional<TorchDtype> storage_dtype(const PickleGlobal& g) {
  if (g.module != "torch") return std::nullopt;
  for (const StorageType& t : kStorageTypes) {
    if (g.name == t.name) return t.dtype;
  }
  return std::nullopt;
}

bool is_global(const PickleGlobal& g, std::string_view module, std::string_view name) {
  return g.module == module && g.name == name;
}

bool allow_global(const PickleGlobal& g) {
  if (is_global(g, "collections", "OrderedDict") || is_global(g, "torch._utils", "_rebuild_tensor_v2") ||
      is_global(g, "torch._utils", "_rebuild_parameter") || storage_dtype(g)) {
    return true;
  }
  if (g.module == "torch") {
    for (std::string_view name : kDtypeNames) {
      if (g.name == name) return true;
    }
  }
  return false;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += cat(i ? ", " : "", shape[i]);
  return out + "]";
}

Status bad_args(const PickleGlobal& g, const std::string& what) {
  return Status(ErrorCode::InvalidArtifact, cat(g.qualified(), " called with ", what));
}

Result<std::vector<int64_t>> int_sequence(const PickleGlobal& g, const PickleValue& v, const char* what) {
  const std::vector<PickleValue>* items = v.if_sequence();
  if (items == nullptr) return bad_args(g, cat(what, " of type ", v.type_name()));
  if (items->size() > kMaxRank) return bad_args(g, cat(what, " of rank ", items->size(), "; at most ", kMaxRank));
  std::vector<int64_t> out;
  for (const PickleValue& item : *items) {
    const int64_t* i = item.if_int();
    if (i == nullptr || *i < 0)
      return bad_args(g, cat(what, " holding a value of type ", item.type_name(), " or a negative int"));
    out.push_back(*i);
  }
  return out;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]).
Result<PickleValue> rebuild_tensor(const PickleGlobal& g, const PickleValue& args) {
  const std::vector<PickleValue>* a = args.if_tuple();
  if (a == nullptr || (a->size() != 6 && a->size() != 7)) {
    return bad_args(g, a ? cat(a->size(), " arguments; expected 6 or 7") : cat("arguments of type ", args.type_name()));
  }
  const std::shared_ptr<const TorchStorage>* storage = (*a)[0].if_storage();
  if (storage == nullptr)
    return bad_args(g, cat("a value of type ", (*a)[0].type_name(), " where the storage belongs"));
  const int64_t* offset = (*a)[1].if_int();
  if (offset == nullptr || *offset < 0) return bad_args(g, "a storage offset that is not a non-negative int");
  auto t = std::make_shared<TorchTensor>();
  KEV_ASSIGN_OR_RETURN(t->shape, int_sequence(g, (*a)[2], "a size"));
  KEV_ASSIGN_OR_RETURN(t->strides, int_sequence(g, (*a)[3], "a stride"));
  if (t->shape.size() != t->strides.size()) {
    return bad_args(g, cat("size of rank ", t->shape.size(), " but stride of rank ", t->strides.size()));
  }
  if (!(*a)[4].if_bool()) return bad_args(g, "requires_grad that is not a bool");
  for (size_t i = 5; i < a->size(); ++i) {
    if (!(*a)[i].if_dict()) return bad_args(g, cat("a value of type ", (*a)[i].type_name(), " where a dict belongs"));
  }
  const TorchStorage& st = **storage;
  t->dtype = st.dtype;
  t->storage = *storage;
  t->storage_offset = *offset;

  // Each size is at most the storage's numel whenever the product is, so nothing below overflows.
  int64_t numel = 1;
  for (int64_t d : t->shape) {
    if (d == 0) {
      numel = 0;
      break;
    }
    if (d > st.numel || numel > st.numel / d)
      numel = st.numel + 1;
    else
      numel *= d;
  }
  KEV_CHECK(numel <= st.numel, ErrorCode::InvalidArtifact, "tensor of size ", shape_string(t->shape),
            " has more elements than its storage '", st.key, "' (", st.numel, " elements)");
  if (numel > 0) {
    int64_t last = *offset;
    for (size_t d = 0; d < t->shape.size(); ++d) {
      int64_t step = 0;
      if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &step) || __builtin_add_overflow(last, step, &last)) {
        last = std::numeric_limits<int64_t>::max();
        break;
      }
    }
    KEV_CHECK(last < st.numel, ErrorCode::InvalidArtifact, "tensor of size ", shape_string(t->shape), " at offset ",
              *offset, " reaches element ", last, " of storage '", st.key, "', which has ", st.numel);
  }
  return PickleValue::tensor(std::move(t));
}

// ---- zip access ----

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipCloser>;

struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

class Archive {
 public:
  Archive(ZipPtr zip, std::string stem, uint64_t file_size)
      : zip_(std::move(zip)), stem_(std::move(stem)), file_size_(file_size) {}

  bool has(const std::string& name) const { return zip_name_locate(zip_.get(), entry(name).c_str(), 0) >= 0; }

  // Reads <stem>/<name>, which must hold at most max_bytes (exactly `exact` if given) and, when
  // `stored`, be uncompressed, so that the size the directory declares is the size on disk.
  Result<std::vector<uint8_t>> read(const std::string& name, uint64_t max_bytes, std::optional<uint64_t> exact,
                                    bool stored) const {
    const std::string full = entry(name);
    const zip_int64_t index = zip_name_locate(zip_.get(), full.c_str(), 0);
    KEV_CHECK(index >= 0, ErrorCode::InvalidArtifact, "the archive has no entry '", full, "'");
    zip_stat_t st;
    zip_stat_init(&st);
    KEV_CHECK(zip_stat_index(zip_.get(), static_cast<zip_uint64_t>(index), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE) &&
                  (st.valid & ZIP_STAT_COMP_METHOD),
              ErrorCode::InvalidArtifact, "cannot stat entry '", full, "': ", zip_strerror(zip_.get()));
    if (exact) {
      KEV_CHECK(st.size == *exact, ErrorCode::InvalidArtifact, "entry '", full, "' has ", st.size,
                " bytes; the pickle says it holds ", *exact);
    }
    KEV_CHECK(st.size <= max_bytes, ErrorCode::InvalidArtifact, "entry '", full, "' has ", st.size, " bytes; at most ",
              max_bytes, " are accepted");
    KEV_CHECK(!stored || st.comp_method == ZIP_CM_STORE, ErrorCode::InvalidArtifact, "entry '", full,
              "' is compressed (method ", st.comp_method, "); torch.save stores entries uncompressed");
    // Checked before allocating: an uncompressed entry cannot be larger than the whole file.
    KEV_CHECK(!stored || st.size <= file_size_, ErrorCode::InvalidArtifact, "entry '", full, "' claims ", st.size,
              " bytes in a file of ", file_size_, " bytes");
    std::unique_ptr<zip_file_t, ZipFileCloser> f(zip_fopen_index(zip_.get(), static_cast<zip_uint64_t>(index), 0));
    KEV_CHECK(f != nullptr, ErrorCode::InvalidArtifact, "cannot open entry '", full, "': ", zip_strerror(zip_.get()));
    std::vector<uint8_t> bytes(static_cast<size_t>(st.size));
    zip_uint64_t done = 0;
    while (done < st.size) {
      const zip_int64_t n = zip_fread(f.get(), bytes.data() + done, st.size - done);
      KEV_CHECK(n > 0, ErrorCode::InvalidArtifact, "entry '", full, "' ends after ", done, " of ", st.size, " bytes",
                n < 0 ? cat(": ", zip_file_strerror(f.get())) : std::string(), " (truncated?)");
      done += static_cast<zip_uint64_t>(n);
    }
    // libzip verifies the CRC only once a read reaches the end of the entry.
    uint8_t extra = 0;
    const zip_int64_t tail = zip_fread(f.get(), &extra, 1);
    KEV_CHECK(tail == 0, ErrorCode::InvalidArtifact, "entry '", full,
              "': ", tail < 0 ? zip_file_strerror(f.get()) : "holds more bytes than its size says");
    return bytes;
  }

  std::string entry(const std::string& name) const { return stem_ + "/" + name; }

 private:
  ZipPtr zip_;
  std::string stem_;
  uint64_t file_size_;
};

Result<Archive> open_archive(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KEV_CHECK(in, ErrorCode::Io, "cannot open: ", std::strerror(errno));
  std::array<char, 4> magic{};
  in.read(magic.data(), magic.size());
  const std::string_view head(magic.data(), static_cast<size_t>(in.gcount()));
  KEV_CHECK(!head.empty(), ErrorCode::InvalidArtifact, "the file is empty; expected a torch.save zip archive");
  // The legacy format is a bare pickle stream that begins with a PROTO opcode.
  KEV_CHECK(static_cast<uint8_t>(head[0]) != 0x80, ErrorCode::Unsupported,
            "the file uses the legacy torch serialization; re-save it with torch >= 1.6 (torch.save(obj, path))");
  KEV_CHECK(head == std::string_view("PK\x03\x04", 4) || head == std::string_view("PK\x05\x06", 4),
            ErrorCode::InvalidArtifact, "the file is not a torch.save zip archive (it does not start with \"PK\")");

  int error = 0;
  ZipPtr zip(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &error));
  if (!zip) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, error);
    std::string message = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    return Status(ErrorCode::InvalidArtifact,
                  cat("cannot read the zip archive: ", message, " (truncated or corrupt?)"));
  }
  // The pickle sits at <stem>/data.pkl, where stem is the archive's single top-level folder.
  std::optional<std::string> stem;
  const zip_int64_t n = zip_get_num_entries(zip.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* raw = zip_get_name(zip.get(), static_cast<zip_uint64_t>(i), 0);
    if (raw == nullptr) continue;
    const std::string_view name(raw);
    constexpr std::string_view kSuffix = "/data.pkl";
    if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix)) continue;
    const std::string_view folder = name.substr(0, name.size() - kSuffix.size());
    if (folder.find('/') != std::string_view::npos) continue;
    KEV_CHECK(!stem, ErrorCode::InvalidArtifact, "the archive holds two pickles, '", *stem, "/data.pkl' and '", name,
              "'");
    stem = std::string(folder);
  }
  KEV_CHECK(stem, ErrorCode::InvalidArtifact, "the archive has no <folder>/data.pkl entry (", n,
            " entries); not a torch.save file");
  std::error_code ec;
  const uintmax_t file_size = std::filesystem::file_size(path, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot read the file size: ", ec.message());
  return Archive(std::move(zip), std::move(*stem), file_size);
}

class CheckpointReader {
 public:
  explicit CheckpointReader(const Archive& archive) : archive_(archive) {}

  PickleHooks hooks() {
    PickleHooks h;
    h.allow_global = allow_global;
    h.reduce = [this](const PickleGlobal& g, const PickleValue& args) { return reduce(g, args); };
    h.build = [](const PickleValue& object, const PickleValue&) -> Status {
      // OrderedDicts from state_dict() carry a `_metadata` attribute; it is not data.
      KEV_CHECK(object.if_dict(), ErrorCode::InvalidArtifact, "pickle sets the state of a value of type ",
                object.type_name(), " (BUILD); only dict attributes are accepted");
      return Status::success();
    };
    h.persistent_load = [this](const PickleValue& pid) { return load_storage(pid); };
    return h;
  }

 private:
  Result<PickleValue> reduce(const PickleGlobal& g, const PickleValue& args) {
    const std::vector<PickleValue>* a = args.if_tuple();
    if (is_global(g, "collections", "OrderedDict")) {
      if (a != nullptr && a->empty()) return PickleValue::dict();
      // OrderedDict([[k, v], ...]), the older spelling.
      const std::vector<PickleValue>* pairs = (a && a->size() == 1) ? (*a)[0].if_sequence() : nullptr;
      if (pairs == nullptr) return bad_args(g, "arguments other than () or ([pairs],)");
      std::vector<std::pair<PickleValue, PickleValue>> entries;
      for (const PickleValue& p : *pairs) {
        const std::vector<PickleValue>* kv = p.if_sequence();
        if (kv == nullptr || kv->size() != 2) return bad_args(g, "an item that is not a (key, value) pair");
        entries.emplace_back((*kv)[0], (*kv)[1]);
      }
      return PickleValue::dict(std::move(entries));
    }
    if (is_global(g, "torch._utils", "_rebuild_tensor_v2")) return rebuild_tensor(g, args);
    if (is_global(g, "torch._utils", "_rebuild_parameter")) {
      // _rebuild_parameter(data, requires_grad, backward_hooks): a Parameter is its data here.
      if (a == nullptr || a->size() != 3 || !(*a)[0].if_tensor())
        return bad_args(g, "arguments other than (tensor, bool, dict)");
      return (*a)[0];
    }
    return Status(ErrorCode::InvalidArtifact,
                  cat("pickle calls ", g.qualified(), ", which is not a tensor constructor"));
  }

  // ("storage", torch.<Type>Storage, key, location, numel): the storage at <stem>/data/<key>.
  Result<PickleValue> load_storage(const PickleValue& pid) {
    const std::vector<PickleValue>* p = pid.if_tuple();
    const bool shaped = p != nullptr && p->size() == 5 && (*p)[0].if_string() && *(*p)[0].if_string() == "storage" &&
                        ((*p)[1].if_global() || (*p)[1].if_opaque()) && (*p)[2].if_string() && (*p)[3].if_string() &&
                        (*p)[4].if_int();
    KEV_CHECK(shaped, ErrorCode::InvalidArtifact,
              "pickle has a persistent id that is not (\"storage\", type, key, location, numel)");
    const std::string& key = *(*p)[2].if_string();
    const int64_t numel = *(*p)[4].if_int();
    // A storage class off the allow-list arrives as an opaque object.
    const PickleGlobal* type = (*p)[1].if_global();
    const std::optional<TorchDtype> dtype = type ? storage_dtype(*type) : std::nullopt;
    KEV_CHECK(dtype, ErrorCode::InvalidArtifact, "storage '", key, "' has type ",
              type ? type->qualified() : (*p)[1].type_name(), ", which is not a supported storage class");
    KEV_CHECK(!key.empty() && key.find('/') == std::string::npos, ErrorCode::InvalidArtifact, "storage key '", key,
              "' is not a plain entry name");
    const size_t elem = torch_dtype_size(*dtype);
    KEV_CHECK(numel >= 0 && static_cast<uint64_t>(numel) <= std::numeric_limits<uint64_t>::max() / elem,
              ErrorCode::InvalidArtifact, "storage '", key, "' has ", numel, " elements");

    if (auto it = storages_.find(key); it != storages_.end()) {
      const TorchStorage& seen = *it->second;
      KEV_CHECK(seen.dtype == *dtype && seen.numel == numel, ErrorCode::InvalidArtifact, "storage '", key,
                "' is described as ", numel, " x ", torch_dtype_name(*dtype), " and as ", seen.numel, " x ",
                torch_dtype_name(seen.dtype));
      return PickleValue::storage(it->second);
    }
    const uint64_t size = static_cast<uint64_t>(numel) * elem;
    auto storage = std::make_shared<TorchStorage>();
    storage->key = key;
    storage->dtype = *dtype;
    storage->numel = numel;
    KEV_ASSIGN_OR_RETURN(storage->bytes, archive_.read("data/" + key, size, size, /*stored=*/true));
    std::shared_ptr<const TorchStorage> shared = std::move(storage);
    storages_.emplace(key, shared);
    return PickleValue::storage(std::move(shared));
  }

  const Archive& archive_;
  std::unordered_map<std::string, std::shared_ptr<const TorchStorage>> storages_;
};

Status in_file(const std::string& path, const Status& s) { return Status(s.code(), cat(path, ": ", s.message())); }

}  // namespace

Result<PickleValue> read_torch_checkpoint(const std::string& path) {
  Result<Archive> archive = open_archive(path);
  if (!archive.ok()) return in_file(path, archive.status());
  if (archive->has("byteorder")) {
    Result<std::vector<uint8_t>> order = archive->read("byteorder", 16, std::nullopt, false);
    if (!order.ok()) return in_file(path, order.status());
    const std::string text(order->begin(), order->end());
    if (text != "little") {
      return in_file(path, Status(ErrorCode::Unsupported,
                                  cat("storages are '", text, "'-endian; only little-endian is supported")));
    }
  }
  Result<std::vector<uint8_t>> pickle = archive->read("data.pkl", kMaxPickleBytes, std::nullopt, false);
  if (!pickle.ok()) return in_file(path, pickle.status());
  CheckpointReader reader(*archive);
  Result<PickleValue> root = unpickle(*pickle, reader.hooks());
  if (!root.ok()) return in_file(path, root.status());
  return root;
}

}  // namespace kev
