// kev/result.h — error values for the kev public API.
//
// Every fallible call returns Status or Result<T>; the library never aborts or throws across its API.
// A Status carries a code (where the error came from) and a human message that names the offending
// value and the limit it broke, e.g. "state has 412 tokens; max_prefix is 384 (over by 28)".
//
//   kev::Result<kev::Engine> engine = kev::Engine::load("model/", {});
//   if (!engine) { std::cerr << engine.status().to_string() << "\n"; return 1; }
//   kev::Engine& e = engine.value();
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kev {

enum class ErrorCode {
  Ok = 0,
  InvalidRequest,     // the caller's request: JSON, question types, limits, option counts
  InvalidArtifact,    // model files: missing, corrupt, wrong shapes or dtypes
  TokenizerMismatch,  // tokenizer disagrees with the model's delimiter/pad ids
  Unsupported,        // valid but not implemented here (config feature, op on a backend)
  Device,             // CUDA / WebGPU runtime failures
  Io,                 // file system
  Internal,           // a broken invariant inside kev (a bug)
  Unavailable,        // overloaded right now (a full queue, a queue-wait timeout); the same call may succeed later
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status success() { return Status(); }

  bool ok() const { return code_ == ErrorCode::Ok; }
  explicit operator bool() const { return ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidRequest: <message>", or "Ok".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::Ok;
  std::string message_;
};

// Holds a T or a non-ok Status. value() on an error is a programming error (checked in debug builds).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like std::expected
  Result(Status status) : v_(std::move(status)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  Status status() const { return ok() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kev
