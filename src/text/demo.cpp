#include "text/demo.h"

#include <cstdint>
#include <span>
#include <sstream>

namespace kev {
namespace {

// "151659 '<|fim_prefix|>'": the id, and its text when a tokenizer is given (the tokenizer decodes a
// byte-level piece of a multi-byte character as U+FFFD). Line breaks and tabs print escaped so that
// each block stays on its lines.
void write_tokens(std::ostringstream& os, const std::vector<int32_t>& tokens, const Tokenizer* tokenizer) {
  os << "  tokens:";
  for (const int32_t id : tokens) {
    os << ' ' << id;
    if (tokenizer == nullptr) continue;
    const Result<std::string> text = tokenizer->decode(std::span<const int32_t>(&id, 1));
    if (!text.ok()) continue;
    os << " '";
    for (const char c : *text) {
      if (c == '\n') {
        os << "\\n";
      } else if (c == '\t') {
        os << "\\t";
      } else if (c == '\r') {
        os << "\\r";
      } else {
        os << c;
      }
    }
    os << "'";
  }
  os << '\n';
}

}  // namespace

Request default_demo_request() {
  Request request;
  request.state_text = kDemoStateText;
  request.questions = {
      {"department", Choice{"Which team should handle this ticket?",
                            {{"billing", "Payments, invoices, and refunds"},
                             {"technical", "Bugs, outages, and integrations"},
                             {"sales", "Pricing, upgrades, and new accounts"}}}},
      {"refund_requested", Noul{"Does the customer explicitly ask for a refund?", "", ""}},
      {"duplicate_charge", Noul{"Was the customer charged more than once?", "", ""}},
  };
  return request;
}

std::string format_encoding(const EncodedState& state, const std::vector<EncodedRow>& rows,
                            const std::vector<std::string>& question_ids, const Tokenizer* tokenizer) {
  std::ostringstream os;
  const auto ls = static_cast<int64_t>(state.tokens.size());
  os << "state: " << ls << " tokens, positions 0.." << ls - 1;
  if (state.truncated) os << " (truncated from " << state.original_length << ")";
  os << '\n';
  write_tokens(os, state.tokens, tokenizer);

  int64_t input_tokens = ls;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const EncodedRow& row = rows[k];
    const auto len = static_cast<int64_t>(row.tokens.size());
    input_tokens += len;
    os << "question ";
    if (k < question_ids.size()) {
      os << question_ids[k];
    } else {
      os << '#' << k;
    }
    os << ": " << len << " tokens, positions " << ls << ".." << ls + len - 1 << '\n';
    write_tokens(os, row.tokens, tokenizer);
    os << "  close offsets:";
    for (const int32_t c : row.close_offsets) os << ' ' << c;
    os << " (absolute";
    for (const int32_t c : row.close_offsets) os << ' ' << ls + c;
    os << ")\n  decide offset: " << row.decide_offset << " (absolute " << ls + row.decide_offset << ")\n";
  }
  os << "input_tokens: " << input_tokens << '\n';
  return os.str();
}

}  // namespace kev
