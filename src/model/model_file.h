// The exported model directory (kev_export's output, the analogue of ExecuTorch's .pte + .ptd):
//   model.json          format, architecture (HF text-config fields), Kev metadata, limits
//   weights.safetensors backbone (HF text names without the language-model prefix) + kev_head.*
//   tokenizer.json      the base model's tokenizer
// docs/model-format.md documents every field. The loader checks the format version and every field
// and says how to fix a mismatch ("re-export with kev_export ...").
#pragma once

#include <cstdint>
#include <string>

#include "kev/kev.h"
#include "model/config.h"
#include "text/encode.h"

namespace kev {

inline constexpr const char* kModelFormat = "kev-native-model";
inline constexpr int64_t kModelFormatVersion = 1;

struct KevMetadata {
  std::string name;
  double temperature = 1.0;
  std::string checkpoint_id;    // "sha256:<hex of head.pt>", or "synthetic:<kind>:<seed>"
  int64_t pointer_dim = 256;    // P, the head's projection width
  SpecialIds special_ids{};     // as recorded at export; checked against the tokenizer at load
  Limits limits;
  std::string dtype = "fp32";   // backbone weight dtype in weights.safetensors: "fp32" | "bf16"
  std::string backend = "cpu";  // the backend the export was audited for (any backend may load it)
  std::string source;           // free text: where the weights came from
};

struct ModelFile {
  std::string dir;
  ModelConfig config;
  KevMetadata kev;
  std::string weights_path() const { return dir + "/weights.safetensors"; }
  std::string tokenizer_path() const { return dir + "/tokenizer.json"; }
};

// The one rule for Limits, wherever they come from (options, model.json, kev_export flags):
// InvalidRequest naming the limit and the accepted range.
Status validate_limits(const Limits& limits);

// Reads and validates `dir`/model.json (not the weights).
Result<ModelFile> read_model_file(const std::string& dir);
// model.json text for `config` + `kev` (the architecture written with HF field names).
std::string model_json_text(const ModelConfig& config, const KevMetadata& kev);
// The HF text-config JSON object for `config` (used by model.json and by tests).
std::string hf_text_config_json(const ModelConfig& config);

}  // namespace kev
