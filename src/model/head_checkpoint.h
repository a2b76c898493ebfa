// Kev's head.pt (KEV_SPEC.md §2): the pointer head's weights plus the settings of the training run
// (base model and revision, LoRA rank, temperature, ...), read through io/torch_checkpoint.h and
// validated. The file is the source of T and of the checkpoint id.
//
//   KEV_ASSIGN_OR_RETURN(kev::HeadCheckpoint head, kev::read_head_checkpoint(dir + "/head.pt"));
//   KEV_ASSIGN_OR_RETURN(std::string id, kev::checkpoint_id(dir + "/head.pt"));  // "sha256:<64 hex>"
//   // z_j = (kappa_j . u) / 16 / head.temperature, with u = W_q h + b_q, kappa = W_k h + b_k
//
// Contracts (all failures name the key and the value):
// - `head` holds exactly q.weight [P, d], q.bias [P], k.weight [P, d], k.bias [P] with P == head_dim,
//   the same d for q and k, finite values, stored as float32, bfloat16 or float16 (widened exactly).
// - temperature is finite and > 0; weights is "lora" or "full"; weights_dtype is "fp32" or "bf16";
//   lora >= 0; head_dim > 0. base and base_revision are strings, empty when the file has none (a
//   minimal head.pt holds only `head` and `temperature`; the caller must then know the base).
// - option_isolation or special_embeddings set to true is Unsupported: released Kevs never set them.
// - A key missing or set to None takes the default below. Known keys of the wrong type are
//   InvalidArtifact; unknown top-level keys (temperature_fit, training args, ...) are listed in
//   extra_keys, in file order, and otherwise ignored. Python objects the reader does not know
//   (argparse.Namespace, paths, numpy scalars) load as inert opaque values — nothing is executed: under
//   unknown keys they are ignored, under known keys they are InvalidArtifact naming their Python type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "kev/result.h"

namespace kev {

struct HeadCheckpoint {
  std::string base;           // HF repo id of the base model, e.g. "Qwen/Qwen3.5-0.8B-Base"; may be empty
  std::string base_revision;  // the pinned commit of `base`; may be empty
  int64_t lora = 0;           // LoRA rank; 0 = no adapter
  int64_t head_dim = 256;     // pointer width P (not the attention head dim)
  bool option_isolation = false;
  bool special_embeddings = false;
  std::string weights_dtype = "fp32";  // dtype of the shipped weights: "fp32" or "bf16"
  double temperature = 1.0;            // T in z = (kappa . u) / 16 / T
  std::string weights = "lora";        // "lora": adapter over the base; "full": full weights shipped
  std::optional<double> holdout;
  HostTensor q_weight;  // [P, d]
  HostTensor q_bias;    // [P]
  HostTensor k_weight;  // [P, d]
  HostTensor k_bias;    // [P]
  std::vector<std::string> extra_keys;

  int64_t n_embd() const { return q_weight.shape.size() == 2 ? q_weight.shape[1] : 0; }  // d
};

Result<HeadCheckpoint> read_head_checkpoint(const std::string& path);

// "sha256:" + the lower-case hex SHA-256 of the file's bytes.
Result<std::string> checkpoint_id(const std::string& path);

}  // namespace kev
