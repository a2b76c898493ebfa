// Reading JSON files and typed fields with errors that name the file, the field and the value,
// converting nlohmann::json exceptions into Status so nothing throws past this module.
//
//   KEV_ASSIGN_OR_RETURN(nlohmann::json cfg, kev::read_json_file("config.json"));
//   KEV_ASSIGN_OR_RETURN(int64_t d, kev::json_int(cfg, "hidden_size", "config.json"));
//
// Contracts: read_json_file() returns Io when the file cannot be read and InvalidArtifact when it is
// not well-formed JSON (with the byte offset of the error). The json_* getters return InvalidArtifact
// naming `context` + "." + key for a missing key, a wrong type or (for json_int) a non-integer or
// out-of-range number; `context` is free text such as a file name or "config.json text_config".
// Callers pass an object; a non-object `obj` is reported like a missing key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kev/result.h"

namespace kev {

// Parses `text`; `what` names the source in errors ("config.json", "safetensors header of 'x'").
Result<nlohmann::json> parse_json(std::string_view text, std::string_view what);
Result<nlohmann::json> read_json_file(const std::string& path);
Result<std::string> read_text_file(const std::string& path);

// A short rendering of a JSON value for error messages (truncated past ~60 characters).
std::string json_excerpt(const nlohmann::json& value);

bool json_has(const nlohmann::json& obj, std::string_view key);
Result<int64_t> json_int(const nlohmann::json& obj, std::string_view key, std::string_view context);
Result<double> json_number(const nlohmann::json& obj, std::string_view key, std::string_view context);
Result<bool> json_bool(const nlohmann::json& obj, std::string_view key, std::string_view context);
Result<std::string> json_string(const nlohmann::json& obj, std::string_view key, std::string_view context);

}  // namespace kev
