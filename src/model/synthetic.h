// Synthetic Kev models: the real architecture (KEV_SPEC.md §1 tables) with seeded random weights, for
// tests and benchmarks. Their answers are meaningless; their shapes, memory traffic and FLOPs are
// exactly those of the real model of the same size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kev/result.h"
#include "model/config.h"

namespace kev {

// "tiny" (a small test model), "0.8b", "4b", "9b".
Result<ModelConfig> synthetic_config(const std::string& kind);
std::vector<std::string> synthetic_kinds();
// The shipped temperature of the real checkpoint of that size (1.0 for tiny).
double synthetic_temperature(const std::string& kind);

struct SyntheticOptions {
  std::string kind = "tiny";
  uint64_t seed = 0;
  std::string dtype = "fp32";    // backbone projections: "fp32" | "bf16"
  std::string backend = "cpu";   // recorded in model.json
  std::string tokenizer_path;    // tokenizer.json copied into the model
  std::string out_dir;
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Writes model.json + weights.safetensors + tokenizer.json into options.out_dir (created if needed).
// The embedding has max(config vocab, tokenizer vocab) rows.
Status write_synthetic_model(const SyntheticOptions& options);

}  // namespace kev
