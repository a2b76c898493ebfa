// HF tokenizer.json byte-level BPE (the Qwen kind): NFC normalizer (utf8proc), Split pre-tokenizer with
// the file's own regex (PCRE2, Unicode properties), ByteLevel byte<->unicode map, merges by rank, added
// tokens split out of raw text before BPE. No BOS/EOS, no post-processor, no chat template.
// Thread-safety: a loaded Tokenizer is immutable; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kev/result.h"

namespace kev {

class Tokenizer {
 public:
  // Reads and validates a tokenizer.json. Unsupported model/normalizer/pre-tokenizer kinds are
  // Unsupported errors naming the component; malformed files are InvalidArtifact.
  static Result<Tokenizer> load(const std::string& path);
  static Result<Tokenizer> from_json(std::string_view json_text);

  // Token ids of `text` exactly as HF `tokenizers` gives for encode(text, add_special_tokens=False).
  // Fails (InvalidRequest) only for text that is not valid UTF-8.
  Result<std::vector<int32_t>> encode(std::string_view text) const;
  // The text of `ids` (ByteLevel decoding; added tokens by content). Unknown ids are InvalidRequest.
  Result<std::string> decode(std::span<const int32_t> ids) const;

  // Id of a vocabulary entry or added token by its exact text, if present.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id (vocab and added tokens).
  int32_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kev
