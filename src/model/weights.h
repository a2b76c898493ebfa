// Model weights resident on a backend, named by role. `upload_weights` reads them from a tensor
// source (our exported weights.safetensors or an HF checkpoint), checks every shape against the
// ModelConfig, converts to the dtype the backend computes with, and uploads them.
//
// Tensor names are HF's text-decoder names without the language-model prefix ("layers.3.mlp.up_proj.weight")
// plus the pointer head under "kev_head." ("kev_head.q.weight"); docs/model-format.md lists them all.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/host_tensor.h"
#include "model/config.h"

namespace kev {

struct AttentionWeights {
  // [2*H_kv*head_dim + H*2*head_dim, d]: k_proj [H_kv*head_dim, d], v_proj [H_kv*head_dim, d] and q_proj
  // [H*2*head_dim, d] (per head [query | gate]) stacked by rows: one GEMM of the layer's input, and the
  // first 2*H_kv*head_dim rows alone when only K and V are needed.
  Tensor kvq_proj;
  Tensor o_proj;  // [d, H*head_dim]
  Tensor q_norm;  // [head_dim] (gain 1+w)
  Tensor k_norm;  // [head_dim]
};

struct GdnWeights {
  // [C + H_v*d_v + 2*H_v, d]: in_proj_qkv [C, d] (C = 2*H_k*d_k + H_v*d_v, order q, k, v), in_proj_z
  // [H_v*d_v, d], in_proj_b [H_v, d], in_proj_a [H_v, d] stacked by rows: one GEMM of the layer's input.
  Tensor in_proj;
  Tensor conv1d;       // [C, K] (HF stores [C, 1, K])
  Tensor a_log;        // [H_v] F32
  Tensor dt_bias;      // [H_v] F32
  Tensor norm;         // [d_v] plain gain, shared by heads
  Tensor out_proj;     // [d, H_v*d_v]
};

struct LayerWeights {
  LayerType type = LayerType::GatedDeltaNet;
  Tensor input_norm;  // [d]
  Tensor post_norm;   // [d]
  AttentionWeights attn;
  GdnWeights gdn;
  Tensor gate_up_proj;  // [2F, d]: gate_proj [F, d] then up_proj [F, d], stacked (one GEMM)
  Tensor down_proj;   // [d, F]
};

struct HeadWeights {
  Tensor q_weight;  // [P, d] F32
  Tensor q_bias;    // [P]
  Tensor k_weight;  // [P, d]
  Tensor k_bias;    // [P]
};

struct ModelWeights {
  Tensor embed;       // [V, d]
  Tensor final_norm;  // [d]
  std::vector<LayerWeights> layers;
  HeadWeights head;
  int64_t pointer_dim = 0;
  DType matmul_dtype = DType::F32;  // dtype of the projection weights on the backend
  size_t bytes = 0;                 // device bytes held
  std::vector<std::shared_ptr<Buffer>> buffers;
};

// Reads one tensor by our name as FP32 (from whatever dtype it is stored in). Returns InvalidArtifact
// naming the tensor when it is missing.
using TensorSource = std::function<Result<HostTensor>(const std::string& name)>;

// `matmul_dtype`: the dtype projection weights are stored in on the backend (F32, or BF16 / F16 where
// the backend's matmul takes it; F16 refuses values beyond FP16's range, naming the weight). Norms, gates, conv, A_log, dt_bias and the head are always F32.
Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, int64_t pointer_dim,
                                    const TensorSource& source, DType matmul_dtype);

// The projection dtype `backend` computes with for weights stored as `stored` ("fp32" | "bf16"): for
// BF16-stored weights F16 when the backend's matmul takes F16 weights (CUDA's f16 GEMMs), else BF16 when
// it takes BF16 weights; F32 otherwise.
DType matmul_dtype_for(const Backend& backend, const ModelConfig& config, const std::string& stored);

// Chooses the projection dtype with matmul_dtype_for and uploads the weights of an exported model.
struct ModelFile;
Result<ModelWeights> load_model_weights(Backend& backend, const ModelFile& model);
// The same with the projections in `matmul_dtype` (which the backend's matmul must take). Its FP32 and
// BF16 tensors are converted straight from the mapped file, without an FP32 copy of each.
Result<ModelWeights> load_model_weights(Backend& backend, const ModelFile& model, DType matmul_dtype);

// Every tensor name the model needs, with its expected shape (the writer and the checks use it).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool projection = false;  // a matmul weight (stored in the model dtype); else kept F32
};
std::vector<WeightSpec> weight_specs(const ModelConfig& config, int64_t pointer_dim);

}  // namespace kev
