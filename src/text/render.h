// JSON -> Kev text (KEV_SPEC.md §4.1), and the strict JSON reader that request parsing shares.
//
//   auto value = parse_json(R"({"amount": 42.5, "tags": ["a", "b"]})");
//   if (!value) return value.status();
//   std::string text = render_json(*value);   // "amount: 42.5\ntags:\n  - a\n  - b"
//
// Contracts (docs/encoding.md lists every edge case and why):
// - parse_json keeps object insertion order, rejects duplicate keys anywhere (InvalidRequest naming the
//   key and its path) and nesting deeper than kMaxJsonDepth, and keeps the digits of integer literals
//   that do not fit in 64 bits in a binary node of subtype kBigIntegerSubtype (JSON text can never
//   produce a binary node, so the two cannot be confused).
// - render_json never fails; strings pass verbatim, so a string state renders as itself.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kev/result.h"

namespace kev {

inline constexpr int kMaxJsonDepth = 512;
inline constexpr std::uint64_t kBigIntegerSubtype = 0x4B;  // 'K': an integer literal's digits

// Parses exactly one JSON value (trailing content is an error). Errors are InvalidRequest with the
// parser's line/column or the path of the offending key ("questions.b.criteria").
Result<nlohmann::ordered_json> parse_json(std::string_view text);

// The Kev text of a JSON value: scalars as Python's str() (None -> "", True/False, float repr), objects
// as "key: value" lines, arrays as "- " items, nested blocks indented by two spaces.
std::string render_json(const nlohmann::ordered_json& value);

// Python's repr(float): shortest round-trip digits; scientific when the exponent is < -4 or >= 16
// ("1e-05", "1e+16"), otherwise positional with at least one fractional digit ("1.0").
std::string python_float_repr(double value);

// The JSON type of a value as a request's error messages name it ("object", "number", ...).
const char* json_type_name(const nlohmann::ordered_json& value);

}  // namespace kev
