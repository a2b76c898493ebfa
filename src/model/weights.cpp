#include "model/weights.h"

#include <cmath>

#include "common/bf16.h"
#include "common/check.h"
#include "io/safetensors.h"
#include "model/model_file.h"

namespace kev {

namespace {

std::string layer_prefix(int64_t i) { return cat("layers.", i, "."); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// HF stores the depthwise conv as [C, 1, K]; we use [C, K]. Any shape with the same elements in the
// same order is accepted for it.
bool shape_matches(const WeightSpec& spec, const std::vector<int64_t>& got) {
  if (got == spec.shape) return true;
  if (spec.name.ends_with("conv1d.weight") && got.size() == 3 && got[1] == 1)
    return got[0] == spec.shape[0] && got[2] == spec.shape[1];
  return false;
}

}  // namespace

std::vector<WeightSpec> weight_specs(const ModelConfig& c, int64_t pointer_dim) {
  const int64_t d = c.n_embd;
  std::vector<WeightSpec> specs;
  specs.push_back({"embed_tokens.weight", {c.n_vocab, d}, false});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = layer_prefix(i);
    specs.push_back({p + "input_layernorm.weight", {d}, false});
    specs.push_back({p + "post_attention_layernorm.weight", {d}, false});
    if (c.layer_types[i] == LayerType::FullAttention) {
      const int64_t hd = c.head_dim;
      specs.push_back({p + "self_attn.q_proj.weight", {c.n_head * hd * 2, d}, true});
      specs.push_back({p + "self_attn.k_proj.weight", {c.n_head_kv * hd, d}, true});
      specs.push_back({p + "self_attn.v_proj.weight", {c.n_head_kv * hd, d}, true});
      specs.push_back({p + "self_attn.o_proj.weight", {d, c.n_head * hd}, true});
      specs.push_back({p + "self_attn.q_norm.weight", {hd}, false});
      specs.push_back({p + "self_attn.k_norm.weight", {hd}, false});
    } else {
      const int64_t hv = c.gdn_n_v_heads, dv = c.gdn_v_dim;
      specs.push_back({p + "linear_attn.in_proj_qkv.weight", {c.gdn_conv_channels(), d}, true});
      specs.push_back({p + "linear_attn.in_proj_z.weight", {hv * dv, d}, true});
      specs.push_back({p + "linear_attn.in_proj_b.weight", {hv, d}, true});
      specs.push_back({p + "linear_attn.in_proj_a.weight", {hv, d}, true});
      specs.push_back({p + "linear_attn.conv1d.weight", {c.gdn_conv_channels(), c.gdn_conv_kernel}, false});
      specs.push_back({p + "linear_attn.A_log", {hv}, false});
      specs.push_back({p + "linear_attn.dt_bias", {hv}, false});
      specs.push_back({p + "linear_attn.norm.weight", {dv}, false});
      specs.push_back({p + "linear_attn.out_proj.weight", {d, hv * dv}, true});
    }
    specs.push_back({p + "mlp.gate_proj.weight", {c.n_ff, d}, true});
    specs.push_back({p + "mlp.up_proj.weight", {c.n_ff, d}, true});
    specs.push_back({p + "mlp.down_proj.weight", {d, c.n_ff}, true});
  }
  specs.push_back({"norm.weight", {d}, false});
  specs.push_back({"kev_head.q.weight", {pointer_dim, d}, false});
  specs.push_back({"kev_head.q.bias", {pointer_dim}, false});
  specs.push_back({"kev_head.k.weight", {pointer_dim, d}, false});
  specs.push_back({"kev_head.k.bias", {pointer_dim}, false});
  return specs;
}

namespace {

class Uploader {
 public:
  Uploader(Backend& backend, const TensorSource& source, DType matmul_dtype, ModelWeights& out)
      : backend_(backend), source_(source), matmul_dtype_(matmul_dtype), out_(out) {}

  Result<Tensor> load(const WeightSpec& spec) {
    KEV_ASSIGN_OR_RETURN(HostTensor host, source_(spec.name));
    KEV_CHECK(shape_matches(spec, host.shape), ErrorCode::InvalidArtifact, "weight '", spec.name,
              "' has shape ", shape_text(host.shape), "; the model configuration needs ", shape_text(spec.shape));
    for (float v : host.data) {
      KEV_CHECK(std::isfinite(v), ErrorCode::InvalidArtifact, "weight '", spec.name, "' holds a non-finite value");
    }
    const DType dtype = spec.projection ? matmul_dtype_ : DType::F32;
    const size_t n = host.data.size();
    const size_t bytes = n * dtype_size(dtype);
    KEV_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, backend_.alloc(bytes, BufferUsage::Weights));
    Tensor t;
    if (spec.shape.size() == 1) {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {spec.shape[0]});
    } else {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {spec.shape[0], spec.shape[1]});
    }
    if (dtype == DType::BF16) {
      std::vector<uint16_t> half(n);
      f32_to_bf16(host.data.data(), half.data(), n);
      KEV_TRY(backend_.upload(t, half.data(), bytes));
    } else {
      KEV_TRY(backend_.upload(t, host.data.data(), bytes));
    }
    out_.bytes += bytes;
    out_.buffers.push_back(std::move(buffer));
    return t;
  }

 private:
  Backend& backend_;
  const TensorSource& source_;
  DType matmul_dtype_;
  ModelWeights& out_;
};

}  // namespace

Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, int64_t pointer_dim,
                                    const TensorSource& source, DType matmul_dtype) {
  ModelWeights w;
  w.pointer_dim = pointer_dim;
  w.matmul_dtype = matmul_dtype;
  w.layers.resize(static_cast<size_t>(config.n_layers));
  Uploader up(backend, source, matmul_dtype, w);
  for (const WeightSpec& spec : weight_specs(config, pointer_dim)) {
    KEV_ASSIGN_OR_RETURN(Tensor t, up.load(spec));
    const std::string& n = spec.name;
    if (n == "embed_tokens.weight") { w.embed = t; continue; }
    if (n == "norm.weight") { w.final_norm = t; continue; }
    if (n == "kev_head.q.weight") { w.head.q_weight = t; continue; }
    if (n == "kev_head.q.bias") { w.head.q_bias = t; continue; }
    if (n == "kev_head.k.weight") { w.head.k_weight = t; continue; }
    if (n == "kev_head.k.bias") { w.head.k_bias = t; continue; }
    // "layers.<i>.<rest>"
    const size_t dot = n.find('.', 7);
    const int64_t i = std::stoll(n.substr(7, dot - 7));
    const std::string rest = n.substr(dot + 1);
    LayerWeights& L = w.layers[static_cast<size_t>(i)];
    L.type = config.layer_types[static_cast<size_t>(i)];
    if (rest == "input_layernorm.weight") L.input_norm = t;
    else if (rest == "post_attention_layernorm.weight") L.post_norm = t;
    else if (rest == "self_attn.q_proj.weight") L.attn.q_proj = t;
    else if (rest == "self_attn.k_proj.weight") L.attn.k_proj = t;
    else if (rest == "self_attn.v_proj.weight") L.attn.v_proj = t;
    else if (rest == "self_attn.o_proj.weight") L.attn.o_proj = t;
    else if (rest == "self_attn.q_norm.weight") L.attn.q_norm = t;
    else if (rest == "self_attn.k_norm.weight") L.attn.k_norm = t;
    else if (rest == "linear_attn.in_proj_qkv.weight") L.gdn.in_proj_qkv = t;
    else if (rest == "linear_attn.in_proj_z.weight") L.gdn.in_proj_z = t;
    else if (rest == "linear_attn.in_proj_b.weight") L.gdn.in_proj_b = t;
    else if (rest == "linear_attn.in_proj_a.weight") L.gdn.in_proj_a = t;
    else if (rest == "linear_attn.conv1d.weight") L.gdn.conv1d = t;
    else if (rest == "linear_attn.A_log") L.gdn.a_log = t;
    else if (rest == "linear_attn.dt_bias") L.gdn.dt_bias = t;
    else if (rest == "linear_attn.norm.weight") L.gdn.norm = t;
    else if (rest == "linear_attn.out_proj.weight") L.gdn.out_proj = t;
    else if (rest == "mlp.gate_proj.weight") L.gate_proj = t;
    else if (rest == "mlp.up_proj.weight") L.up_proj = t;
    else if (rest == "mlp.down_proj.weight") L.down_proj = t;
    else return Status(ErrorCode::Internal, cat("weight spec '", n, "' has no slot"));
  }
  return w;
}

DType matmul_dtype_for(const Backend& backend, const ModelConfig& config, const std::string& stored) {
  if (stored != "bf16") return DType::F32;
  const int64_t d = config.n_embd;
  Tensor x, w, out;
  x.dtype = out.dtype = DType::F32;
  w.dtype = DType::BF16;
  x.rank = w.rank = out.rank = 2;
  x.shape = out.shape = {1, d};
  w.shape = {d, d};
  x.stride = w.stride = out.stride = {d, 1};
  return backend.supports(OpDesc{OpKind::Matmul, {x, w, Tensor(), out}}) ? DType::BF16 : DType::F32;
}

Result<ModelWeights> load_model_weights(Backend& backend, const ModelFile& model) {
  const DType matmul_dtype = matmul_dtype_for(backend, model.config, model.kev.dtype);
  KEV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(model.weights_path()));
  const TensorSource source = [&](const std::string& name) -> Result<HostTensor> {
    KEV_CHECK(file.find(name) != nullptr, ErrorCode::InvalidArtifact, model.weights_path(), " has no tensor '",
              name, "'; re-export the model with kev_export");
    return file.read_f32(name);
  };
  return upload_weights(backend, model.config, model.kev.pointer_dim, source, matmul_dtype);
}

}  // namespace kev
