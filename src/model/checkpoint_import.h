// Upstream Kev checkpoints -> our exported model (KEV_SPEC.md §2). A checkpoint directory holds
// head.pt plus either a peft LoRA adapter (adapter_config.json + adapter_model.safetensors) over a
// Qwen3.5 base, or full weights (config.json + model*.safetensors, weights = "full"). The base
// directory is an HF checkpoint (config.json, model*.safetensors, tokenizer.json); only the text
// decoder is used (language-model prefixes stripped; vision and MTP tensors skipped).
//
// LoRA merge: W' = W + s·(α/r)·B·A (α/√r under rsLoRA) in FP32, rounded once to the export dtype.
// Every adapted module must exist with matching shapes; adapter tensors left unused are errors, and so
// are trainable_token_indices and modules_to_save.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kev/kev.h"
#include "kev/result.h"

namespace kev {

struct ImportOptions {
  std::string checkpoint_dir;  // head.pt (+ adapter or full weights)
  std::string base_dir;        // HF base; may equal checkpoint_dir for full-weight checkpoints
  std::string out_dir;
  std::string dtype = "fp32";  // backbone projections in the export: "fp32" | "bf16"
  std::string backend = "cpu";
  Limits limits;               // recorded in model.json
  double lora_scale = 1.0;     // the user scale s (upstream KEV_LORA_SCALE)
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// What the import found, for the CLI to print.
struct ImportSummary {
  std::string checkpoint_id;
  double temperature = 1;
  int64_t lora_rank = 0;
  int64_t lora_modules = 0;     // adapted Linear layers merged
  int64_t lora_parameters = 0;  // Σ r·(in+out) over merged modules
};

Result<ImportSummary> export_checkpoint(const ImportOptions& options);

}  // namespace kev
