#include "text/encode.h"

#include <array>
#include <limits>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/check.h"

namespace kev {
namespace {

struct SpecialToken {
  const char* role;
  std::string_view name;
  int32_t SpecialIds::*id;
};

constexpr std::array<SpecialToken, 6> kSpecialTokens = {{
    {"state", "<|fim_prefix|>", &SpecialIds::state},
    {"question", "<|fim_middle|>", &SpecialIds::question},
    {"option open", "<|box_start|>", &SpecialIds::option_open},
    {"option close", "<|box_end|>", &SpecialIds::option_close},
    {"decide", "<|fim_suffix|>", &SpecialIds::decide},
    {"pad", "<|endoftext|>", &SpecialIds::pad},
}};

constexpr std::string_view kBrokenBar = "\xC2\xA6";  // U+00A6

bool is_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

std::string with_description(const std::string& head, const std::string& description) {
  return description.empty() ? head : head + ": " + description;
}

}  // namespace

Result<SpecialIds> resolve_special_ids(const Tokenizer& tokenizer) {
  SpecialIds ids;
  for (const SpecialToken& token : kSpecialTokens) {
    KEV_ASSIGN_OR_RETURN(const std::vector<int32_t> encoded, tokenizer.encode(token.name));
    KEV_CHECK(encoded.size() == 1, ErrorCode::TokenizerMismatch, "delimiter ", token.name, " (", token.role,
              ") encodes to ", encoded.size(), " tokens with this tokenizer; it must be exactly one");
    ids.*token.id = encoded[0];
  }
  return ids;
}

Status check_special_ids(const SpecialIds& tokenizer_ids, const SpecialIds& model_ids) {
  for (const SpecialToken& token : kSpecialTokens) {
    KEV_CHECK(tokenizer_ids.*token.id == model_ids.*token.id, ErrorCode::TokenizerMismatch, "the ", token.role,
              " delimiter ", token.name, " is id ", tokenizer_ids.*token.id, " in the tokenizer but the model records ",
              model_ids.*token.id);
  }
  return Status::success();
}

std::string escape_control_tokens(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 2, "<|") == 0) {
      std::size_t j = i + 2;
      while (j < text.size() && is_name_char(text[j])) ++j;
      if (j > i + 2 && text.compare(j, 2, "|>") == 0) {
        out += '<';
        out += kBrokenBar;
        out.append(text.substr(i + 2, j - i - 2));
        out += kBrokenBar;
        out += '>';
        i = j + 2;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

std::vector<std::string> option_texts(const Question& question) {
  return std::visit(
      [](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        std::vector<std::string> texts;
        if constexpr (std::is_same_v<T, Noul>) {
          texts = {with_description("no", body.if_false), with_description("yes", body.if_true)};
        } else if constexpr (std::is_same_v<T, Choice>) {
          for (const auto& [name, description] : body.options) texts.push_back(with_description(name, description));
        } else {
          texts = body.levels;
        }
        return texts;
      },
      question.body);
}

std::vector<std::string> option_keys(const Question& question) {
  return std::visit(
      [](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        std::vector<std::string> keys;
        if constexpr (std::is_same_v<T, Noul>) {
          keys = {"false", "true"};
        } else if constexpr (std::is_same_v<T, Choice>) {
          for (const auto& option : body.options) keys.push_back(option.first);
        } else {
          for (std::size_t i = 0; i < body.levels.size(); ++i) keys.push_back(std::to_string(i));
        }
        return keys;
      },
      question.body);
}

Encoder::Encoder(const Tokenizer& tokenizer, SpecialIds ids, Limits limits)
    : tokenizer_(tokenizer), ids_(ids), limits_(limits) {}

Result<std::vector<int32_t>> Encoder::tokenize(std::string_view text, std::string_view what) const {
  Result<std::vector<int32_t>> ids = tokenizer_.encode(escape_control_tokens(text));
  if (!ids.ok()) return Status(ids.status().code(), cat(what, ": ", ids.status().message()));
  return ids;
}

Result<EncodedState> Encoder::encode_state(std::string_view text, bool truncate) const {
  KEV_ASSIGN_OR_RETURN(const std::vector<int32_t> body, tokenize(text, "state"));
  EncodedState state;
  state.tokens.reserve(body.size() + 1);
  state.tokens.push_back(ids_.state);
  state.tokens.insert(state.tokens.end(), body.begin(), body.end());
  state.original_length = static_cast<int64_t>(state.tokens.size());
  if (state.original_length > limits_.max_prefix) {
    KEV_CHECK(truncate && limits_.max_prefix >= 1, ErrorCode::InvalidRequest, "state has ", state.original_length,
              " tokens including the state delimiter; max_prefix is ", limits_.max_prefix, " (over by ",
              state.original_length - limits_.max_prefix, ")");
    state.tokens.resize(static_cast<std::size_t>(limits_.max_prefix));
    state.truncated = true;
  }
  return state;
}

Result<EncodedRow> Encoder::encode_question(const Question& question, int64_t state_len) const {
  const std::vector<std::string> options = option_texts(question);
  const auto n_options = static_cast<int64_t>(options.size());
  KEV_CHECK(n_options >= 1, ErrorCode::InvalidRequest, "question \"", question.id,
            "\" has no options; at least one is required");
  KEV_CHECK(n_options <= limits_.max_options, ErrorCode::InvalidRequest, "question \"", question.id, "\" has ",
            n_options, " options; max_options is ", limits_.max_options, " (over by ", n_options - limits_.max_options,
            ")");

  const std::string& instructions =
      std::visit([](const auto& body) -> const std::string& { return body.instructions; }, question.body);
  EncodedRow row;
  row.tokens.push_back(ids_.question);
  KEV_ASSIGN_OR_RETURN(const std::vector<int32_t> instr,
                       tokenize(instructions, cat("question \"", question.id, "\" instructions")));
  row.tokens.insert(row.tokens.end(), instr.begin(), instr.end());
  for (std::size_t j = 0; j < options.size(); ++j) {
    KEV_ASSIGN_OR_RETURN(const std::vector<int32_t> option,
                         tokenize(options[j], cat("question \"", question.id, "\" option ", j)));
    row.tokens.push_back(ids_.option_open);
    row.tokens.insert(row.tokens.end(), option.begin(), option.end());
    row.close_offsets.push_back(static_cast<int32_t>(row.tokens.size()));
    row.tokens.push_back(ids_.option_close);
  }
  row.tokens.push_back(ids_.decide);

  const auto row_len = static_cast<int64_t>(row.tokens.size());
  const int64_t total = state_len + row_len;
  KEV_CHECK(total <= limits_.max_context, ErrorCode::InvalidRequest, "question \"", question.id, "\": state (",
            state_len, " tokens) + row (", row_len, " tokens) = ", total, " tokens; max_context is ",
            limits_.max_context, " (over by ", total - limits_.max_context, ")");
  // Offsets are int32 (as the head's index tensors are); a row that fits max_context but not int32 would
  // need a limit above 2^31 tokens.
  KEV_CHECK(row_len <= std::numeric_limits<int32_t>::max(), ErrorCode::InvalidRequest, "question \"", question.id,
            "\" row has ", row_len, " tokens; rows are limited to 2^31 - 1");
  row.decide_offset = static_cast<int32_t>(row_len - 1);
  return row;
}

}  // namespace kev
