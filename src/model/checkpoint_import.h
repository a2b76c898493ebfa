// Upstream Kev checkpoints, opened in memory or exported (KEV_SPEC.md §2, docs/model-format.md). A
// checkpoint directory holds head.pt plus either a peft LoRA adapter (adapter_config.json +
// adapter_model.safetensors) over a Qwen3.5 base, or full weights (config.json + model*.safetensors,
// weights = "full"). The base directory is an HF checkpoint (config.json, model*.safetensors,
// tokenizer.json); only the text decoder is used (language-model prefixes stripped; vision and MTP
// tensors skipped).
//
//   KEV_ASSIGN_OR_RETURN(kev::OpenedCheckpoint ck, kev::open_checkpoint("runs/kev-0.8b", "Qwen3.5-0.8B-Base"));
//   KEV_ASSIGN_OR_RETURN(kev::ModelWeights w, kev::upload_weights(backend, ck.config, ck.meta.pointer_dim,
//                                                                 ck.tensors, kev::DType::F32));
//
// open_checkpoint validates everything it can from headers before any weight is read: head.pt, the
// base's config against the head, that every tensor the model needs exists with the right shape (and,
// for full weights, the dtype head.pt's weights_dtype names), and that every adapter tensor pairs with
// a projection of the right shape. Errors name the file, the tensor and the mismatch; a head.pt that
// names its base while `base_dir` is empty gets an error saying which base and revision to pass.
//
// LoRA merge: W' = W + s·(α/r)·B·A (α/√r under rsLoRA) in FP32 (BLAS sgemm), done when `tensors` is
// asked for the weight, so an export rounds once to its dtype. Adapter tensors that match no
// projection are errors, and so are trainable_token_indices, modules_to_save, DoRA, fan_in_fan_out and
// per-module rank or alpha patterns. The merge is deterministic: the same checkpoint always yields the
// same bits (an export reloads bit-identically, and a direct load equals the fp32 export).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "kev/kev.h"
#include "kev/result.h"
#include "model/config.h"
#include "model/model_file.h"
#include "model/weights.h"

namespace kev {

// What the import found, for the CLI to print.
struct ImportSummary {
  std::string checkpoint_id;
  double temperature = 1;
  std::string base;                 // head.pt's base and revision ("" when it names none)
  std::string base_revision;
  std::string weights = "lora";     // "lora" | "full"
  int64_t lora_rank = 0;            // 0: no adapter merged
  double lora_scale = 0;            // s·α/r (or s·α/√r) as applied
  int64_t lora_modules = 0;         // adapted Linear layers merged
  int64_t lora_parameters = 0;      // Σ r·(in+out) over merged modules
  int64_t lora_parameters_all = 0;  // the same sum if every projection were adapted (KEV_SPEC §1 totals)
  std::map<std::string, int64_t> merged_by_module;  // "q_proj" -> layers merged
};

struct OpenedCheckpoint {
  ModelConfig config;
  // name, temperature, checkpoint_id, pointer_dim, special_ids (resolved from the base tokenizer) and
  // source are filled; limits, dtype and backend hold their defaults for the caller to set.
  KevMetadata meta;
  std::string tokenizer_path;  // the base model's tokenizer.json
  ImportSummary summary;
  // Merged FP32 tensors by our names (weight_specs order is the natural one); self-contained: it keeps
  // the mapped files alive, so it may outlive this struct.
  TensorSource tensors;
};

// `base_dir` may be empty for a full-weight checkpoint (the checkpoint directory is then its own base).
// `lora_scale` is the user scale s (upstream KEV_LORA_SCALE); it must be finite.
Result<OpenedCheckpoint> open_checkpoint(const std::string& checkpoint_dir, const std::string& base_dir,
                                         double lora_scale = 1.0);

// True when `dir` holds head.pt (an upstream checkpoint) rather than model.json.
bool is_checkpoint_dir(const std::string& dir);

// The backbone dtype an export for `backend` gets by default: bf16 for cuda, fp32 otherwise.
std::string default_export_dtype(const std::string& backend);

struct ImportOptions {
  std::string checkpoint_dir;  // head.pt (+ adapter or full weights)
  std::string base_dir;        // HF base; may be empty or equal checkpoint_dir for full-weight checkpoints
  std::string out_dir;
  std::string dtype = "fp32";  // backbone projections in the export: "fp32" | "bf16"
  std::string backend = "cpu";
  Limits limits;               // recorded in model.json
  double lora_scale = 1.0;     // the user scale s (upstream KEV_LORA_SCALE)
  std::function<void(uint64_t done, uint64_t total)> progress;  // weights.safetensors bytes written
};

// Writes `checkpoint` as an exported model directory: weights.safetensors (projections in `options.dtype`,
// everything else F32, tensors in weight_specs order), model.json, and the base tokenizer. Only
// out_dir, dtype, backend, limits and progress of `options` are read.
Status write_exported_model(const OpenedCheckpoint& checkpoint, const ImportOptions& options);

// open_checkpoint + write_exported_model.
Result<ImportSummary> export_checkpoint(const ImportOptions& options);

}  // namespace kev
