// Internal helpers that keep error handling flat: KEV_TRY, KEV_ASSIGN_OR_RETURN, KEV_CHECK, and cat()
// for building messages. Not part of the public API.
#pragma once

#include <sstream>
#include <string>

#include "kev/result.h"

namespace kev {

// Concatenates anything streamable: cat("state has ", n, " tokens").
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

inline const Status& status_of(const Status& s) { return s; }
template <class T>
Status status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace kev

#define KEV_CONCAT_INNER_(a, b) a##b
#define KEV_CONCAT_(a, b) KEV_CONCAT_INNER_(a, b)

// Returns the Status of `expr` (a Status or a Result) from the enclosing function when it is not ok.
#define KEV_TRY(expr)                                               \
  do {                                                              \
    auto&& kev_try_value_ = (expr);                                 \
    if (!kev_try_value_.ok()) return ::kev::status_of(kev_try_value_); \
  } while (0)

// `KEV_ASSIGN_OR_RETURN(auto x, f())`: declares x from a Result's value or returns its Status.
#define KEV_ASSIGN_OR_RETURN(lhs, expr) KEV_ASSIGN_OR_RETURN_IMPL_(KEV_CONCAT_(kev_result_, __LINE__), lhs, expr)
#define KEV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// Returns Status(code, cat(message parts...)) when `cond` is false.
#define KEV_CHECK(cond, code, ...)                               \
  do {                                                           \
    if (!(cond)) return ::kev::Status((code), ::kev::cat(__VA_ARGS__)); \
  } while (0)
