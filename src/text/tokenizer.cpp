// HF tokenizer.json byte-level BPE. The pipeline follows HF `tokenizers` (Rust) step by step, because
// ids must match it exactly:
//   1. added tokens whose `normalized` is false are split out of the raw text (leftmost-longest, with
//      the single_word / lstrip / rstrip rules of AddedVocabulary::find_matches);
//   2. every other piece is normalized (NFC), then tokens with `normalized` true are split out of it;
//   3. the remaining pieces go through the pre-tokenizer steps (Split regexes run by PCRE2 with their
//      character classes aligned to HF's Oniguruma, then ByteLevel);
//   4. each word is BPE-merged on its bytes, lowest merge rank first, leftmost on ties.
// See docs/tokenizer.md for what is supported and how it was verified.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "common/check.h"

namespace kev {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------
// UTF-8 and Unicode classes

// Offset of the first byte that does not begin a valid UTF-8 sequence (overlongs and surrogates are
// invalid), or npos.
size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

// Decodes the code point at s[i] (s is valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  i += n > 0 ? static_cast<size_t>(n) : 1;
  return static_cast<char32_t>(cp);
}

char32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return next_code_point(s, i);
}

void append_code_point(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Unicode White_Space, which is what `\s` means in the Rust `regex` crate that HF uses for lstrip/rstrip.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// `\w` of the Rust `regex` crate (Alphabetic, Mark, Nd, Pc, Join_Control), used by HF for single_word.
// utf8proc has no Alphabetic property; letters, Nl and marks cover it except the Other_Alphabetic
// symbols listed explicitly (circled and squared Latin letters).
bool is_word_char(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      break;
  }
  return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
         (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

// NFC of valid UTF-8. Text whose bytes are all below 0xCC has only code points below U+0300, which are
// NFC already (no combining marks, no singletons), so it skips utf8proc.
Result<std::string> nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0xCC; })) {
    return std::string(s);
  }
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    return Status(ErrorCode::InvalidRequest, cat("NFC normalization failed: ", utf8proc_errmsg(n)));
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

// Replaces each maximal invalid UTF-8 subpart with U+FFFD, as Rust's String::from_utf8_lossy does (HF
// decodes byte-level tokens that way, so a lone byte of a multi-byte character becomes U+FFFD).
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    size_t good = 0;  // continuation bytes that still fit a valid sequence
    while (good < need && i + 1 + good < s.size()) {
      const auto b = static_cast<unsigned char>(s[i + 1 + good]);
      const bool ok = good == 0 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++good;
    }
    if (need > 0 && good == need) {
      out.append(s.substr(i, need + 1));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += 1 + good;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// ByteLevel: GPT-2's reversible byte <-> printable code point map.

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_text;  // UTF-8 of the code point standing for each byte
  std::array<int16_t, 324> code_point_to_byte;  // -1 where the code point stands for no byte
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.code_point_to_byte.fill(-1);
    char32_t next_free = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_free++;
      append_code_point(t.byte_to_text[b], cp);
      t.code_point_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

std::string byte_level_encode(std::string_view bytes) {
  const auto& t = byte_level_tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) out += t.byte_to_text[static_cast<unsigned char>(ch)];
  return out;
}

// HF's ByteLevel decoder: a token whose every code point stands for a byte becomes those bytes; any
// other token (e.g. an added token with a space) is kept as its own UTF-8.
void byte_level_decode_append(std::string_view token, std::string& out) {
  const auto& t = byte_level_tables();
  const size_t start = out.size();
  size_t i = 0;
  while (i < token.size()) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= t.code_point_to_byte.size() || t.code_point_to_byte[cp] < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(t.code_point_to_byte[cp]));
  }
}

// ---------------------------------------------------------------------------------------------------
// PCRE2 regex with Oniguruma-style match iteration (HF compiles Split patterns with Oniguruma).

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// HF compiles Split patterns with Oniguruma, whose Unicode data (16.0 in tokenizers 0.23) is newer than
// PCRE2 10.42's (14.0), and whose \s is Unicode White_Space where PCRE2's also takes U+180E. Comparing
// every code point (reference/tokenizer/hf_regex_classes.mjs, checked by tokenizer_test.cpp) leaves
// exactly these differences: the letters and numbers below, which PCRE2 10.42 thinks unassigned, and
// U+180E. So \p{L}, \p{N}, \s and \S (outside brackets) are widened or narrowed to Oniguruma's sets;
// a newer PCRE2 already holds the extra code points, which is harmless.
constexpr std::string_view kExtraLetters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E})"
    R"(\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10})"
    R"(\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D})"
    R"(\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D})"
    R"(\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view kExtraNumbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59}\x{16130}-\x{16139})"
    R"(\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";
constexpr std::string_view kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites the class escapes of `pattern` as described above. Inside brackets a set is spliced in
// without brackets; \S inside brackets stays as it is (it differs from Oniguruma at U+180E only).
std::string align_with_oniguruma(std::string_view pattern) {
  const std::string letters = cat("\\p{L}", kExtraLetters), numbers = cat("\\p{N}", kExtraNumbers);
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string_view rest = pattern.substr(i);
    if (rest.starts_with("\\Q")) {  // \Q...\E quotes its text literally
      const size_t end = rest.find("\\E");
      const size_t n = end == std::string_view::npos ? rest.size() : end + 2;
      out.append(rest.substr(0, n));
      i += n - 1;
    } else if (rest.starts_with("\\p{L}") || rest.starts_with("\\p{N}")) {
      const std::string& set = rest[3] == 'L' ? letters : numbers;
      out += in_class ? set : cat("[", set, "]");
      i += 4;
    } else if (rest.starts_with("\\s")) {
      out += in_class ? std::string(kWhiteSpace) : cat("[", kWhiteSpace, "]");
      i += 1;
    } else if (rest.starts_with("\\S") && !in_class) {
      out += cat("[^", kWhiteSpace, "]");
      i += 1;
    } else if (rest[0] == '\\' && rest.size() > 1) {
      out.append(rest.substr(0, 2));
      i += 1;
    } else if (in_class && rest.starts_with("[:")) {  // a POSIX class such as [:alpha:]
      const size_t end = rest.find(":]");
      const size_t n = end == std::string_view::npos ? 1 : end + 2;
      out.append(rest.substr(0, n));
      i += n - 1;
    } else if (!in_class && rest[0] == '[') {
      // "]" right after "[" or "[^" is a literal member, not the end of the class.
      const size_t n = rest.starts_with("[^]") ? 3 : rest.starts_with("[]") ? 2 : rest.starts_with("[^") ? 2 : 1;
      out.append(rest.substr(0, n));
      i += n - 1;
      in_class = true;
    } else {
      if (in_class && rest[0] == ']') in_class = false;
      out += rest[0];
    }
  }
  return out;
}

class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern, bool literal, const std::string& what) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // PCRE2 refuses PCRE2_UCP together with PCRE2_LITERAL, and a literal has no classes to widen anyway.
    const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    const auto compile = [&](const std::string& source) {
      return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &error, &offset,
                           nullptr);
    };
    pcre2_code* code = compile(literal ? pattern : align_with_oniguruma(pattern));
    if (code == nullptr) {
      // Report the error against the file's own pattern, whose offsets the reader can look up.
      pcre2_code* original = compile(pattern);
      KEV_CHECK(original != nullptr, ErrorCode::InvalidArtifact, what, " regex does not compile at offset ", offset,
                ": ", pcre2_message(error));
      pcre2_code_free(original);
      return Status(ErrorCode::Internal, cat(what, " regex stops compiling once its classes are aligned with "
                                                   "Oniguruma: ", pcre2_message(error)));
    }
    Regex r;
    r.code_.reset(code, CodeDeleter());
    // JIT is an optimisation only: where it is unavailable or fails, pcre2_match interprets the pattern
    // and gives the same matches.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return r;
  }

  MatchData make_match_data() const {
    return MatchData(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  }

  // Calls on_match(begin, end) for each match in `text`, iterating as the onig crate's find_iter does:
  // after an empty match the next search may not return an empty match at the same place.
  template <class F>
  Status for_each_match(std::string_view text, pcre2_match_data* md, F&& on_match) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t search_from = 0;
    size_t last_match_end = std::string_view::npos;
    while (search_from <= text.size()) {
      int rc = pcre2_match(code_.get(), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(code_.get(), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      KEV_CHECK(rc > 0, ErrorCode::InvalidRequest, "pre-tokenizer regex failed on a ", text.size(),
                "-byte piece: ", pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t begin = ov[0], end = ov[1];
      if (begin == end && end == last_match_end) {
        if (search_from >= text.size()) break;
        next_code_point(text, search_from);
        continue;
      }
      on_match(begin, end);
      search_from = end;
      last_match_end = end;
    }
    return Status::success();
  }

  // HF SplitDelimiterBehavior::Isolated: matches and the gaps between them, empty pieces dropped.
  template <class F>
  Status split_isolated(std::string_view text, pcre2_match_data* md, F&& on_piece) const {
    size_t prev = 0;
    KEV_TRY(for_each_match(text, md, [&](size_t begin, size_t end) {
      if (prev < begin) on_piece(text.substr(prev, begin - prev));
      if (begin < end) on_piece(text.substr(begin, end - begin));
      prev = end;
    }));
    if (prev < text.size()) on_piece(text.substr(prev));
    return Status::success();
  }

 private:
  std::shared_ptr<pcre2_code> code_;
};

// ---------------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Leftmost-longest matching over a small set of patterns (HF uses Aho-Corasick LeftmostLongest; the
// Qwen files have ~30 added tokens, so candidates bucketed by first byte are enough).
class AddedMatcher {
 public:
  void add(std::string pattern, size_t token_index) {
    if (pattern.empty()) return;
    const auto first = static_cast<unsigned char>(pattern[0]);
    patterns_.push_back({std::move(pattern), token_index});
    auto& bucket = by_first_byte_[first];
    bucket.push_back(patterns_.size() - 1);
    // Longest first; equal lengths keep insertion order, which decides like Aho-Corasick's pattern order.
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return patterns_[a].text.size() > patterns_[b].text.size(); });
  }
  bool empty() const { return patterns_.empty(); }

  struct Match {
    size_t begin, end, token_index;
  };
  std::optional<Match> find(std::string_view s, size_t from) const {
    for (size_t i = from; i < s.size(); ++i) {
      for (size_t p : by_first_byte_[static_cast<unsigned char>(s[i])]) {
        const std::string& text = patterns_[p].text;
        if (s.size() - i >= text.size() && std::memcmp(s.data() + i, text.data(), text.size()) == 0) {
          return Match{i, i + text.size(), patterns_[p].token_index};
        }
      }
    }
    return std::nullopt;
  }

 private:
  struct Pattern {
    std::string text;
    size_t token_index;
  };
  std::vector<Pattern> patterns_;
  std::array<std::vector<size_t>, 256> by_first_byte_;
};

// HF AddedVocabulary::find_matches: calls on_piece(piece, token) for consecutive pieces covering `s`
// (token null for text between added tokens). single_word drops a match that touches a word character;
// lstrip/rstrip make the token's piece absorb the white space beside it.
template <class F>
void split_added(std::string_view s, const AddedMatcher& matcher, const std::vector<AddedToken>& tokens,
                 F&& on_piece) {
  size_t start_offset = 0;
  size_t search_from = 0;
  while (auto m = matcher.find(s, search_from)) {
    search_from = m->end;
    const AddedToken& token = tokens[m->token_index];
    size_t start = m->begin, stop = m->end;
    if (token.single_word) {
      const bool word_before = start > 0 && is_word_char(last_code_point(s.substr(0, start)));
      size_t after = stop;
      const bool word_after = stop < s.size() && is_word_char(next_code_point(s, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t prev = new_start - 1;
        while (prev > 0 && (static_cast<unsigned char>(s[prev]) & 0xC0) == 0x80) --prev;
        size_t probe = prev;
        if (!is_white_space(next_code_point(s, probe))) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < s.size()) {
        size_t probe = stop;
        if (!is_white_space(next_code_point(s, probe))) break;
        stop = probe;
      }
    }
    if (start_offset < start) on_piece(s.substr(start_offset, start - start_offset), nullptr);
    on_piece(s.substr(start, stop - start), &token);
    start_offset = stop;
  }
  if (start_offset < s.size()) on_piece(s.substr(start_offset), nullptr);
}

// ---------------------------------------------------------------------------------------------------
// BPE model

struct Merge {
  int32_t rank;
  int32_t new_id;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// (left id, right id) -> merge, open addressing with linear probing. BPE spends most of its time in this
// lookup; std::unordered_map made encode about 2x slower on the conformance corpus.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t capacity = 16;
    shift_ = 60;
    while (capacity < 2 * n) {
      capacity *= 2;
      --shift_;
    }
    slots_.assign(capacity, Slot{kEmpty, {}});
    mask_ = capacity - 1;
  }
  // Sets the merge of a pair; a repeated pair keeps its last value, as HF's HashMap collect does.
  void set(uint64_t key, Merge merge) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& slot = slots_[probe(key)];
    if (slot.key == kEmpty) ++size_;
    slot = Slot{key, merge};
  }
  const Merge* find(uint64_t key) const {
    const Slot& slot = slots_[probe(key)];
    return slot.key == key ? &slot.merge : nullptr;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are non-negative, so no pair has this key
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  size_t probe(uint64_t key) const {
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);  // Fibonacci hashing
    while (slots_[i].key != key && slots_[i].key != kEmpty) i = (i + 1) & mask_;
    return i;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(old.size(), 8));
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != kEmpty) set(s.key, s.merge);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 60;
  size_t size_ = 0;
};

// Per-call buffers, so a const Tokenizer can encode from several threads.
struct Scratch {
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into its left neighbour
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    // std heaps are max-heaps: "less" means lower priority (higher rank, then further right).
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<MatchData> match_data;  // one per pre-tokenizer regex
};

struct BpeModel {
  std::unordered_map<std::string, int32_t> vocab;  // byte-level token text -> id
  MergeTable merges;                               // (left id, right id) -> rank, merged id
  std::array<int32_t, 256> byte_ids{};             // id of each single byte's token, -1 if absent
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;

  // Appends the ids of one pre-tokenized word, given as raw bytes (before the ByteLevel mapping).
  void tokenize(std::string_view bytes, Scratch& s, std::vector<int32_t>& out) const {
    if (bytes.empty()) return;
    if (ignore_merges) {
      const auto it = vocab.find(byte_level_encode(bytes));
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    auto& sym = s.symbols;
    sym.clear();
    bool last_was_unk = false;
    for (char ch : bytes) {
      const int32_t id = byte_ids[static_cast<unsigned char>(ch)];
      if (id < 0 && !unk_id) continue;  // HF drops characters it cannot map when there is no unk token
      if (id < 0 && fuse_unk && last_was_unk) continue;
      const auto n = static_cast<int32_t>(sym.size());
      sym.push_back({id < 0 ? *unk_id : id, n - 1, -1});
      if (n > 0) sym[n - 1].next = n;
      last_was_unk = id < 0;
    }
    auto& heap = s.heap;
    heap.clear();
    const auto push_candidate = [&](int32_t pos) {
      const int32_t next = sym[pos].next;
      if (next < 0) return;
      const Merge* m = merges.find(pair_key(sym[pos].id, sym[next].id));
      if (m == nullptr) return;
      heap.push_back({m->rank, pos, m->new_id});
      std::push_heap(heap.begin(), heap.end());
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_candidate(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Scratch::Candidate top = heap.back();
      heap.pop_back();
      Scratch::Symbol& left = sym[top.pos];
      if (left.id < 0 || left.next < 0) continue;
      // Skip candidates made stale by an earlier merge on either side.
      const Merge* m = merges.find(pair_key(left.id, sym[left.next].id));
      if (m == nullptr || m->new_id != top.new_id) continue;
      Scratch::Symbol& right = sym[left.next];
      left.id = top.new_id;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = top.pos;
      right.id = -1;
      if (left.prev >= 0) push_candidate(left.prev);
      push_candidate(top.pos);
    }
    for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }
};

// ---------------------------------------------------------------------------------------------------
// Pre-tokenizer: Split steps (Isolated), then ByteLevel.

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  std::vector<Regex> regexes;  // the Split steps, then GPT-2's regex if ByteLevel.use_regex
  size_t n_splits = 0;
  bool add_prefix_space = false;

  // Calls on_word(bytes) for each word of `piece`, in order.
  template <class F>
  Status for_each_word(std::string_view piece, Scratch& s, F&& on_word, size_t step = 0) const {
    if (step < n_splits) {
      Status inner;
      KEV_TRY(regexes[step].split_isolated(piece, s.match_data[step].get(), [&](std::string_view sub) {
        if (inner.ok()) inner = for_each_word(sub, s, on_word, step + 1);
      }));
      return inner;
    }
    std::string prefixed;
    if (add_prefix_space && (piece.empty() || piece[0] != ' ')) {
      prefixed = " ";
      prefixed.append(piece);
      piece = prefixed;
    }
    if (regexes.size() == n_splits) {
      on_word(piece);
      return Status::success();
    }
    return regexes[n_splits].split_isolated(piece, s.match_data[n_splits].get(), on_word);
  }
};

// ---------------------------------------------------------------------------------------------------
// Loading

Result<const Json*> member(const Json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  KEV_CHECK(it != obj.end(), ErrorCode::InvalidArtifact, where, ".", key, " is missing");
  return &*it;
}

bool flag(const Json& obj, const char* key, bool fallback) {
  const auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string type_of(const Json& obj) {
  const auto it = obj.find("type");
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string("(none)");
}

Status load_pre_tokenizer_step(const Json& step, const std::string& where, PreTokenizer& pre, bool& saw_byte_level) {
  const std::string type = type_of(step);
  KEV_CHECK(!saw_byte_level, ErrorCode::Unsupported, where, " is a ", type,
            " step after ByteLevel; only Split steps before one final ByteLevel are supported");
  if (type == "Sequence") {
    KEV_ASSIGN_OR_RETURN(const Json* steps, member(step, "pretokenizers", where));
    KEV_CHECK(steps->is_array(), ErrorCode::InvalidArtifact, where, ".pretokenizers is not an array");
    for (size_t i = 0; i < steps->size(); ++i) {
      KEV_TRY(load_pre_tokenizer_step((*steps)[i], cat(where, ".pretokenizers[", i, "]"), pre, saw_byte_level));
    }
    return Status::success();
  }
  if (type == "Split") {
    KEV_ASSIGN_OR_RETURN(const Json* pattern, member(step, "pattern", where));
    const std::string behavior = step.value("behavior", std::string("(none)"));
    KEV_CHECK(behavior == "Isolated", ErrorCode::Unsupported, where, ".behavior '", behavior,
              "' is not supported (only Isolated)");
    KEV_CHECK(!flag(step, "invert", false), ErrorCode::Unsupported, where, ".invert true is not supported");
    const bool literal = pattern->contains("String");
    const char* key = literal ? "String" : "Regex";
    KEV_CHECK(pattern->is_object() && pattern->contains(key) && (*pattern)[key].is_string(),
              ErrorCode::InvalidArtifact, where, ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    KEV_ASSIGN_OR_RETURN(Regex regex, Regex::compile((*pattern)[key].get<std::string>(), literal, where));
    pre.regexes.push_back(std::move(regex));
    ++pre.n_splits;
    return Status::success();
  }
  if (type == "ByteLevel") {
    saw_byte_level = true;
    pre.add_prefix_space = flag(step, "add_prefix_space", true);
    if (flag(step, "use_regex", true)) {
      KEV_ASSIGN_OR_RETURN(Regex regex, Regex::compile(kGpt2Pattern, false, "ByteLevel GPT-2"));
      pre.regexes.push_back(std::move(regex));
    }
    return Status::success();
  }
  return Status(ErrorCode::Unsupported,
                cat(where, " type '", type, "' is not supported (only Sequence, Split, ByteLevel)"));
}

Status load_model(const Json& model, BpeModel& bpe, std::vector<std::string>& id_to_token) {
  const std::string type = type_of(model);
  KEV_CHECK(type == "BPE", ErrorCode::Unsupported, "model.type '", type, "' is not supported (only BPE)");
  KEV_CHECK(!flag(model, "byte_fallback", false), ErrorCode::Unsupported, "model.byte_fallback true is not supported");
  const auto dropout = model.find("dropout");
  KEV_CHECK(dropout == model.end() || dropout->is_null() || (dropout->is_number() && dropout->get<double>() == 0.0),
            ErrorCode::Unsupported, "model.dropout ", dropout->dump(), " is not supported (only null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    KEV_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
              ErrorCode::Unsupported, "model.", key, " ", it->dump(), " is not supported (only empty)");
  }
  bpe.fuse_unk = flag(model, "fuse_unk", false);
  bpe.ignore_merges = flag(model, "ignore_merges", false);

  KEV_ASSIGN_OR_RETURN(const Json* vocab, member(model, "vocab", "model"));
  KEV_CHECK(vocab->is_object(), ErrorCode::InvalidArtifact, "model.vocab is not an object");
  bpe.vocab.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    KEV_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < (1 << 30),
              ErrorCode::InvalidArtifact, "model.vocab['", token, "'] = ", id_json.dump(),
              " is not an id in [0, 2^30)");
    const auto id = id_json.get<int32_t>();
    if (static_cast<size_t>(id) >= id_to_token.size()) id_to_token.resize(static_cast<size_t>(id) + 1);
    KEV_CHECK(id_to_token[id].empty(), ErrorCode::InvalidArtifact, "model.vocab gives id ", id, " to both '",
              id_to_token[id], "' and '", token, "'");
    id_to_token[id] = token;
    bpe.vocab.emplace(token, id);
  }
  const auto& tables = byte_level_tables();
  for (int b = 0; b < 256; ++b) {
    const auto it = bpe.vocab.find(tables.byte_to_text[b]);
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
  }
  const auto unk = model.find("unk_token");
  if (unk != model.end() && unk->is_string()) {
    const auto it = bpe.vocab.find(unk->get<std::string>());
    KEV_CHECK(it != bpe.vocab.end(), ErrorCode::InvalidArtifact, "model.unk_token '", unk->get<std::string>(),
              "' is not in the vocabulary");
    bpe.unk_id = it->second;
  }

  KEV_ASSIGN_OR_RETURN(const Json* merges, member(model, "merges", "model"));
  KEV_CHECK(merges->is_array(), ErrorCode::InvalidArtifact, "model.merges is not an array");
  bpe.merges.reserve(merges->size());
  int32_t rank = 0;
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string left, right;
    if (m.is_string()) {
      const auto& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;  // HF skips the header line of merges.txt
      const size_t space = line.find(' ');
      KEV_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                ErrorCode::InvalidArtifact, "model.merges[", i, "] '", line,
                "' is not two tokens separated by one space");
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      KEV_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), ErrorCode::InvalidArtifact,
                "model.merges[", i, "] is neither \"a b\" nor [\"a\", \"b\"]");
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    const auto a = bpe.vocab.find(left), b = bpe.vocab.find(right), merged = bpe.vocab.find(left + right);
    KEV_CHECK(a != bpe.vocab.end() && b != bpe.vocab.end() && merged != bpe.vocab.end(), ErrorCode::InvalidArtifact,
              "model.merges[", i, "] ('", left, "', '", right, "'): '",
              a == bpe.vocab.end() ? left : b == bpe.vocab.end() ? right : left + right, "' is not in the vocabulary");
    bpe.merges.set(pair_key(a->second, b->second), Merge{rank++, merged->second});
  }
  return Status::success();
}

Result<std::vector<AddedToken>> load_added_tokens(const Json& root, const BpeModel& bpe) {
  std::vector<AddedToken> tokens;
  const auto list = root.find("added_tokens");
  if (list == root.end() || list->is_null()) return tokens;
  KEV_CHECK(list->is_array(), ErrorCode::InvalidArtifact, "added_tokens is not an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& t = (*list)[i];
    KEV_CHECK(t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id") &&
                  t["id"].is_number_integer() && t["id"].get<int64_t>() >= 0 && t["id"].get<int64_t>() < (1 << 30),
              ErrorCode::InvalidArtifact, "added_tokens[", i, "] needs a string content and an id in [0, 2^30)");
    AddedToken a;
    a.content = t["content"].get<std::string>();
    a.id = t["id"].get<int32_t>();
    a.special = flag(t, "special", false);
    a.single_word = flag(t, "single_word", false);
    a.lstrip = flag(t, "lstrip", false);
    a.rstrip = flag(t, "rstrip", false);
    a.normalized = flag(t, "normalized", !a.special);
    KEV_CHECK(!a.content.empty() && find_invalid_utf8(a.content) == std::string_view::npos,
              ErrorCode::InvalidArtifact, "added_tokens[", i, "] has empty or invalid UTF-8 content");
    // HF gives an added token that is also a vocabulary entry the vocabulary's id; a file that says
    // otherwise would make HF renumber it, so it is refused rather than guessed.
    const auto in_vocab = bpe.vocab.find(a.content);
    KEV_CHECK(in_vocab == bpe.vocab.end() || in_vocab->second == a.id, ErrorCode::InvalidArtifact, "added token '",
              a.content, "' has id ", a.id, " but the vocabulary gives it ", in_vocab->second);
    for (const AddedToken& other : tokens) {
      KEV_CHECK(other.content != a.content && other.id != a.id, ErrorCode::InvalidArtifact, "added tokens '",
                other.content, "' (id ", other.id, ") and '", a.content, "' (id ", a.id, ") collide");
    }
    tokens.push_back(std::move(a));
  }
  // HF matches special tokens before the others when both match at the same place with equal length.
  std::stable_partition(tokens.begin(), tokens.end(), [](const AddedToken& t) { return t.special; });
  return tokens;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  BpeModel bpe;
  std::vector<std::string> id_to_token;  // vocabulary and added tokens; empty where no token has the id
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_ids;
  AddedMatcher raw_matcher;         // added tokens with normalized == false, matched on the raw text
  AddedMatcher normalized_matcher;  // the others, matched on normalized pieces
  bool normalize_nfc = false;
  PreTokenizer pre;

  static Result<std::shared_ptr<const Impl>> parse(const Json& root);
  Status encode_into(std::string_view text, std::vector<int32_t>& out) const;
  Status encode_normalized(std::string_view piece, Scratch& s, std::vector<int32_t>& out) const;
};

Result<std::shared_ptr<const Tokenizer::Impl>> Tokenizer::Impl::parse(const Json& root) {
  KEV_CHECK(root.is_object(), ErrorCode::InvalidArtifact, "tokenizer.json is not a JSON object");
  auto impl = std::make_shared<Impl>();
  for (const char* key : {"truncation", "padding"}) {
    const auto it = root.find(key);
    KEV_CHECK(it == root.end() || it->is_null(), ErrorCode::Unsupported, key,
              " is set; HF would truncate or pad encodings, which this tokenizer does not do");
  }
  KEV_ASSIGN_OR_RETURN(const Json* model, member(root, "model", "tokenizer"));
  KEV_TRY(load_model(*model, impl->bpe, impl->id_to_token));

  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end() && !normalizer->is_null()) {
    const std::string type = type_of(*normalizer);
    KEV_CHECK(type == "NFC", ErrorCode::Unsupported, "normalizer type '", type,
              "' is not supported (only NFC or null)");
    impl->normalize_nfc = true;
  }

  KEV_ASSIGN_OR_RETURN(const Json* pre, member(root, "pre_tokenizer", "tokenizer"));
  bool saw_byte_level = false;
  KEV_TRY(load_pre_tokenizer_step(*pre, "pre_tokenizer", impl->pre, saw_byte_level));
  KEV_CHECK(saw_byte_level, ErrorCode::Unsupported,
            "pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");

  KEV_ASSIGN_OR_RETURN(const Json* decoder, member(root, "decoder", "tokenizer"));
  KEV_CHECK(!decoder->is_null() && type_of(*decoder) == "ByteLevel", ErrorCode::Unsupported, "decoder type '",
            decoder->is_null() ? std::string("null") : type_of(*decoder), "' is not supported (only ByteLevel)");

  KEV_ASSIGN_OR_RETURN(impl->added, load_added_tokens(root, impl->bpe));
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->added_ids.emplace(t.content, t.id);
    if (static_cast<size_t>(t.id) >= impl->id_to_token.size()) impl->id_to_token.resize(static_cast<size_t>(t.id) + 1);
    KEV_CHECK(impl->id_to_token[t.id].empty() || impl->id_to_token[t.id] == t.content, ErrorCode::InvalidArtifact,
              "added token '", t.content, "' has id ", t.id, ", which the vocabulary gives to '",
              impl->id_to_token[t.id], "'");
    impl->id_to_token[t.id] = t.content;
    if (!t.normalized) {
      impl->raw_matcher.add(t.content, i);
    } else if (impl->normalize_nfc) {
      KEV_ASSIGN_OR_RETURN(std::string pattern, nfc(t.content));
      impl->normalized_matcher.add(std::move(pattern), i);
    } else {
      impl->normalized_matcher.add(t.content, i);
    }
  }
  return std::shared_ptr<const Impl>(std::move(impl));
}

Status Tokenizer::Impl::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  const size_t bad = find_invalid_utf8(text);
  KEV_CHECK(bad == std::string_view::npos, ErrorCode::InvalidRequest, "text is not valid UTF-8: byte 0x", std::hex,
            static_cast<int>(static_cast<unsigned char>(text[bad])), std::dec, " at offset ", bad, " of ",
            text.size());
  Scratch s;
  for (const Regex& r : pre.regexes) s.match_data.push_back(r.make_match_data());
  Status status;
  split_added(text, raw_matcher, added, [&](std::string_view piece, const AddedToken* token) {
    if (!status.ok()) return;
    if (token != nullptr) {
      out.push_back(token->id);
      return;
    }
    Result<std::string> normalized = normalize_nfc ? nfc(piece) : Result<std::string>(std::string(piece));
    if (!normalized.ok()) {
      status = normalized.status();
      return;
    }
    status = encode_normalized(normalized.value(), s, out);
  });
  return status;
}

Status Tokenizer::Impl::encode_normalized(std::string_view piece, Scratch& s, std::vector<int32_t>& out) const {
  Status status;
  split_added(piece, normalized_matcher, added, [&](std::string_view sub, const AddedToken* token) {
    if (!status.ok()) return;
    if (token != nullptr) {
      out.push_back(token->id);
      return;
    }
    status = pre.for_each_word(sub, s, [&](std::string_view word) { bpe.tokenize(word, s, out); });
  });
  return status;
}

// ---------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KEV_CHECK(in.good(), ErrorCode::Io, "cannot open tokenizer file '", path, "': ", std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  KEV_CHECK(!in.bad(), ErrorCode::Io, "cannot read tokenizer file '", path, "'");
  Result<Tokenizer> tokenizer = from_json(buf.str());
  if (!tokenizer.ok()) {
    return Status(tokenizer.status().code(), cat("tokenizer '", path, "': ", tokenizer.status().message()));
  }
  return tokenizer;
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Status(ErrorCode::InvalidArtifact, cat("tokenizer.json is not valid JSON: ", e.what()));
  }
  try {
    KEV_ASSIGN_OR_RETURN(auto impl, Impl::parse(root));
    return Tokenizer(std::move(impl));
  } catch (const Json::exception& e) {
    // Values of the wrong JSON type that the checks above let through (e.g. a non-string "behavior").
    return Status(ErrorCode::InvalidArtifact, cat("tokenizer.json has an unexpected value: ", e.what()));
  }
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  KEV_TRY(impl_->encode_into(text, ids));
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    KEV_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->id_to_token.size() && !impl_->id_to_token[id].empty(),
              ErrorCode::InvalidRequest, "token id ", id, " at position ", i, " is not in the vocabulary (ids 0..",
              impl_->id_to_token.size() - 1, ")");
    byte_level_decode_append(impl_->id_to_token[id], bytes);
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->bpe.vocab.find(key); it != impl_->bpe.vocab.end()) return it->second;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

}  // namespace kev
