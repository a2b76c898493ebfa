// safetensors reader and writer: bit-exact round trips, byte compatibility with the reference layout,
// and a clear error (never a crash) for every kind of malformed file.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "io/temp_dir.h"

namespace kev {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

bool mentions(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

// A raw safetensors file: u64 LE header length, header text, data.
std::string raw_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}


template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class SafetensorsErrors : public ::testing::Test {
 protected:
  // Writes `contents` to a file and opens it, expecting failure with `code` and every `needles` text.
  void expect_error(const std::string& contents, ErrorCode code, std::vector<std::string> needles) {
    const std::string path = tmp_.path("bad.safetensors");
    write_file(path, contents);
    Result<SafetensorsFile> f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.ok()) << "opened a malformed file";
    EXPECT_EQ(f.status().code(), code) << f.status().to_string();
    for (const std::string& n : needles) EXPECT_TRUE(mentions(f.status(), n)) << f.status().to_string() << "\nwant: " << n;
  }
  TempDir tmp_;
};

TEST(Safetensors, DtypeTable) {
  EXPECT_EQ(st_dtype_size(StDtype::F32), 4u);
  EXPECT_EQ(st_dtype_size(StDtype::BF16), 2u);
  EXPECT_EQ(st_dtype_size(StDtype::F16), 2u);
  EXPECT_EQ(st_dtype_size(StDtype::I64), 8u);
  EXPECT_EQ(st_dtype_size(StDtype::BOOL), 1u);
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
                           "F32", "F64", "I64", "U64"}) {
    std::optional<StDtype> d = st_dtype_from_name(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_STREQ(st_dtype_name(*d), name);
  }
  EXPECT_FALSE(st_dtype_from_name("f32").has_value());
  EXPECT_FALSE(st_dtype_from_name("F4").has_value());
}

TEST(Safetensors, RoundTripIsBitIdentical) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  const std::vector<float> f32 = {1.0f, -2.5f, 3.25e-30f, std::numeric_limits<float>::infinity(), -0.0f, 7.0f};
  const std::vector<int64_t> i64 = {-1, 0, int64_t{1} << 62};
  const std::vector<int32_t> i32 = {5, -6};
  const std::vector<double> f64 = {0.1, -1e300};
  const std::vector<uint16_t> f16 = {f32_to_f16(0.5f), f32_to_f16(-1000.0f), 0x7c00, 0x0001};
  const std::vector<uint8_t> view_bytes = {1, 0, 1};
  const std::vector<float> pointer = {0.1f, 0.2f, 0.3f, 0.4f};

  SafetensorsWriter w;
  ASSERT_TRUE(w.add("f32", StDtype::F32, {2, 3}, bytes_of(f32)).ok());
  ASSERT_TRUE(w.add_f32("as_bf16", HostTensor({2, 2}, pointer), StDtype::BF16).ok());
  ASSERT_TRUE(w.add_f32("as_f16", HostTensor({4}, pointer), StDtype::F16).ok());
  ASSERT_TRUE(w.add_f32("as_f32", HostTensor({1, 4}, pointer), StDtype::F32).ok());
  ASSERT_TRUE(w.add("i64", StDtype::I64, {3}, bytes_of(i64)).ok());
  ASSERT_TRUE(w.add("i32", StDtype::I32, {2}, bytes_of(i32)).ok());
  ASSERT_TRUE(w.add("f64", StDtype::F64, {2}, bytes_of(f64)).ok());
  ASSERT_TRUE(w.add("f16", StDtype::F16, {2, 2}, bytes_of(f16)).ok());
  ASSERT_TRUE(w.add_view("bool", StDtype::BOOL, {3}, view_bytes).ok());
  ASSERT_TRUE(w.add("empty", StDtype::F32, {0, 5}, {}).ok());
  ASSERT_TRUE(w.add("scalar", StDtype::U8, {}, {42}).ok());
  // A producer writing in uneven pieces.
  ASSERT_TRUE(w.add_producer("produced", StDtype::U8, {10}, [](ByteSink& sink) -> Status {
                 const uint8_t a[3] = {0, 1, 2}, b[7] = {3, 4, 5, 6, 7, 8, 9};
                 if (Status s = sink.write(a); !s.ok()) return s;
                 if (Status s = sink.write({}); !s.ok()) return s;
                 return sink.write(b);
               }).ok());
  w.set_metadata("format", "pt");
  w.set_metadata("note", "ünïcode \"quoted\"");

  std::vector<std::pair<uint64_t, uint64_t>> progress;
  const std::string path = tmp.path("rt.safetensors");
  Status s = w.write(path, [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); });
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_FALSE(progress.empty());
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
  EXPECT_EQ(progress.back().first, progress.back().second);

  const std::string raw = read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(progress.back().second, raw.size() - 8 - header_len);

  Result<SafetensorsFile> opened = SafetensorsFile::open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  const SafetensorsFile& f = opened.value();
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "ünïcode \"quoted\"");
  const std::vector<std::string> order = {"f32", "as_bf16", "as_f16", "as_f32", "i64", "i32", "f64",
                                          "f16", "bool",    "empty",  "scalar", "produced"};
  ASSERT_EQ(f.tensors().size(), order.size());
  // The two zero-byte tensors share an offset with their neighbours; compare as a set of names.
  for (const std::string& name : order) ASSERT_NE(f.find(name), nullptr) << name;
  for (size_t i = 0; i + 1 < f.tensors().size(); ++i) {
    EXPECT_EQ(f.tensors()[i].offset + f.tensors()[i].size, f.tensors()[i + 1].offset);
  }
  EXPECT_EQ(f.tensors().front().name, "f32");
  EXPECT_EQ(f.tensors().back().name, "produced");
  EXPECT_EQ(f.tensors().back().offset + f.tensors().back().size, raw.size());

  auto raw_bytes = [&](const std::string& name) {
    std::span<const uint8_t> b = f.bytes(*f.find(name));
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  EXPECT_EQ(raw_bytes("f32"), bytes_of(f32));
  EXPECT_EQ(raw_bytes("i64"), bytes_of(i64));
  EXPECT_EQ(raw_bytes("i32"), bytes_of(i32));
  EXPECT_EQ(raw_bytes("f64"), bytes_of(f64));
  EXPECT_EQ(raw_bytes("f16"), bytes_of(f16));
  EXPECT_EQ(raw_bytes("bool"), view_bytes);
  EXPECT_EQ(raw_bytes("scalar"), std::vector<uint8_t>{42});
  EXPECT_EQ(raw_bytes("produced"), (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(raw_bytes("empty").empty());

  const SafeTensorInfo& bf = *f.find("as_bf16");
  EXPECT_EQ(bf.dtype, StDtype::BF16);
  EXPECT_EQ(bf.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(bf.numel(), 4);
  EXPECT_EQ(f.find("scalar")->shape.size(), 0u);
  EXPECT_EQ(f.find("empty")->shape, (std::vector<int64_t>{0, 5}));

  Result<HostTensor> t32 = f.read_f32("f32");
  ASSERT_TRUE(t32.ok());
  EXPECT_EQ(t32->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(bytes_of(t32->data), bytes_of(f32));
  Result<HostTensor> tbf = f.read_f32("as_bf16");
  ASSERT_TRUE(tbf.ok());
  for (size_t i = 0; i < pointer.size(); ++i) EXPECT_EQ(tbf->data[i], bf16_to_f32(f32_to_bf16(pointer[i])));
  Result<HostTensor> th = f.read_f32("as_f16");
  ASSERT_TRUE(th.ok());
  for (size_t i = 0; i < pointer.size(); ++i) EXPECT_EQ(th->data[i], f16_to_f32(f32_to_f16(pointer[i])));
  EXPECT_EQ(f.read_f32("as_f32")->data, pointer);
  EXPECT_EQ(f.read_f32("f64")->data, (std::vector<float>{0.1f, -std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(f.read_f32("f16")->data[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f.read_f32("empty")->data.size(), 0u);

  Result<HostTensor> as_int = f.read_f32("i32");
  ASSERT_FALSE(as_int.ok());
  EXPECT_EQ(as_int.status().code(), ErrorCode::Unsupported);
  EXPECT_TRUE(mentions(as_int.status(), "'i32'") && mentions(as_int.status(), "I32")) << as_int.status().message();
  Result<HostTensor> absent = f.read_f32("nope");
  ASSERT_FALSE(absent.ok());
  EXPECT_TRUE(mentions(absent.status(), "'nope'"));
  EXPECT_EQ(f.find("nope"), nullptr);

  // The temporary file was renamed away.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.dir())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, WriterMatchesTheReferenceLayout) {
  // What the reference `safetensors.serialize` produces for {"a": float32 [1, 2]}: a compact header,
  // padded with spaces to a multiple of 8.
  TempDir tmp;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", StDtype::F32, {2}, bytes_of(std::vector<float>{1.0f, 2.0f})).ok());
  ASSERT_TRUE(w.write(tmp.path("a.safetensors")).ok());
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  EXPECT_EQ(read_file(tmp.path("a.safetensors")), raw_file(header, data));
}

TEST(Safetensors, ReadsUnpaddedHeadersAndUnalignedData) {
  // Other writers need not pad: a 53-byte header leaves every tensor at an odd address.
  TempDir tmp;
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                             R"("c":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  ASSERT_NE(header.size() % 8, 0u);
  write_file(tmp.path("u.safetensors"), raw_file(header, std::string("\x80\x3f\x00\xc0\x00\x00\x40\x40", 8)));
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.path("u.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->read_f32("b")->data, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f->read_f32("c")->data, (std::vector<float>{3.0f}));
  EXPECT_TRUE(f->metadata().empty());
}

TEST(Safetensors, HeaderOnlyFileWithNoTensors) {
  TempDir tmp;
  SafetensorsWriter w;
  w.set_metadata("k", "v");
  ASSERT_TRUE(w.write(tmp.path("none.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.path("none.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().at("k"), "v");
}

TEST(Safetensors, StreamsLargeProducerData) {
  // 48 MiB in 1 MiB pieces through a producer; the writer must not need it all in memory.
  TempDir tmp;
  constexpr int64_t kPieces = 48, kPiece = int64_t{1} << 20;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add_producer("big", StDtype::U8, {kPieces, kPiece}, [](ByteSink& sink) -> Status {
                 std::vector<uint8_t> piece(static_cast<size_t>(kPiece));
                 for (int64_t p = 0; p < kPieces; ++p) {
                   std::fill(piece.begin(), piece.end(), static_cast<uint8_t>(p));
                   if (Status s = sink.write(piece); !s.ok()) return s;
                 }
                 return Status::success();
               }).ok());
  int calls = 0;
  ASSERT_TRUE(w.write(tmp.path("big.safetensors"), [&](uint64_t, uint64_t) { ++calls; }).ok());
  EXPECT_EQ(calls, kPieces);
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.path("big.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  std::span<const uint8_t> b = f->bytes(*f->find("big"));
  ASSERT_EQ(b.size(), static_cast<size_t>(kPieces * kPiece));
  for (int64_t p = 0; p < kPieces; ++p) ASSERT_EQ(b[static_cast<size_t>(p * kPiece + 12345)], p);
}

TEST(Safetensors, AddF32ConvertsAcrossChunkBoundaries) {
  // More values than one conversion piece (64 Ki), with a ragged last piece.
  TempDir tmp;
  std::vector<float> values(150001);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.37f - 1000.0f;
  SafetensorsWriter w;
  for (StDtype dtype : {StDtype::F32, StDtype::BF16, StDtype::F16}) {
    ASSERT_TRUE(w.add_f32(st_dtype_name(dtype), HostTensor({150001}, values), dtype).ok());
  }
  ASSERT_TRUE(w.write(tmp.path("c.safetensors")).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.path("c.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->read_f32("F32")->data, values);
  const std::vector<float> bf = f->read_f32("BF16")->data, half = f->read_f32("F16")->data;
  ASSERT_EQ(bf.size(), values.size());
  ASSERT_EQ(half.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(bf[i], bf16_to_f32(f32_to_bf16(values[i]))) << i;
    ASSERT_EQ(half[i], f16_to_f32(f32_to_f16(values[i]))) << i;
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("x", StDtype::F32, {1}, std::vector<uint8_t>(4)).ok());
  Status dup = w.add("x", StDtype::F32, {1}, std::vector<uint8_t>(4));
  EXPECT_EQ(dup.code(), ErrorCode::InvalidRequest);
  EXPECT_TRUE(mentions(dup, "'x' was already added"));
  EXPECT_FALSE(w.add("__metadata__", StDtype::U8, {1}, {1}).ok());
  EXPECT_FALSE(w.add("", StDtype::U8, {1}, {1}).ok());
  Status size = w.add("y", StDtype::F32, {2}, std::vector<uint8_t>(4));
  EXPECT_TRUE(mentions(size, "'y' has 4 bytes")) << size.message();
  EXPECT_TRUE(mentions(size, "needs 8")) << size.message();
  EXPECT_FALSE(w.add_view("z", StDtype::BF16, {3}, std::vector<uint8_t>(5)).ok());
  EXPECT_FALSE(w.add("neg", StDtype::U8, {-1}, {}).ok());
  EXPECT_FALSE(w.add("huge", StDtype::F64, {int64_t{1} << 40, int64_t{1} << 30}, {}).ok());
  EXPECT_FALSE(w.add_f32("i", HostTensor({1}, {1.0f}), StDtype::I32).ok());
  EXPECT_FALSE(w.add_f32("mismatch", HostTensor({3}, {1.0f}), StDtype::F32).ok());
  EXPECT_FALSE(w.add_producer("noproducer", StDtype::U8, {1}, TensorProducer{}).ok());
}

TEST(Safetensors, ProducerSizeErrorsLeaveNoFile) {
  TempDir tmp;
  for (int extra : {-1, +1}) {
    SafetensorsWriter w;
    ASSERT_TRUE(w.add_producer("p", StDtype::U8, {4}, [extra](ByteSink& sink) {
                   return sink.write(std::vector<uint8_t>(static_cast<size_t>(4 + extra)));
                 }).ok());
    Status s = w.write(tmp.path("p.safetensors"));
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(mentions(s, "'p'")) << s.message();
    EXPECT_TRUE(std::filesystem::is_empty(tmp.dir())) << "a failed write left files behind";
  }
  SafetensorsWriter failing;
  ASSERT_TRUE(failing.add_producer("q", StDtype::U8, {1}, [](ByteSink&) {
                       return Status(ErrorCode::InvalidArtifact, "source tensor missing");
                     }).ok());
  Status s = failing.write(tmp.path("q.safetensors"));
  EXPECT_EQ(s.code(), ErrorCode::InvalidArtifact);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.dir()));
}

TEST(Safetensors, WriterReportsIoAndEncodingErrors) {
  TempDir tmp;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("x", StDtype::U8, {1}, {1}).ok());
  Status no_dir = w.write(tmp.path("missing_dir/x.safetensors"));
  EXPECT_EQ(no_dir.code(), ErrorCode::Io);
  EXPECT_TRUE(mentions(no_dir, "missing_dir")) << no_dir.message();

  SafetensorsWriter bad_name;
  ASSERT_TRUE(bad_name.add("\xff\xfe", StDtype::U8, {1}, {1}).ok());
  Status enc = bad_name.write(tmp.path("enc.safetensors"));
  EXPECT_EQ(enc.code(), ErrorCode::InvalidRequest) << enc.to_string();
}

// ---- malformed files ------------------------------------------------------------------------------

TEST_F(SafetensorsErrors, MissingFile) {
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp_.path("absent.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::Io);
  EXPECT_TRUE(mentions(f.status(), "absent.safetensors"));
}

TEST_F(SafetensorsErrors, EmptyFile) { expect_error("", ErrorCode::InvalidArtifact, {"empty"}); }

TEST_F(SafetensorsErrors, TruncatedLengthPrefix) {
  expect_error(std::string("\x10\x00\x00", 3), ErrorCode::InvalidArtifact, {"3 bytes", "8-byte header length"});
}

TEST_F(SafetensorsErrors, HeaderLengthBeyondFile) {
  expect_error(raw_file("{}").substr(0, 9), ErrorCode::InvalidArtifact, {"header length 2", "1 bytes follow"});
  std::string huge(8, '\xff');
  expect_error(huge + "{}", ErrorCode::InvalidArtifact, {"header length 18446744073709551615"});
}

TEST_F(SafetensorsErrors, HeaderLengthOverLimit) {
  // A sparse file big enough to hold a 100,000,001-byte header.
  const std::string path = tmp_.path("bad.safetensors");
  std::string prefix(8, '\0');
  const uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file(path, prefix);
  std::filesystem::resize_file(path, 8 + n);
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(mentions(f.status(), "exceeds the limit of 100000000")) << f.status().message();
}

TEST_F(SafetensorsErrors, MalformedHeaderJson) {
  expect_error(raw_file(R"({"a": {"dtype": "F32", )"), ErrorCode::InvalidArtifact, {"not valid JSON", "at byte"});
  expect_error(raw_file(std::string("{\0}", 3)), ErrorCode::InvalidArtifact, {"not valid JSON"});
  expect_error(raw_file(""), ErrorCode::InvalidArtifact, {"not valid JSON"});
  expect_error(raw_file("[1, 2]"), ErrorCode::InvalidArtifact, {"not a JSON object"});
  expect_error(raw_file(R"({"a": 5})"), ErrorCode::InvalidArtifact, {"tensor 'a' is not an object"});
}

TEST_F(SafetensorsErrors, MissingOrMistypedFields) {
  expect_error(raw_file(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "missing field 'dtype'"});
  expect_error(raw_file(R"({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "'dtype' must be a string"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "'shape' must be an array"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "'data_offsets' must be [begin, end]", "nothing"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "[0,4,8]"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "data_offsets"});
}

TEST_F(SafetensorsErrors, UnknownDtypeNamesTensorAndDtype) {
  expect_error(raw_file(R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", std::string(1, '\0')),
               ErrorCode::Unsupported, {"tensor 'w'", "dtype 'F4'"});
}

TEST_F(SafetensorsErrors, BadShapes) {
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "invalid dimension -1"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "invalid dimension 1.5"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "overflows"});
  expect_error(raw_file(R"({"a": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "overflows"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "invalid dimension"});
}

TEST_F(SafetensorsErrors, OffsetsOutOfRange) {
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "[0, 8]", "past the end of the data section (4 bytes)"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", std::string(8, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "begin > end"});
  expect_error(raw_file(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551615, 0]}})"),
               ErrorCode::InvalidArtifact, {"tensor 'a'", "begin > end"});
}

TEST_F(SafetensorsErrors, SizeMismatch) {
  expect_error(raw_file(R"({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", std::string(8, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'a' has 8 bytes", "BF16 shape [3] needs 6"});
}

TEST_F(SafetensorsErrors, OverlappingTensors) {
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        std::string(12, '\0')),
               ErrorCode::InvalidArtifact, {"tensor 'b' [4, 12) overlaps tensor 'a' [0, 8)"});
  // Two tensors on the very same bytes.
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                        R"( "b": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                        std::string(4, '\0')),
               ErrorCode::InvalidArtifact, {"overlaps"});
}

TEST_F(SafetensorsErrors, GapsAndTrailingBytes) {
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", std::string(8, '\0')),
               ErrorCode::InvalidArtifact, {"data bytes [0, 4) belong to no tensor", "'a'"});
  expect_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::string(6, '\0')),
               ErrorCode::InvalidArtifact, {"6 bytes", "cover only 4", "2 trailing bytes"});
  expect_error(raw_file("{}", "x"), ErrorCode::InvalidArtifact, {"1 trailing bytes"});
}

TEST_F(SafetensorsErrors, BadMetadata) {
  expect_error(raw_file(R"({"__metadata__": {"format": 1}})"), ErrorCode::InvalidArtifact,
               {"__metadata__ value for 'format' is not a string"});
  expect_error(raw_file(R"({"__metadata__": ["x"]})"), ErrorCode::InvalidArtifact, {"__metadata__ is not an object"});
}

TEST_F(SafetensorsErrors, TruncatedData) {
  // A valid file cut short: the last tensor's range now runs past the end.
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", StDtype::F32, {4}, std::vector<uint8_t>(16, 7)).ok());
  ASSERT_TRUE(w.add("b", StDtype::F32, {4}, std::vector<uint8_t>(16, 9)).ok());
  ASSERT_TRUE(w.write(tmp_.path("full.safetensors")).ok());
  const std::string full = read_file(tmp_.path("full.safetensors"));
  expect_error(full.substr(0, full.size() - 3), ErrorCode::InvalidArtifact, {"tensor 'b'", "past the end"});
  // Cut inside the header: the length prefix now exceeds the file.
  expect_error(full.substr(0, 20), ErrorCode::InvalidArtifact, {"runs past the end of the file"});
}

TEST_F(SafetensorsErrors, EveryTruncationFailsCleanly) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", StDtype::BF16, {3}, std::vector<uint8_t>(6, 1)).ok());
  w.set_metadata("m", "v");
  ASSERT_TRUE(w.write(tmp_.path("full.safetensors")).ok());
  const std::string full = read_file(tmp_.path("full.safetensors"));
  for (size_t n = 0; n < full.size(); ++n) {
    write_file(tmp_.path("cut.safetensors"), full.substr(0, n));
    Result<SafetensorsFile> f = SafetensorsFile::open(tmp_.path("cut.safetensors"));
    ASSERT_FALSE(f.ok()) << "opened a file cut to " << n << " of " << full.size() << " bytes";
    EXPECT_EQ(f.status().code(), ErrorCode::InvalidArtifact) << f.status().to_string();
  }
}

TEST_F(SafetensorsErrors, ByteFlipsNeverCrash) {
  // Corrupt each header byte in turn: every result must be a clean success or a clean error.
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", StDtype::F16, {2, 2}, std::vector<uint8_t>(8, 1)).ok());
  ASSERT_TRUE(w.add("b", StDtype::I64, {1}, std::vector<uint8_t>(8, 2)).ok());
  ASSERT_TRUE(w.write(tmp_.path("full.safetensors")).ok());
  const std::string full = read_file(tmp_.path("full.safetensors"));
  for (size_t i = 0; i < full.size() - 16; ++i) {
    for (char replacement : {'9', '\0', '"', '-'}) {
      std::string bad = full;
      bad[i] = replacement;
      write_file(tmp_.path("flip.safetensors"), bad);
      Result<SafetensorsFile> f = SafetensorsFile::open(tmp_.path("flip.safetensors"));
      if (!f.ok()) continue;
      for (const SafeTensorInfo& t : f->tensors()) {
        EXPECT_LE(t.offset + t.size, full.size());
        Result<HostTensor> r = f->read_f32(t);
        (void)r;
      }
    }
  }
}

}  // namespace
}  // namespace kev
