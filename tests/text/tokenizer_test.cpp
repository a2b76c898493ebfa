// HF byte-level BPE tokenizer (src/text/tokenizer.h): id equality with HF `tokenizers` and with an
// independent JS port on the conformance corpus, added-token flags, decoding, and error handling.
//
// Expected ids come from reference/tokenizer/: expected_qwen3_hf.jsonl and expected_flags_qwen3.jsonl from
// HF `tokenizers` 0.23.2 (Rust, via its Node binding; make_expected_hf_node.mjs, or make_expected_hf.py
// with the Python binding), expected_qwen3.jsonl from @lenml/tokenizers 3.7.2 (a transformers.js fork;
// make_expected.mjs). The corpus comes from make_corpus.py.
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kev {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kFixtures = std::string(KEV_FIXTURES_DIR) + "/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// One JSON value per line; lines are split on '\n' only (the corpus is ASCII-escaped JSON).
std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> values;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) values.push_back(Json::parse(line));
  }
  return values;
}

std::vector<std::string> read_corpus(const std::string& name) {
  std::vector<std::string> texts;
  for (const Json& j : read_jsonl(kFixtures + name)) texts.push_back(j.get<std::string>());
  return texts;
}

std::vector<Ids> read_expected(const std::string& name) {
  std::vector<Ids> ids;
  for (const Json& j : read_jsonl(kFixtures + name)) ids.push_back(j.get<Ids>());
  return ids;
}

const Tokenizer* qwen3() {
  static const Result<Tokenizer> tokenizer = Tokenizer::load(KEV_QWEN3_TOKENIZER);
  return tokenizer.ok() ? &tokenizer.value() : nullptr;
}

#define REQUIRE_QWEN3()                                                                                 \
  ASSERT_NE(qwen3(), nullptr) << "the Qwen3 tokenizer is required at " << KEV_QWEN3_TOKENIZER << ": " \
                              << Tokenizer::load(KEV_QWEN3_TOKENIZER).status().to_string()

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  EXPECT_GE(n, 0) << utf8proc_errmsg(n);
  std::string result(reinterpret_cast<const char*>(out), n < 0 ? 0 : static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string ids_string(const Ids& ids) { return Json(ids).dump(); }

Json small_tokenizer();

// Encodes every corpus line and compares with the expected ids; reports the first mismatch in full.
void expect_corpus_matches(const Tokenizer& tokenizer, const std::string& corpus_name,
                           const std::string& expected_name) {
  const std::vector<std::string> texts = read_corpus(corpus_name);
  const std::vector<Ids> expected = read_expected(expected_name);
  ASSERT_FALSE(texts.empty()) << "missing or empty fixture " << kFixtures << corpus_name;
  ASSERT_EQ(texts.size(), expected.size()) << corpus_name << " and " << expected_name << " differ in length";
  size_t mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    Result<Ids> ids = tokenizer.encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << "line " << i + 1 << ": " << ids.status().to_string();
    if (*ids == expected[i]) continue;
    if (mismatches++ == 0) {
      ADD_FAILURE() << "first mismatch, " << corpus_name << " line " << i + 1 << ": " << Json(texts[i]).dump()
                    << "\n  ours:     " << ids_string(*ids) << "\n  expected: " << ids_string(expected[i]);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << texts.size() << " lines of " << corpus_name;
}

TEST(TokenizerConformance, CorpusIsLargeAndVaried) {
  const std::vector<std::string> texts = read_corpus("corpus.jsonl");
  EXPECT_GE(texts.size(), 300u);
  size_t long_ones = 0, empty = 0;
  for (const std::string& t : texts) {
    long_ones += t.size() >= 2000;
    empty += t.empty();
  }
  EXPECT_GE(long_ones, 5u);
  EXPECT_EQ(empty, 1u);
}

TEST(TokenizerConformance, CorpusMatchesHfTokenizers) {
  REQUIRE_QWEN3();
  expect_corpus_matches(*qwen3(), "corpus.jsonl", "expected_qwen3_hf.jsonl");
}

TEST(TokenizerConformance, CorpusMatchesTransformersJsPort) {
  REQUIRE_QWEN3();
  expect_corpus_matches(*qwen3(), "corpus.jsonl", "expected_qwen3.jsonl");
}

// The shipped Qwen3 file sets no added-token flags, so flags_patch.json turns some on (lstrip, rstrip,
// single_word, normalized) and adds tokens; the reference scripts apply the same patch.
TEST(TokenizerConformance, AddedTokenFlagsMatchHfTokenizers) {
  const std::string text = read_file(KEV_QWEN3_TOKENIZER);
  ASSERT_FALSE(text.empty()) << "the Qwen3 tokenizer is required at " << KEV_QWEN3_TOKENIZER;
  Json root = Json::parse(text);
  const Json patch = Json::parse(read_file(kFixtures + "flags_patch.json"));
  for (const auto& [content, flags] : patch.at("modify").items()) {
    for (Json& t : root["added_tokens"]) {
      if (t["content"] == content) t.update(flags);
    }
  }
  for (const Json& t : patch.at("add")) root["added_tokens"].push_back(t);
  Result<Tokenizer> tokenizer = Tokenizer::from_json(root.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  expect_corpus_matches(*tokenizer, "corpus_flags.jsonl", "expected_flags_qwen3.jsonl");
  EXPECT_EQ(tokenizer->token_to_id("hello world"), 151670);
  EXPECT_EQ(tokenizer->vocab_size(), 151673);
}

// With add_prefix_space every Split piece starts with its own "Ġ", so piece boundaries that happen to give
// the same ids without it (e.g. around U+180E) are checked too.
TEST(TokenizerConformance, PrefixSpaceVariantMatchesHfTokenizers) {
  const std::string text = read_file(KEV_QWEN3_TOKENIZER);
  ASSERT_FALSE(text.empty()) << "the Qwen3 tokenizer is required at " << KEV_QWEN3_TOKENIZER;
  Json root = Json::parse(text);
  root["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  Result<Tokenizer> tokenizer = Tokenizer::from_json(root.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  expect_corpus_matches(*tokenizer, "corpus.jsonl", "expected_prefix_space_qwen3.jsonl");
}

// GPT-2's byte -> code point map, written out again here so the test does not reuse the code it checks.
std::string byte_level_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

void append_utf8(std::string& s, char32_t c) {
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Every code point is classified by a Split regex `\p{L}+` (resp. `\p{N}+`, `\s+`) exactly as HF's
// Oniguruma does (hf_regex_classes.txt, from reference/tokenizer/hf_regex_classes.mjs). The probe text is
// "!" c1 "!" c2 ... "!"; ByteLevel's add_prefix_space puts the byte-level space (id 32 here) before every
// piece, so c is in the class exactly when a piece starts at c. U+0020 itself cannot be seen this way and
// "!" is the separator; both are skipped.
TEST(TokenizerConformance, RegexClassesMatchHfOnEveryCodePoint) {
  std::ifstream in(kFixtures + "hf_regex_classes.txt");
  ASSERT_TRUE(in.good()) << "missing fixture " << kFixtures << "hf_regex_classes.txt";
  std::map<char, std::vector<bool>> hf;
  for (const char k : {'L', 'N', 'S'}) hf[k].assign(0x110000, false);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    char k = 0;
    unsigned first = 0, last = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%c %x %x", &k, &first, &last), 3) << line;
    ASSERT_TRUE(hf.count(k) && first <= last && last < 0x110000) << line;
    for (unsigned cp = first; cp <= last; ++cp) hf[k][cp] = true;
  }

  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  std::vector<char32_t> probes;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if ((cp < 0xD800 || cp > 0xDFFF) && cp != '!' && cp != ' ') probes.push_back(cp);
  }
  for (const auto& [k, pattern] : {std::pair{'L', "\\p{L}+"}, std::pair{'N', "\\p{N}+"}, std::pair{'S', "\\s+"}}) {
    Json root = small_tokenizer();
    root["normalizer"] = nullptr;
    root["added_tokens"] = Json::array();
    root["model"]["vocab"] = vocab;
    root["model"]["merges"] = Json::array();
    root["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", pattern}};
    root["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
    Result<Tokenizer> tokenizer = Tokenizer::from_json(root.dump());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    std::vector<char32_t> mismatches;
    for (size_t b = 0; b < probes.size(); b += 4096) {
      std::string text = "!";
      std::vector<size_t> starts;
      for (size_t i = b; i < std::min(probes.size(), b + 4096); ++i) {
        starts.push_back(text.size());
        append_utf8(text, probes[i]);
        text += '!';
      }
      Result<Ids> ids = tokenizer->encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status().to_string();
      std::vector<bool> piece_starts(text.size() + 1, false);
      size_t pos = 0;
      for (const int32_t id : *ids) {  // the text has no byte 0x20, so every id 32 is a prefix space
        if (id == 32) {
          piece_starts[pos] = true;
        } else {
          ++pos;
        }
      }
      ASSERT_EQ(pos, text.size()) << "ids do not cover the probe text";
      for (size_t j = 0; j < starts.size(); ++j) {
        if (piece_starts[starts[j]] != hf[k][probes[b + j]]) mismatches.push_back(probes[b + j]);
      }
    }
    std::ostringstream first;
    for (size_t i = 0; i < std::min<size_t>(mismatches.size(), 10); ++i) {
      first << " U+" << std::hex << static_cast<uint32_t>(mismatches[i]);
    }
    EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " code points classified differently from HF for "
                                    << pattern << ", e.g." << first.str();
  }
}

// HF normalizes only the text between added tokens, so the round trip gives NFC of each such piece. The
// added-token texts are found here by plain leftmost-longest search (no Qwen3 token sets any flag).
std::string nfc_between_added_tokens(const std::string& text, const std::vector<std::string>& added) {
  std::string out;
  size_t piece_start = 0, i = 0;
  while (i < text.size()) {
    size_t best = 0;
    for (const std::string& a : added) {
      if (a.size() > best && text.compare(i, a.size(), a) == 0) best = a.size();
    }
    if (best == 0) {
      ++i;
      continue;
    }
    out += nfc(text.substr(piece_start, i - piece_start)) + text.substr(i, best);
    i += best;
    piece_start = i;
  }
  return out + nfc(text.substr(piece_start));
}

TEST(Tokenizer, DecodeOfEncodeIsNfcOfTheText) {
  REQUIRE_QWEN3();
  const Json root = Json::parse(read_file(KEV_QWEN3_TOKENIZER));
  std::vector<std::string> added;
  for (const Json& t : root.at("added_tokens")) added.push_back(t.at("content"));
  size_t boundary_cases = 0;
  for (const std::string& text : read_corpus("corpus.jsonl")) {
    Result<Ids> ids = qwen3()->encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    Result<std::string> decoded = qwen3()->decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    const std::string expected = nfc_between_added_tokens(text, added);
    EXPECT_EQ(*decoded, expected) << "text " << Json(text).dump();
    if (expected != nfc(text)) {
      // e.g. "<|endoftext|>" + U+0338: whole-text NFC would fold ">" + U+0338 into U+226F.
      ++boundary_cases;
      EXPECT_EQ(nfc(*decoded), nfc(text)) << "text " << Json(text).dump();
    }
  }
  EXPECT_LE(boundary_cases, 5u);
}

TEST(Tokenizer, QwenSpecialTokenIds) {
  REQUIRE_QWEN3();
  const std::pair<const char*, int32_t> specials[] = {
      {"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}, {"<|box_start|>", 151648},
      {"<|box_end|>", 151649},   {"<tool_call>", 151657},  {"<|fim_prefix|>", 151659}, {"<|fim_middle|>", 151660},
      {"<|fim_suffix|>", 151661}, {"</think>", 151668}};
  for (const auto& [token, id] : specials) {
    EXPECT_EQ(qwen3()->token_to_id(token), id) << token;
    Result<Ids> ids = qwen3()->encode(token);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, Ids{id}) << token;
  }
  EXPECT_EQ(qwen3()->token_to_id("\xC4\xA0"), 220);  // "Ġ", the byte-level space
  EXPECT_EQ(qwen3()->token_to_id("Hello"), 9707);
  EXPECT_EQ(qwen3()->token_to_id("<|nonexistent|>"), std::nullopt);
  EXPECT_EQ(qwen3()->token_to_id(""), std::nullopt);
  EXPECT_EQ(qwen3()->vocab_size(), 151669);
}

// Expected strings from HF tokenizers 0.23.2: decode(ids, skip_special_tokens=False).
TEST(Tokenizer, DecodeMatchesHfOnPartialCharacters) {
  REQUIRE_QWEN3();
  const std::pair<Ids, std::string> cases[] = {
      {{151643}, "<|endoftext|>"},
      {{9707, 220, 151643}, "Hello <|endoftext|>"},
      {{127}, "\xEF\xBF\xBD"},                      // byte C3 alone
      {{127, 127}, "\xEF\xBF\xBD\xEF\xBF\xBD"},     // C3 C3: two invalid subparts
      {{102}, "\xEF\xBF\xBD"},                      // byte A9 alone
      {{160, 116}, "\xEF\xBF\xBD"},                 // E4 B8: one truncated sequence
      {{160, 116, 255}, "\xE4\xB8\xAD"},            // E4 B8 AD = U+4E2D
      {{160, 116, 9707}, "\xEF\xBF\xBDHello"},
      {{151657, 151643, 9707}, "<tool_call><|endoftext|>Hello"},
      {{}, ""},
  };
  for (const auto& [ids, text] : cases) {
    Result<std::string> decoded = qwen3()->decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    EXPECT_EQ(*decoded, text) << ids_string(ids);
  }
}

TEST(Tokenizer, ConcurrentEncodeGivesTheSameIds) {
  REQUIRE_QWEN3();
  const std::vector<std::string> texts = read_corpus("corpus.jsonl");
  std::vector<Ids> serial;
  for (const std::string& t : texts) serial.push_back(qwen3()->encode(t).value());
  std::vector<size_t> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < mismatches.size(); ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = 0; i < texts.size(); ++i) {
        Result<Ids> ids = qwen3()->encode(texts[(i + k * 97) % texts.size()]);
        if (!ids.ok() || *ids != serial[(i + k * 97) % texts.size()]) ++mismatches[k];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t k = 0; k < mismatches.size(); ++k) EXPECT_EQ(mismatches[k], 0u) << "thread " << k;
}

// A small byte-level tokenizer for the loader's rules: printable ASCII bytes stand for themselves.
Json small_tokenizer() {
  return Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [
      {"id": 6, "content": "<|x|>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
      "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5},
      "merges": ["a b"]}
  })");
}

Ids encode_with(const Json& root, const std::string& text) {
  Result<Tokenizer> tokenizer = Tokenizer::from_json(root.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  if (!tokenizer.ok()) return {};
  Result<Ids> ids = tokenizer->encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : Ids{};
}

TEST(Tokenizer, SmallTokenizerModelOptions) {
  Json root = small_tokenizer();
  EXPECT_EQ(encode_with(root, "abc"), (Ids{3, 2}));
  EXPECT_EQ(encode_with(root, "ba<|x|>ab c"), (Ids{1, 0, 6, 3, 5, 2}));
  EXPECT_EQ(encode_with(root, "a\xE2\x82\xAC" "b"), (Ids{0, 1}));  // bytes without a token are dropped, as in HF

  root["model"]["merges"] = Json::parse(R"([["a", "b"]])");  // the tokenizers >= 0.20 merge format
  EXPECT_EQ(encode_with(root, "abc"), (Ids{3, 2}));

  root["model"]["ignore_merges"] = true;  // a word that is a vocabulary entry skips the merges
  EXPECT_EQ(encode_with(root, "abc"), (Ids{4}));
  root["model"]["ignore_merges"] = false;

  root["pre_tokenizer"]["pretokenizers"][0]["pattern"] = Json::parse(R"({"String": "b "})");  // a literal
  EXPECT_EQ(encode_with(root, "ab cab "), (Ids{0, 1, 5, 2, 0, 1, 5}));

  root["pre_tokenizer"] = Json::parse(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})");
  EXPECT_EQ(encode_with(root, "ab c"), (Ids{5, 3, 5, 2}));  // " ab", " c" with a prefix space added
}

void expect_load_error(const Json& root, ErrorCode code, const std::string& needle) {
  Result<Tokenizer> tokenizer = Tokenizer::from_json(root.dump());
  ASSERT_FALSE(tokenizer.ok()) << "expected an error naming '" << needle << "'";
  EXPECT_EQ(tokenizer.status().code(), code) << tokenizer.status().to_string();
  EXPECT_NE(tokenizer.status().message().find(needle), std::string::npos) << tokenizer.status().to_string();
}

TEST(Tokenizer, LoadErrorsNameTheProblem) {
  Result<Tokenizer> malformed = Tokenizer::from_json(R"({"model": {"type": "BPE", )");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), ErrorCode::InvalidArtifact);
  EXPECT_NE(malformed.status().message().find("not valid JSON"), std::string::npos) << malformed.status().to_string();

  Result<Tokenizer> missing = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::Io);
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);

  Json root = small_tokenizer();
  root["model"]["type"] = "WordPiece";
  expect_load_error(root, ErrorCode::Unsupported, "model.type 'WordPiece'");

  root = small_tokenizer();
  root["model"].erase("merges");
  expect_load_error(root, ErrorCode::InvalidArtifact, "model.merges is missing");

  root = small_tokenizer();
  root["model"]["merges"] = Json::parse(R"(["a z"])");
  expect_load_error(root, ErrorCode::InvalidArtifact, "'z' is not in the vocabulary");

  root = small_tokenizer();
  root["model"]["merges"] = Json::parse(R"(["a b c"])");
  expect_load_error(root, ErrorCode::InvalidArtifact, "model.merges[0] 'a b c'");

  root = small_tokenizer();
  root["model"]["byte_fallback"] = true;
  expect_load_error(root, ErrorCode::Unsupported, "byte_fallback");

  root = small_tokenizer();
  root["normalizer"] = Json::parse(R"({"type": "Lowercase"})");
  expect_load_error(root, ErrorCode::Unsupported, "normalizer type 'Lowercase'");

  root = small_tokenizer();
  root["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(root, ErrorCode::Unsupported, "behavior 'Removed'");

  root = small_tokenizer();
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(root, ErrorCode::InvalidArtifact, "does not compile");

  root = small_tokenizer();
  root["pre_tokenizer"] = Json::parse(R"({"type": "Whitespace"})");
  expect_load_error(root, ErrorCode::Unsupported, "type 'Whitespace'");

  root = small_tokenizer();
  root["decoder"] = Json::parse(R"({"type": "WordPiece"})");
  expect_load_error(root, ErrorCode::Unsupported, "decoder type 'WordPiece'");

  root = small_tokenizer();
  root["added_tokens"][0]["id"] = 0;  // "a" already has id 0 in the vocabulary
  expect_load_error(root, ErrorCode::InvalidArtifact, "which the vocabulary gives to 'a'");

  root = small_tokenizer();
  root["truncation"] = Json::parse(R"({"max_length": 8})");
  expect_load_error(root, ErrorCode::Unsupported, "truncation");
}

TEST(Tokenizer, EncodeRejectsInvalidUtf8) {
  REQUIRE_QWEN3();
  const std::pair<std::string, std::string> cases[] = {
      {"\xFF", "offset 0"},
      {"abc\xC3", "offset 3"},          // truncated sequence
      {"ab\xC0\xAF", "offset 2"},       // overlong '/'
      {"x\xED\xA0\x80", "offset 1"},    // UTF-16 surrogate
      {"ok \xF4\x90\x80\x80", "offset 3"},  // above U+10FFFF
  };
  for (const auto& [text, where] : cases) {
    Result<Ids> ids = qwen3()->encode(text);
    ASSERT_FALSE(ids.ok()) << "invalid at " << where;
    EXPECT_EQ(ids.status().code(), ErrorCode::InvalidRequest);
    EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos) << ids.status().to_string();
    EXPECT_NE(ids.status().message().find(where), std::string::npos) << ids.status().to_string();
  }
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  REQUIRE_QWEN3();
  for (const int32_t bad : {151669, 999999, -1}) {
    const Ids ids = {9707, bad};
    Result<std::string> text = qwen3()->decode(ids);
    ASSERT_FALSE(text.ok()) << bad;
    EXPECT_EQ(text.status().code(), ErrorCode::InvalidRequest);
    EXPECT_NE(text.status().message().find("token id " + std::to_string(bad) + " at position 1"), std::string::npos)
        << text.status().to_string();
  }
}

}  // namespace
}  // namespace kev
