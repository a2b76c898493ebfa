#include "model/synthetic.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/bf16.h"
#include "common/check.h"
#include "common/hash.h"
#include "io/safetensors.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "text/encode.h"
#include "text/tokenizer.h"

namespace kev {

namespace {

ModelConfig base_config() {
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  c.n_vocab = 248320;
  c.rms_eps = 1e-6;
  c.head_dim = 256;
  c.n_rot = 64;
  c.rope_theta = 1e7;
  c.gdn_k_dim = c.gdn_v_dim = 128;
  c.gdn_conv_kernel = 4;
  return c;
}

void set_layers(ModelConfig& c, int64_t n_layers) {
  c.n_layers = n_layers;
  c.layer_types.clear();
  for (int64_t i = 0; i < n_layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::GatedDeltaNet);
}

// splitmix64: a tiny, high-quality stream per tensor, so any tensor regenerates independently.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

// How each tensor is drawn: value = offset + scale * u, u uniform in [-1, 1), or a custom map.
struct Init {
  float offset = 0, scale = 0;
  enum class Kind { Uniform, ALog, DtBias } kind = Kind::Uniform;
};

Init init_for(const std::string& name, int64_t fan_in) {
  const float std02 = 0.02f * std::sqrt(3.0f);  // uniform with standard deviation 0.02
  if (name.ends_with("A_log")) return {0, 0, Init::Kind::ALog};
  if (name.ends_with("dt_bias")) return {0, 0, Init::Kind::DtBias};
  if (name.ends_with("linear_attn.norm.weight")) return {1.0f, 0.1f};   // plain gain around 1
  if (name.find("layernorm") != std::string::npos || name.ends_with("norm.weight")) return {0.0f, 0.1f};  // 1+w
  if (name.ends_with("conv1d.weight")) return {0.0f, 0.5f};
  if (name.starts_with("kev_head.") && name.ends_with("bias")) return {0.0f, 0.01f};
  if (name.starts_with("kev_head.")) return {0.0f, std::sqrt(3.0f / static_cast<float>(fan_in))};
  return {0.0f, std02};
}

float draw(const Init& init, Rng& rng) {
  const float u = rng.uniform();
  switch (init.kind) {
    case Init::Kind::ALog: return std::log(1.0f + 15.0f * u);  // decay rates exp(A_log) in [1, 16)
    case Init::Kind::DtBias: return -5.0f + 4.0f * u;          // softplus(dt_bias) in ~[0.007, 0.31]
    case Init::Kind::Uniform: break;
  }
  return init.offset + init.scale * (2.0f * u - 1.0f);
}

}  // namespace

std::vector<std::string> synthetic_kinds() { return {"tiny", "0.8b", "4b", "9b"}; }

Result<ModelConfig> synthetic_config(const std::string& kind) {
  ModelConfig c = base_config();
  if (kind == "tiny") {
    c.n_embd = 128;
    set_layers(c, 4);
    c.n_head = 2, c.n_head_kv = 1, c.head_dim = 64, c.n_rot = 16;
    c.gdn_n_k_heads = 2, c.gdn_n_v_heads = 4, c.gdn_k_dim = c.gdn_v_dim = 32;
    c.n_ff = 256;
    c.n_vocab = 151936;
  } else if (kind == "0.8b") {
    c.n_embd = 1024;
    set_layers(c, 24);
    c.n_head = 8, c.n_head_kv = 2;
    c.gdn_n_k_heads = 16, c.gdn_n_v_heads = 16;
    c.n_ff = 3584;
  } else if (kind == "4b") {
    c.n_embd = 2560;
    set_layers(c, 32);
    c.n_head = 16, c.n_head_kv = 4;
    c.gdn_n_k_heads = 16, c.gdn_n_v_heads = 32;
    c.n_ff = 9216;
  } else if (kind == "9b") {
    c.n_embd = 4096;
    set_layers(c, 32);
    c.n_head = 16, c.n_head_kv = 4;
    c.gdn_n_k_heads = 16, c.gdn_n_v_heads = 32;
    c.n_ff = 12288;
  } else {
    return Status(ErrorCode::InvalidRequest, cat("unknown synthetic model '", kind, "'; choose tiny, 0.8b, 4b or 9b"));
  }
  return c;
}

double synthetic_temperature(const std::string& kind) {
  if (kind == "0.8b") return 2.35;
  if (kind == "4b") return 2.41;
  if (kind == "9b") return 2.30;
  return 1.0;
}

Status write_synthetic_model(const SyntheticOptions& o) {
  KEV_ASSIGN_OR_RETURN(ModelConfig config, synthetic_config(o.kind));
  KEV_CHECK(o.dtype == "fp32" || o.dtype == "bf16", ErrorCode::InvalidRequest, "dtype '", o.dtype,
            "' is not one of fp32, bf16");
  KEV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(o.tokenizer_path));
  KEV_ASSIGN_OR_RETURN(SpecialIds ids, resolve_special_ids(tokenizer));
  config.n_vocab = std::max<int64_t>(config.n_vocab, tokenizer.vocab_size());

  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot create '", o.out_dir, "': ", ec.message());

  KevMetadata meta;
  meta.name = cat("kev-synthetic-", o.kind);
  meta.temperature = synthetic_temperature(o.kind);
  meta.checkpoint_id = cat("synthetic:", o.kind, ":", o.seed);
  meta.pointer_dim = 256;
  meta.special_ids = ids;
  meta.dtype = o.dtype;
  meta.backend = o.backend;
  meta.source = cat("kev_export --synthetic ", o.kind, " --seed ", o.seed, " (random weights; answers are meaningless)");

  SafetensorsWriter writer;
  writer.set_metadata("format", "kev-native");
  for (const WeightSpec& spec : weight_specs(config, meta.pointer_dim)) {
    const bool half = spec.projection && o.dtype == "bf16";
    const int64_t fan_in = spec.shape.back();
    const Init init = init_for(spec.name, fan_in);
    int64_t numel = 1;
    for (int64_t s : spec.shape) numel *= s;
    const uint64_t seed = o.seed * 0x9E3779B97F4A7C15ull ^ fnv1a64(spec.name);
    TensorProducer produce = [numel, init, seed, half](ByteSink& sink) -> Status {
      Rng rng{seed};
      constexpr int64_t kChunk = 1 << 16;
      std::vector<float> buf(kChunk);
      std::vector<uint16_t> hbuf(half ? kChunk : 0);
      for (int64_t done = 0; done < numel; done += kChunk) {
        const int64_t n = std::min(kChunk, numel - done);
        for (int64_t i = 0; i < n; ++i) buf[i] = draw(init, rng);
        if (half) {
          f32_to_bf16(buf.data(), hbuf.data(), static_cast<size_t>(n));
          KEV_TRY(sink.write({reinterpret_cast<const uint8_t*>(hbuf.data()), static_cast<size_t>(n) * 2}));
        } else {
          KEV_TRY(sink.write({reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(n) * 4}));
        }
      }
      return Status::success();
    };
    KEV_TRY(writer.add_producer(spec.name, half ? StDtype::BF16 : StDtype::F32, spec.shape, std::move(produce)));
  }
  KEV_TRY(writer.write(o.out_dir + "/weights.safetensors", o.progress));

  {
    std::ofstream json(o.out_dir + "/model.json");
    json << model_json_text(config, meta);
    KEV_CHECK(json.good(), ErrorCode::Io, "cannot write '", o.out_dir, "/model.json'");
  }
  std::filesystem::copy_file(o.tokenizer_path, o.out_dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing, ec);
  KEV_CHECK(!ec, ErrorCode::Io, "cannot copy the tokenizer to '", o.out_dir, "': ", ec.message());
  return Status::success();
}

}  // namespace kev
