// Kev encoder (KEV_SPEC.md §3, §4.2–4.5): delimiter ids, escaping, option texts, and the token layout
// of the state and of each question row with the offsets the pointer head reads.
//
//   KEV_ASSIGN_OR_RETURN(SpecialIds ids, resolve_special_ids(tokenizer));
//   KEV_TRY(check_special_ids(ids, model_ids));
//   Encoder encoder(tokenizer, ids, limits);
//   KEV_ASSIGN_OR_RETURN(EncodedState state, encoder.encode_state(text, /*truncate=*/false));
//   KEV_ASSIGN_OR_RETURN(EncodedRow row, encoder.encode_question(question, state.tokens.size()));
//
// Layout: S = [state] + tok(esc(state)); row = [question] + tok(esc(instr)) + per option
// ([open] + tok(esc(option)) + [close]) + [decide]. Every row is a continuation of S alone: row token t
// sits at position Ls + t (Ls = |S|), whichever other rows run in the same pass. Offsets in EncodedRow
// are row-relative; add Ls for the absolute position.
// Thread-safety: an Encoder is immutable after construction; its methods may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kev/kev.h"
#include "kev/result.h"
#include "text/tokenizer.h"

namespace kev {

// Token ids of the delimiters, by role.
struct SpecialIds {
  int32_t state = -1;         // <|fim_prefix|>
  int32_t question = -1;      // <|fim_middle|>
  int32_t option_open = -1;   // <|box_start|>
  int32_t option_close = -1;  // <|box_end|>, read by the head
  int32_t decide = -1;        // <|fim_suffix|>, read by the head
  int32_t pad = -1;           // <|endoftext|>
};

// Encodes each delimiter name with `tokenizer`; each must give exactly one id, else TokenizerMismatch
// naming the token.
Result<SpecialIds> resolve_special_ids(const Tokenizer& tokenizer);
// TokenizerMismatch naming the first role whose ids differ, with both ids.
Status check_special_ids(const SpecialIds& tokenizer_ids, const SpecialIds& model_ids);

// Rewrites every "<|NAME|>" (NAME in [A-Za-z0-9_]+) to "<¦NAME¦>" (U+00A6) so that user text cannot
// forge a delimiter. Other text, including other added tokens such as "<tool_call>", is untouched.
std::string escape_control_tokens(std::string_view text);

// Option texts in order (§4.2): noul "no[: false]", "yes[: true]"; choice "name[: description]";
// score each level's description.
std::vector<std::string> option_texts(const Question& question);
// Answer keys in the same order: noul "false", "true"; choice the names; score "0".."L-1".
std::vector<std::string> option_keys(const Question& question);

struct EncodedState {
  std::vector<int32_t> tokens;  // [state] + tok(esc(text)), possibly cut to max_prefix
  int64_t original_length = 0;  // tokens before any truncation, the delimiter included
  bool truncated = false;
};

struct EncodedRow {
  std::vector<int32_t> tokens;         // the row B_k, without the state
  std::vector<int32_t> close_offsets;  // row offset of each option's close delimiter, option order
  int32_t decide_offset = 0;           // row offset of the decide delimiter = tokens.size() - 1
};

class Encoder {
 public:
  // Keeps its own handle on the tokenizer (a Tokenizer shares its immutable tables).
  Encoder(const Tokenizer& tokenizer, SpecialIds ids, Limits limits);

  // Strict: more than limits.max_prefix tokens is InvalidRequest naming the count, the limit and the
  // excess. With `truncate`, keeps the delimiter and the first max_prefix - 1 text tokens.
  Result<EncodedState> encode_state(std::string_view text, bool truncate) const;
  // InvalidRequest when the question has 0 or more than limits.max_options options, or when
  // state_len + the row length exceeds limits.max_context (rows are never truncated).
  Result<EncodedRow> encode_question(const Question& question, int64_t state_len) const;

  const SpecialIds& special_ids() const { return ids_; }
  const Limits& limits() const { return limits_; }

 private:
  Result<std::vector<int32_t>> tokenize(std::string_view text, std::string_view what) const;

  Tokenizer tokenizer_;
  SpecialIds ids_;
  Limits limits_;
};

}  // namespace kev
