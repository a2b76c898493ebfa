#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "common/bf16.h"
#include "common/check.h"
#include "common/parallel.h"
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

constexpr float kF16Max = 65504.0f;

class Uploader {
 public:
  Uploader(Backend& backend, const TensorSource& source, DType matmul_dtype, ModelWeights& out)
      : backend_(backend), source_(source), matmul_dtype_(matmul_dtype), out_(out) {}

  Result<Tensor> load(const WeightSpec& spec) {
    KEV_ASSIGN_OR_RETURN(HostTensor host, read(spec));
    return put(spec.name, spec.shape, spec.projection, host.data);
  }

  // Projections of one input stacked by rows into one weight [Σ m_i, k] (one GEMM instead of several).
  Result<Tensor> load_stacked(std::span<const WeightSpec> parts) {
    int64_t rows = 0;
    for (const WeightSpec& spec : parts) rows += spec.shape[0];
    stacked_.resize(static_cast<size_t>(rows * parts[0].shape[1]));
    size_t at = 0;
    std::string name;
    for (const WeightSpec& spec : parts) {
      KEV_ASSIGN_OR_RETURN(HostTensor host, read(spec));
      std::copy(host.data.begin(), host.data.end(), stacked_.begin() + static_cast<std::ptrdiff_t>(at));
      at += host.data.size();
      name += (name.empty() ? "" : " + ") + spec.name;
    }
    return put(name, {rows, parts[0].shape[1]}, true, stacked_);
  }

 private:
  // The element loops over whole tensors run on all cores (parallel_chunks), and the stacking and
  // 16-bit buffers are reused from tensor to tensor: a 4B model has ~4·10⁹ elements, and a CPU profile
  // of the load had its time in fresh pages and single-threaded loops (docs/benchmarks.md, Load time).
  static constexpr int64_t kGrain = 1 << 20;

  Result<HostTensor> read(const WeightSpec& spec) {
    KEV_ASSIGN_OR_RETURN(HostTensor host, source_(spec.name));
    KEV_CHECK(shape_matches(spec, host.shape), ErrorCode::InvalidArtifact, "weight '", spec.name,
              "' has shape ", shape_text(host.shape), "; the model configuration needs ", shape_text(spec.shape));
    const float* v = host.data.data();
    const auto n = static_cast<int64_t>(host.data.size());
    const int64_t bad = parallel_find_first(n, kGrain, [v](int64_t i) { return !std::isfinite(v[i]); });
    KEV_CHECK(bad == n, ErrorCode::InvalidArtifact, "weight '", spec.name, "' holds a non-finite value");
    return host;
  }

  Result<Tensor> put(const std::string& name, const std::vector<int64_t>& shape, bool projection,
                     const std::vector<float>& data) {
    const DType dtype = projection ? matmul_dtype_ : DType::F32;
    const size_t n = data.size();
    const size_t bytes = n * dtype_size(dtype);
    KEV_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, backend_.alloc(bytes, BufferUsage::Weights));
    Tensor t;
    if (shape.size() == 1) {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {shape[0]});
    } else {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {shape[0], shape[1]});
    }
    if (dtype == DType::BF16 || dtype == DType::F16) {
      const float* v = data.data();
      if (dtype == DType::F16) {
        const int64_t bad =
            parallel_find_first(static_cast<int64_t>(n), kGrain, [v](int64_t i) { return std::fabs(v[i]) > kF16Max; });
        KEV_CHECK(bad == static_cast<int64_t>(n), ErrorCode::InvalidArtifact, "weight '", name, "' holds ",
                  bad < static_cast<int64_t>(n) ? v[bad] : 0.0f, ", beyond FP16's range (", kF16Max,
                  "); load this model with 16-bit GEMMs in BF16 (CUDA: --cuda-gemm bf16x2)");
      }
      half_.resize(n);
      uint16_t* h = half_.data();
      parallel_chunks(static_cast<int64_t>(n), kGrain, [&](int64_t begin, int64_t end) {
        if (dtype == DType::BF16) {
          f32_to_bf16(v + begin, h + begin, static_cast<size_t>(end - begin));
        } else {
          f32_to_f16(v + begin, h + begin, static_cast<size_t>(end - begin));
        }
      });
      KEV_TRY(backend_.upload(t, half_.data(), bytes));
    } else {
      KEV_TRY(backend_.upload(t, data.data(), bytes));
    }
    out_.bytes += bytes;
    out_.buffers.push_back(std::move(buffer));
    return t;
  }

  Backend& backend_;
  const TensorSource& source_;
  DType matmul_dtype_;
  ModelWeights& out_;
  std::vector<float> stacked_;  // reused: the stacked projections of one group
  std::vector<uint16_t> half_;  // reused: a projection converted to FP16 / BF16
};

}  // namespace

Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, int64_t pointer_dim,
                                    const TensorSource& source, DType matmul_dtype) {
  ModelWeights w;
  w.pointer_dim = pointer_dim;
  w.matmul_dtype = matmul_dtype;
  w.layers.resize(static_cast<size_t>(config.n_layers));
  Uploader up(backend, source, matmul_dtype, w);
  const std::vector<WeightSpec> specs = weight_specs(config, pointer_dim);
  for (size_t si = 0; si < specs.size(); ++si) {
    const WeightSpec& spec = specs[si];
    const std::string& n = spec.name;
    // A GDN layer's four input projections, an attention layer's q, k and v projections and the MLP's
    // gate and up projections each become one stacked weight (weight_specs lists each group's members
    // consecutively, first member first; attention's are stacked k, v, q so that K and V alone are a
    // prefix of the rows).
    const bool attention = n.ends_with(".self_attn.q_proj.weight");
    const size_t group = n.ends_with(".linear_attn.in_proj_qkv.weight") ? 4
                         : attention                                     ? 3
                         : n.ends_with(".mlp.gate_proj.weight")          ? 2
                                                                         : 1;
    if (group > 1) {
      KEV_CHECK(si + group <= specs.size(), ErrorCode::Internal, "weight group of '", n, "' is incomplete");
      std::vector<WeightSpec> parts(specs.begin() + static_cast<std::ptrdiff_t>(si),
                                    specs.begin() + static_cast<std::ptrdiff_t>(si + group));
      if (attention) {
        KEV_CHECK(parts[1].name.ends_with(".k_proj.weight") && parts[2].name.ends_with(".v_proj.weight"),
                  ErrorCode::Internal, "attention projections of '", n, "' are not listed q, k, v");
        std::rotate(parts.begin(), parts.begin() + 1, parts.end());  // k, v, q
      }
      KEV_ASSIGN_OR_RETURN(Tensor t, up.load_stacked(parts));
      const size_t dot = n.find('.', 7);
      LayerWeights& L = w.layers[static_cast<size_t>(std::stoll(n.substr(7, dot - 7)))];
      if (group == 4) {
        L.gdn.in_proj = t;
      } else if (attention) {
        L.attn.kvq_proj = t;
      } else {
        L.gate_up_proj = t;
      }
      si += group - 1;
      continue;
    }
    KEV_ASSIGN_OR_RETURN(Tensor t, up.load(spec));
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
    else if (rest == "self_attn.o_proj.weight") L.attn.o_proj = t;
    else if (rest == "self_attn.q_norm.weight") L.attn.q_norm = t;
    else if (rest == "self_attn.k_norm.weight") L.attn.k_norm = t;
    else if (rest == "linear_attn.conv1d.weight") L.gdn.conv1d = t;
    else if (rest == "linear_attn.A_log") L.gdn.a_log = t;
    else if (rest == "linear_attn.dt_bias") L.gdn.dt_bias = t;
    else if (rest == "linear_attn.norm.weight") L.gdn.norm = t;
    else if (rest == "linear_attn.out_proj.weight") L.gdn.out_proj = t;
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
  for (DType dt : {DType::F16, DType::BF16}) {
    w.dtype = dt;
    if (backend.supports(OpDesc{OpKind::Matmul, {x, w, Tensor(), out}})) return dt;
  }
  return DType::F32;
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
