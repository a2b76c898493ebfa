#include "io/json_util.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/check.h"

namespace kev {
namespace {

Status missing(std::string_view key, std::string_view context) {
  return Status(ErrorCode::InvalidArtifact, cat(context, ": missing field '", key, "'"));
}

Status wrong_type(std::string_view key, std::string_view context, std::string_view want,
                  const nlohmann::json& got) {
  return Status(ErrorCode::InvalidArtifact,
                cat(context, ": field '", key, "' must be ", want, ", got ", json_excerpt(got)));
}

const nlohmann::json* field(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

}  // namespace

Result<nlohmann::json> parse_json(std::string_view text, std::string_view what) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Status(ErrorCode::InvalidArtifact,
                  cat(what, " is not valid JSON (at byte ", e.byte, " of ", text.size(), "): ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    return Status(ErrorCode::InvalidArtifact, cat(what, " is not valid JSON: ", e.what()));
  }
}

Result<std::string> read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status(ErrorCode::Io, cat("'", path, "' is a directory, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return Status(ErrorCode::Io, cat("cannot open '", path, "': ", std::strerror(err)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Status(ErrorCode::Io, cat("error reading '", path, "'"));
  return buffer.str();
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  KEV_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_json(text, cat("'", path, "'"));
}

std::string json_excerpt(const nlohmann::json& value) {
  constexpr size_t kMax = 60;
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

bool json_has(const nlohmann::json& obj, std::string_view key) { return field(obj, key) != nullptr; }

Result<int64_t> json_int(const nlohmann::json& obj, std::string_view key, std::string_view context) {
  const nlohmann::json* v = field(obj, key);
  if (v == nullptr) return missing(key, context);
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return wrong_type(key, context, "an integer below 2^63", *v);
    }
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  return wrong_type(key, context, "an integer", *v);
}

Result<double> json_number(const nlohmann::json& obj, std::string_view key, std::string_view context) {
  const nlohmann::json* v = field(obj, key);
  if (v == nullptr) return missing(key, context);
  if (!v->is_number()) return wrong_type(key, context, "a number", *v);
  return v->get<double>();
}

Result<bool> json_bool(const nlohmann::json& obj, std::string_view key, std::string_view context) {
  const nlohmann::json* v = field(obj, key);
  if (v == nullptr) return missing(key, context);
  if (!v->is_boolean()) return wrong_type(key, context, "true or false", *v);
  return v->get<bool>();
}

Result<std::string> json_string(const nlohmann::json& obj, std::string_view key, std::string_view context) {
  const nlohmann::json* v = field(obj, key);
  if (v == nullptr) return missing(key, context);
  if (!v->is_string()) return wrong_type(key, context, "a string", *v);
  return v->get<std::string>();
}

}  // namespace kev
