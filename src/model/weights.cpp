#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
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

// A weight's values as the loader reads them: n FP32 values, or n BF16 bit patterns as a bf16 export
// stores them, at `bytes` — a mapped file's bytes, so unaligned: read through memcpy (plain loads).
struct Values {
  const uint8_t* bytes = nullptr;
  int64_t n = 0;
  bool bf16 = false;
};

inline float value_at(const uint8_t* bytes, int64_t i, bool bf16) {
  if (bf16) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    return bf16_to_f32(h);
  }
  float v;
  std::memcpy(&v, bytes + 4 * i, 4);
  return v;
}

// A weight read by name: its shape and values. `owned` holds values the reader had to compute (a
// checkpoint's merged LoRA, a widened F16 tensor), which stay valid until the next read.
struct ReadWeight {
  std::vector<int64_t> shape;
  Values values;
};
using WeightReader = std::function<Result<ReadWeight>(const std::string& name, HostTensor& owned)>;

// Whether v's bytes are already what a weight of dtype holds (FP32 for FP32, BF16 for BF16).
bool same_bits(const Values& v, DType dtype) { return v.bf16 ? dtype == DType::BF16 : dtype == DType::F32; }

ReadWeight owned_values(HostTensor& owned) {
  return {owned.shape, Values{reinterpret_cast<const uint8_t*>(owned.data.data()),
                              static_cast<int64_t>(owned.data.size()), false}};
}

class Uploader {
 public:
  Uploader(Backend& backend, const WeightReader& reader, DType matmul_dtype, ModelWeights& out)
      : backend_(backend), reader_(reader), matmul_dtype_(matmul_dtype), out_(out) {}

  Result<Tensor> load(const WeightSpec& spec) {
    const DType dtype = spec.projection ? matmul_dtype_ : DType::F32;
    KEV_ASSIGN_OR_RETURN(Values v, read(spec, dtype));
    if (same_bits(v, dtype)) return upload(spec.shape, dtype, v.n, v.bytes);
    uint8_t* staging = reserve_staging(v.n, dtype);
    convert(v, dtype, staging);
    return upload(spec.shape, dtype, v.n, staging);
  }

  // Projections of one input stacked by rows into one weight [Σ m_i, k] (one GEMM instead of several):
  // each part is read and converted into its rows of one staging buffer, which is uploaded once.
  Result<Tensor> load_stacked(std::span<const WeightSpec> parts) {
    const DType dtype = matmul_dtype_;
    int64_t rows = 0;
    for (const WeightSpec& spec : parts) rows += spec.shape[0];
    const int64_t n = rows * parts[0].shape[1];
    uint8_t* staging = reserve_staging(n, dtype);
    int64_t at = 0;
    for (const WeightSpec& spec : parts) {
      KEV_ASSIGN_OR_RETURN(Values v, read(spec, dtype));
      convert(v, dtype, staging + at * static_cast<int64_t>(dtype_size(dtype)));
      at += spec.shape[0] * spec.shape[1];
    }
    return upload({rows, parts[0].shape[1]}, dtype, n, staging);
  }

 private:
  // The element loops over whole tensors run on all cores (parallel_chunks), a bf16 export's values go
  // straight from the mapped file to the backend's dtype, and the staging buffers are reused from
  // tensor to tensor: a 4B model has ~4·10⁹ elements, and a CPU profile of the load had its time in
  // fresh pages, FP32 copies and single-threaded loops (docs/benchmarks.md, Load time).
  static constexpr int64_t kGrain = 1 << 20;

  // Reads spec's values and checks its shape, that every value is finite and, for an FP16 weight, that
  // every value lies within FP16's range.
  Result<Values> read(const WeightSpec& spec, DType dtype) {
    KEV_ASSIGN_OR_RETURN(ReadWeight w, reader_(spec.name, owned_));
    KEV_CHECK(shape_matches(spec, w.shape), ErrorCode::InvalidArtifact, "weight '", spec.name, "' has shape ",
              shape_text(w.shape), "; the model configuration needs ", shape_text(spec.shape));
    const Values v = w.values;
    // A bad value: non-finite, or beyond FP16's range for an FP16 weight (|x| > limit, ∞ included).
    const float limit = dtype == DType::F16 ? kF16Max : std::numeric_limits<float>::max();
    auto bad_at = [&v, limit]<bool kBf16>(int64_t i) { return !(std::fabs(value_at(v.bytes, i, kBf16)) <= limit); };
    const int64_t bad = v.bf16 ? parallel_find_first(v.n, kGrain, [&](int64_t i) { return bad_at.operator()<true>(i); })
                               : parallel_find_first(v.n, kGrain, [&](int64_t i) { return bad_at.operator()<false>(i); });
    if (bad < v.n) {
      const float x = value_at(v.bytes, bad, v.bf16);
      KEV_CHECK(std::isfinite(x), ErrorCode::InvalidArtifact, "weight '", spec.name, "' holds a non-finite value");
      return Status(ErrorCode::InvalidArtifact,
                    cat("weight '", spec.name, "' holds ", x, ", beyond FP16's range (", kF16Max,
                        "); load this model with 16-bit GEMMs in BF16 (CUDA: --cuda-gemm bf16x2)"));
    }
    return v;
  }

  // A staging buffer of n elements of dtype; it only grows, so its pages are touched once per load.
  uint8_t* reserve_staging(int64_t n, DType dtype) {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    if (staging_.size() < bytes) staging_.resize(bytes);
    return staging_.data();
  }

  // v's values in dtype at dst, on all cores: BF16 to BF16 and FP32 to FP32 are copies, the rest round
  // to nearest even (to FP16 within its range, which read() checked).
  void convert(const Values& v, DType dtype, uint8_t* dst) {
    parallel_chunks(v.n, kGrain, [&](int64_t begin, int64_t end) {
      const auto count = static_cast<size_t>(end - begin);
      const uint8_t* src = v.bytes + begin * (v.bf16 ? 2 : 4);
      uint8_t* out = dst + begin * static_cast<int64_t>(dtype_size(dtype));
      if (same_bits(v, dtype)) {
        std::memcpy(out, src, count * dtype_size(dtype));
      } else if (dtype == DType::F32) {
        convert_range<DType::F32>(src, v.bf16, out, count);
      } else if (dtype == DType::F16) {
        convert_range<DType::F16>(src, v.bf16, out, count);
      } else {
        convert_range<DType::BF16>(src, v.bf16, out, count);
      }
    });
  }

  template <DType kOut>
  static void convert_range(const uint8_t* src, bool bf16, uint8_t* out, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const float x = value_at(src, static_cast<int64_t>(i), bf16);
      if constexpr (kOut == DType::F32) {
        std::memcpy(out + 4 * i, &x, 4);
      } else {
        const uint16_t h = kOut == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
        std::memcpy(out + 2 * i, &h, 2);
      }
    }
  }

  Result<Tensor> upload(const std::vector<int64_t>& shape, DType dtype, int64_t n, const uint8_t* data) {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    KEV_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, backend_.alloc(bytes, BufferUsage::Weights));
    Tensor t;
    if (shape.size() == 1) {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {shape[0]});
    } else {
      t = Tensor::contiguous(buffer.get(), 0, dtype, {shape[0], shape[1]});
    }
    KEV_TRY(backend_.upload(t, data, bytes));
    out_.bytes += bytes;
    out_.buffers.push_back(std::move(buffer));
    return t;
  }

  Backend& backend_;
  const WeightReader& reader_;
  DType matmul_dtype_;
  ModelWeights& out_;
  HostTensor owned_;              // values the reader computed, for the weight being loaded
  std::vector<uint8_t> staging_;  // reused: a weight converted to the backend's dtype, or a stack of them
};

Result<ModelWeights> upload_from(Backend& backend, const ModelConfig& config, int64_t pointer_dim,
                                 const WeightReader& reader, DType matmul_dtype) {
  ModelWeights w;
  w.pointer_dim = pointer_dim;
  w.matmul_dtype = matmul_dtype;
  w.layers.resize(static_cast<size_t>(config.n_layers));
  Uploader up(backend, reader, matmul_dtype, w);
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

}  // namespace

Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, int64_t pointer_dim,
                                    const TensorSource& source, DType matmul_dtype) {
  const WeightReader reader = [&](const std::string& name, HostTensor& owned) -> Result<ReadWeight> {
    KEV_ASSIGN_OR_RETURN(owned, source(name));
    return owned_values(owned);
  };
  return upload_from(backend, config, pointer_dim, reader, matmul_dtype);
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
  return load_model_weights(backend, model, matmul_dtype_for(backend, model.config, model.kev.dtype));
}

Result<ModelWeights> load_model_weights(Backend& backend, const ModelFile& model, DType matmul_dtype) {
  KEV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(model.weights_path()));
  // FP32 and BF16 tensors are read in place from the mapped file; others widened to FP32 first.
  const WeightReader reader = [&](const std::string& name, HostTensor& owned) -> Result<ReadWeight> {
    const SafeTensorInfo* info = file.find(name);
    KEV_CHECK(info != nullptr, ErrorCode::InvalidArtifact, model.weights_path(), " has no tensor '", name,
              "'; re-export the model with kev_export");
    if (info->dtype == StDtype::F32 || info->dtype == StDtype::BF16) {
      return ReadWeight{info->shape, Values{file.bytes(*info).data(), info->numel(), info->dtype == StDtype::BF16}};
    }
    KEV_ASSIGN_OR_RETURN(owned, file.read_f32(*info));
    return owned_values(owned);
  };
  return upload_from(backend, model.config, model.kev.pointer_dim, reader, matmul_dtype);
}

}  // namespace kev
