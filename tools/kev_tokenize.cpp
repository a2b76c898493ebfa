// kev_tokenize: encode text with an HF tokenizer.json, or measure encode throughput.
//
//   kev_tokenize --tokenizer tokenizer.json --text "Hello"        -> [9707]
//   kev_tokenize --tokenizer tokenizer.json --corpus c.jsonl       -> one JSON id array per corpus line
//   kev_tokenize --tokenizer tokenizer.json --corpus c.jsonl --bench 5
//
// The corpus is one JSON string per line (tests/fixtures/tokenizer/corpus.jsonl); its id output has the
// format of the expected_*.jsonl fixtures, so `cmp` can compare them. --bench encodes the whole corpus once
// as a warm-up, then repeatedly until SECONDS of wall time have passed, on one thread, and prints MB/s of
// UTF-8 input per wall second and per second of this process's CPU time (the latter is the fairer figure
// on a shared, busy machine).
// Exit codes: 0 success, 1 usage, 2 tokenizer or input error.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

bool read_corpus(const std::string& path, std::vector<std::string>& texts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "kev_tokenize: cannot open corpus '" << path << "'\n";
    return false;
  }
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      texts.push_back(nlohmann::json::parse(line).get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      std::cerr << "kev_tokenize: " << path << " line " << n << " is not a JSON string: " << e.what() << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encode text with an HF tokenizer.json (byte-level BPE), or benchmark encoding."};
  std::string tokenizer_path, text, corpus_path;
  double bench_seconds = 0;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  auto* text_opt = app.add_option("--text", text, "text to encode");
  auto* corpus_opt = app.add_option("--corpus", corpus_path, "JSONL file, one JSON string per line");
  auto* bench_opt = app.add_option("--bench", bench_seconds, "measure encode MB/s over the corpus for SECONDS")
                        ->check(CLI::PositiveNumber);
  text_opt->excludes(corpus_opt);
  bench_opt->needs(corpus_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 1;
  }
  if (text_opt->count() == 0 && corpus_opt->count() == 0) {
    std::cerr << "kev_tokenize: give --text or --corpus\n" << app.help();
    return 1;
  }

  const auto load_start = Clock::now();
  const double load_cpu_start = cpu_seconds();
  kev::Result<kev::Tokenizer> tokenizer = kev::Tokenizer::load(tokenizer_path);
  const double load_s = seconds_since(load_start);
  const double load_cpu = cpu_seconds() - load_cpu_start;
  if (!tokenizer) {
    std::cerr << "kev_tokenize: " << tokenizer.status().to_string() << "\n";
    return 2;
  }

  std::vector<std::string> texts;
  if (text_opt->count() > 0) {
    texts.push_back(text);
  } else if (!read_corpus(corpus_path, texts)) {
    return 2;
  }

  if (bench_seconds <= 0) {
    for (const std::string& t : texts) {
      kev::Result<std::vector<int32_t>> ids = tokenizer->encode(t);
      if (!ids) {
        std::cerr << "kev_tokenize: " << ids.status().to_string() << "\n";
        return 2;
      }
      std::cout << ids_json(ids.value()) << "\n";
    }
    return 0;
  }

  size_t bytes = 0, tokens = 0;
  for (const std::string& t : texts) {
    bytes += t.size();
    kev::Result<std::vector<int32_t>> ids = tokenizer->encode(t);  // warm-up pass
    if (!ids) {
      std::cerr << "kev_tokenize: " << ids.status().to_string() << "\n";
      return 2;
    }
    tokens += ids->size();
  }
  size_t passes = 0;
  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  double elapsed = 0;
  while (elapsed < bench_seconds) {
    for (const std::string& t : texts) {
      if (!tokenizer->encode(t)) return 2;
    }
    ++passes;
    elapsed = seconds_since(start);
  }
  const double cpu = cpu_seconds() - cpu_start;
  const double total = static_cast<double>(bytes * passes);
  std::printf("load: %.3f s wall, %.3f s cpu (%d ids)\n", load_s, load_cpu, tokenizer->vocab_size());
  std::printf("encode throughput: %.2f MB/s wall, %.2f MB/s cpu, %.0f tokens/s wall (%zu passes over %zu strings, "
              "%zu bytes, %zu tokens; %.2f s wall, %.2f s cpu; one thread)\n",
              total / elapsed / 1e6, total / cpu / 1e6, static_cast<double>(tokens * passes) / elapsed, passes,
              texts.size(), bytes, tokens, elapsed, cpu);
  return 0;
}
