#include "text/render.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kev/kev.h"

namespace kev {
namespace {

using Json = nlohmann::ordered_json;

// Builds an ordered_json like nlohmann's own DOM parser, plus what that parser cannot do: refuse
// duplicate keys (it would silently keep one value) and keep the digits of integer literals that
// overflow 64 bits (it would turn them into doubles and lose digits).
class StrictDomBuilder final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool value) override { return put(Json(value)); }
  bool number_integer(number_integer_t value) override { return put(Json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return put(Json(value)); }
  bool number_float(number_float_t value, const string_t& lexeme) override {
    if (lexeme.find_first_of(".eE") == string_t::npos) {
      return put(Json::binary(std::vector<std::uint8_t>(lexeme.begin(), lexeme.end()), kBigIntegerSubtype));
    }
    return put(Json(value));
  }
  bool string(string_t& value) override { return put(Json(std::move(value))); }
  bool binary(binary_t& value) override { return put(Json::binary(std::move(value))); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& name) override {
    Frame& frame = frames_.back();
    if (!frame.keys.insert(name).second) {
      error_ = cat("duplicate key \"", name, "\" in ", where(), "; keys must be unique");
      return false;
    }
    frame.pending_key = std::move(name);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    // what() reads "[json.exception.parse_error.101] parse error at line 1, column 9: ..."; the bracket
    // tag means nothing to a client.
    std::string message = ex.what();
    if (const auto end = message.find("] "); message.starts_with("[json.exception.") && end != std::string::npos) {
      message.erase(0, end + 2);
    }
    error_ = cat("malformed JSON: ", message);
    return false;
  }

  Json take_root() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    Json* node;
    std::string path;  // "questions.b.criteria"; "" for the root
    std::string pending_key;
    std::unordered_set<std::string> keys;
    std::size_t index = 0;  // next array element
  };

  std::string where() const {
    return frames_.back().path.empty() ? std::string("the top-level object") : frames_.back().path;
  }

  std::string child_path() {
    Frame& frame = frames_.back();
    const std::string prefix = frame.path;
    if (frame.node->is_array()) return cat(prefix, "[", frame.index++, "]");
    return prefix.empty() ? frame.pending_key : cat(prefix, ".", frame.pending_key);
  }

  // Inserts `value` where the parser is; returns the stored node.
  Json* insert(Json value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *frames_.back().node;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    return &(parent[frames_.back().pending_key] = std::move(value));
  }

  bool put(Json value) {
    if (!frames_.empty() && frames_.back().node->is_array()) ++frames_.back().index;
    insert(std::move(value));
    return true;
  }

  bool open(Json container) {
    if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) {
      error_ = cat("JSON nesting is deeper than ", kMaxJsonDepth, " levels");
      return false;
    }
    std::string path = frames_.empty() ? std::string() : child_path();
    // Children of this container are only added while it is the innermost frame, so the pointer
    // stays valid until close() even though parents store elements in vectors.
    Json* node = insert(std::move(container));
    frames_.push_back(Frame{node, std::move(path), {}, {}});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  Json root_;
  std::vector<Frame> frames_;
  std::string error_;
};

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool is_python_space(utf8proc_int32_t cp) {
  const utf8proc_property_t* prop = utf8proc_get_property(cp);
  return prop->category == UTF8PROC_CATEGORY_ZS || prop->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         prop->bidi_class == UTF8PROC_BIDI_CLASS_B || prop->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

// Python's str.lstrip(): drops all leading whitespace, newlines included.
std::string_view lstrip(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                    static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0 || !is_python_space(cp)) break;
    i += static_cast<std::size_t>(n);
  }
  return text.substr(i);
}

std::string render_scalar(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "";
    case Json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(value.get<std::int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(value.get<std::uint64_t>());
    case Json::value_t::number_float:
      return python_float_repr(value.get<double>());
    case Json::value_t::string:
      return value.get_ref<const std::string&>();
    case Json::value_t::binary: {
      const auto& bytes = value.get_binary();
      return std::string(bytes.begin(), bytes.end());
    }
    default:
      return "";
  }
}

bool is_container(const Json& value) { return value.is_object() || value.is_array(); }

// Mirrors the recursive upstream renderer: each level prefixes only its own lines, so the continuation
// lines of a multi-line string are not re-indented.
void render_into(const Json& value, int depth, std::string& out) {
  const std::string pad(static_cast<std::size_t>(depth) * 2, ' ');
  bool first = true;
  auto new_line = [&] {
    if (!first) out += '\n';
    first = false;
  };
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      new_line();
      out += pad;
      out += key;
      out += ':';
      if (!is_container(item)) {
        out += ' ';
        out += render_scalar(item);
      } else if (!item.empty()) {
        out += '\n';
        render_into(item, depth + 1, out);
      }
    }
  } else if (value.is_array()) {
    for (const Json& item : value) {
      new_line();
      out += pad;
      out += '-';
      if (is_container(item) && item.empty()) continue;
      std::string nested;
      render_into(item, depth + 1, nested);
      out += ' ';
      out += lstrip(nested);
    }
  } else {
    out += pad;
    out += render_scalar(value);
  }
}

}  // namespace

Result<nlohmann::ordered_json> parse_json(std::string_view text) {
  StrictDomBuilder builder;
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const std::exception& ex) {
    return Status(ErrorCode::InvalidRequest, cat("malformed JSON: ", ex.what()));
  }
  if (!ok) return Status(ErrorCode::InvalidRequest, builder.error());
  return builder.take_root();
}

std::string render_json(const nlohmann::ordered_json& value) {
  std::string out;
  render_into(value, 0, out);
  return out;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in the form [-]d[.ddd]e[+-]dd.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  const std::size_t e_pos = sci.find('e');
  std::string_view mantissa = sci.substr(0, e_pos);
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + (sci[e_pos + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);

  std::string out;
  if (mantissa.front() == '-') {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }

  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += exponent < 0 ? "e-" : "e+";
    const int magnitude = std::abs(exponent);
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
    return out;
  }
  if (exponent < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exponent - 1), '0');
    out += digits;
    return out;
  }
  const auto int_len = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= int_len) {
    out += digits;
    out.append(int_len - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, int_len);
    out += '.';
    out.append(digits, int_len);
  }
  return out;
}

const char* json_type_name(const nlohmann::ordered_json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::binary:  // a big integer literal (see parse_json)
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "number";
    default:
      return "unknown";
  }
}

Result<std::string> render_json_text(std::string_view json_value) {
  KEV_ASSIGN_OR_RETURN(auto value, parse_json(json_value));
  return render_json(value);
}

}  // namespace kev
