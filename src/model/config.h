// The backbone's architecture configuration, read from HF `config.json` (model_type "qwen3_5" with a
// `text_config`, or "qwen3_5_text") or from the "architecture" object of our model.json (same fields).
// Dimension names follow docs/architecture.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kev/result.h"

namespace kev {

enum class LayerType { GatedDeltaNet, FullAttention };

struct ModelConfig {
  std::string model_type;              // "qwen3_5_text" after unwrapping text_config
  int64_t n_embd = 0;                  // d (hidden_size)
  int64_t n_layers = 0;
  int64_t n_vocab = 0;                 // embedding rows (vocab_size)
  int64_t n_ff = 0;                    // SwiGLU intermediate F
  std::vector<LayerType> layer_types;  // size n_layers
  double rms_eps = 1e-6;

  // Gated attention.
  int64_t n_head = 0;                  // H
  int64_t n_head_kv = 0;               // H_kv
  int64_t head_dim = 0;                // 256 for Qwen3.5
  int64_t n_rot = 0;                   // rotary dims = head_dim * partial_rotary_factor (64)
  double rope_theta = 1e7;
  bool attn_output_gate = true;        // q_proj emits [query | gate] per head

  // Gated DeltaNet.
  int64_t gdn_n_k_heads = 0;           // H_k
  int64_t gdn_n_v_heads = 0;           // H_v (a multiple of H_k)
  int64_t gdn_k_dim = 0;               // d_k
  int64_t gdn_v_dim = 0;               // d_v
  int64_t gdn_conv_kernel = 4;

  int64_t gdn_conv_channels() const { return 2 * gdn_n_k_heads * gdn_k_dim + gdn_n_v_heads * gdn_v_dim; }
  int64_t n_gdn_layers() const;
  int64_t n_attn_layers() const;
  // One-line summary, e.g. "qwen3_5_text d=1024 layers=24 (18 GDN + 6 attention) vocab=248320".
  std::string summary() const;
};

// Parses a config.json text. Accepts model_type "qwen3_5" (reads text_config) and "qwen3_5_text".
// Unsupported features (rope scaling types other than default/mrope-equivalent, attention bias,
// missing fields, inconsistent head counts) are errors that name the field.
Result<ModelConfig> parse_model_config(std::string_view json_text);
Result<ModelConfig> load_model_config(const std::string& path);

}  // namespace kev
