// Weight upload (model/weights.h): projections of one input stacked into one weight in the order the
// forward slices them, the FP16 conversion's exactness and refusals, and exported files read in place.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "io/safetensors.h"
#include "io/temp_dir.h"
#include "model/checkpoint_import.h"
#include "model/model_file.h"

namespace kev {
namespace {

const std::string kBase = std::string(KEV_FIXTURES_DIR) + "/golden/tiny";

Result<OpenedCheckpoint> tiny() {
  EXPECT_TRUE(std::filesystem::exists(kBase + "/head.pt")) << "missing fixture " << kBase;
  return open_checkpoint(kBase, kBase);
}

std::vector<float> read_f32(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const Status s = b.download(t, v.data(), v.size() * sizeof(float));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return v;
}

// The source's tensors `names`, concatenated by rows.
std::vector<float> stacked(const TensorSource& source, const std::vector<std::string>& names) {
  std::vector<float> all;
  for (const std::string& n : names) {
    auto t = source(n);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (t.ok()) all.insert(all.end(), t->data.begin(), t->data.end());
  }
  return all;
}

TEST(Weights, StackedProjectionsHoldTheirPartsInForwardOrder) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  auto w = upload_weights(**backend, ck->config, ck->meta.pointer_dim, ck->tensors, DType::F32);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const ModelConfig& c = ck->config;
  bool saw_gdn = false;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeights& L = w->layers[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    EXPECT_EQ(read_f32(**backend, L.gate_up_proj), stacked(ck->tensors, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}))
        << "layer " << i;
    EXPECT_EQ(L.gate_up_proj.shape[0], 2 * c.n_ff);
    if (L.type != LayerType::GatedDeltaNet) continue;
    saw_gdn = true;
    const std::string a = p + "linear_attn.";
    EXPECT_EQ(read_f32(**backend, L.gdn.in_proj),
              stacked(ck->tensors, {a + "in_proj_qkv.weight", a + "in_proj_z.weight", a + "in_proj_b.weight",
                                    a + "in_proj_a.weight"}))
        << "layer " << i;
    EXPECT_EQ(L.gdn.in_proj.shape[0], c.gdn_conv_channels() + c.gdn_n_v_heads * c.gdn_v_dim + 2 * c.gdn_n_v_heads);
  }
  EXPECT_TRUE(saw_gdn);
}

// BF16 values convert to FP16 exactly from FP16's smallest normal up (the fixture's weights, rounded
// to BF16 first as a bf16 export holds them).
TEST(Weights, Fp16ProjectionsAreTheBf16ValuesExactly) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const TensorSource bf16_source = [&](const std::string& name) -> Result<HostTensor> {
    KEV_ASSIGN_OR_RETURN(HostTensor t, ck->tensors(name));
    for (float& v : t.data) v = bf16_to_f32(f32_to_bf16(v));
    return t;
  };
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  auto w = upload_weights(**backend, ck->config, ck->meta.pointer_dim, bf16_source, DType::F16);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const Tensor& t = w->layers[0].gate_up_proj;
  ASSERT_EQ(t.dtype, DType::F16);
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  ASSERT_TRUE((*backend)->download(t, bits.data(), bits.size() * 2).ok());
  const std::vector<float> want = stacked(bf16_source, {"layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"});
  ASSERT_EQ(bits.size(), want.size());
  size_t checked = 0, inexact = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    if (std::fabs(want[i]) < 0x1p-14f) continue;  // FP16 subnormals: rounded (absolute error <= 2^-25)
    ++checked;
    inexact += f16_to_f32(bits[i]) != want[i];
  }
  EXPECT_GT(checked, bits.size() / 2);
  EXPECT_EQ(inexact, 0u);
}

TEST(Weights, Fp16ConversionRefusesValuesBeyondItsRangeNamingTheWeight) {
  auto ck = tiny();
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const TensorSource source = [&](const std::string& name) -> Result<HostTensor> {
    KEV_ASSIGN_OR_RETURN(HostTensor t, ck->tensors(name));
    if (name == "layers.1.mlp.up_proj.weight") t.data[7] = 70000.0f;
    return t;
  };
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  // The same weights load as FP32 (no range limit) ...
  ASSERT_TRUE(upload_weights(**backend, ck->config, ck->meta.pointer_dim, source, DType::F32).ok());
  // ... and are refused as FP16, naming the (stacked) weight, the value and the limit.
  auto w = upload_weights(**backend, ck->config, ck->meta.pointer_dim, source, DType::F16);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::InvalidArtifact);
  const std::string m = w.status().to_string();
  EXPECT_NE(m.find("layers.1.mlp.up_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("70000"), std::string::npos) << m;
  EXPECT_NE(m.find("65504"), std::string::npos) << m;
}

// The tiny checkpoint exported in `dtype` ("fp32" | "bf16") under tmp.
ModelFile exported(const testing::TempDir& tmp, const std::string& dtype) {
  ImportOptions o;
  o.checkpoint_dir = o.base_dir = kBase;
  o.out_dir = tmp.path(dtype);
  o.dtype = dtype;
  EXPECT_TRUE(export_checkpoint(o).ok());
  auto model = read_model_file(o.out_dir);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  return model.ok() ? *model : ModelFile{};
}

std::vector<uint8_t> bytes_of(Backend& b, const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
  EXPECT_TRUE(b.download(t, v.data(), v.size()).ok());
  return v;
}

// An exported file's FP32 and BF16 tensors are converted straight from the mapped file: every weight
// has the bits the FP32 tensor-source path gives (read_f32, then converted), in each projection dtype.
TEST(Weights, ExportedFilesLoadInPlaceWithTheTensorSourceBits) {
  testing::TempDir tmp;
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  for (const std::string stored : {"fp32", "bf16"}) {
    const ModelFile model = exported(tmp, stored);
    auto file = SafetensorsFile::open(model.weights_path());
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    const TensorSource widened = [&](const std::string& name) { return file->read_f32(name); };
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      auto direct = load_model_weights(**backend, model, dtype);
      auto via = upload_weights(**backend, model.config, model.kev.pointer_dim, widened, dtype);
      ASSERT_TRUE(direct.ok() && via.ok()) << stored << " " << dtype_name(dtype);
      const LayerWeights &d0 = direct->layers[0], &v0 = via->layers[0];
      EXPECT_EQ(d0.gate_up_proj.dtype, dtype);
      EXPECT_EQ(bytes_of(**backend, d0.gate_up_proj), bytes_of(**backend, v0.gate_up_proj)) << stored;
      EXPECT_EQ(bytes_of(**backend, d0.down_proj), bytes_of(**backend, v0.down_proj)) << stored;
      EXPECT_EQ(bytes_of(**backend, d0.input_norm), bytes_of(**backend, v0.input_norm)) << stored;
      EXPECT_EQ(bytes_of(**backend, direct->embed), bytes_of(**backend, via->embed)) << stored;
      EXPECT_EQ(bytes_of(**backend, direct->head.k_weight), bytes_of(**backend, via->head.k_weight)) << stored;
      EXPECT_EQ(direct->bytes, via->bytes);
    }
  }
}

// A stored BF16 infinity (bit pattern 0x7F80) is refused naming its weight, read in place as it is.
TEST(Weights, AnInfiniteBf16ValueInAFileIsRefusedNamingTheWeight) {
  testing::TempDir tmp;
  const ModelFile model = exported(tmp, "bf16");
  uint64_t offset = 0;
  {
    auto file = SafetensorsFile::open(model.weights_path());
    ASSERT_TRUE(file.ok());
    const SafeTensorInfo* info = file->find("layers.1.mlp.down_proj.weight");
    ASSERT_NE(info, nullptr);
    ASSERT_EQ(info->dtype, StDtype::BF16);
    offset = info->offset + 2 * 5;
  }
  {
    std::fstream f(model.weights_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    const char inf[2] = {'\x80', '\x7f'};  // 0x7F80, little-endian
    f.write(inf, 2);
    ASSERT_TRUE(f.good());
  }
  auto backend = create_backend("cpu", {});
  ASSERT_TRUE(backend.ok());
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    auto w = load_model_weights(**backend, model, dtype);
    ASSERT_FALSE(w.ok()) << dtype_name(dtype);
    EXPECT_EQ(w.status().code(), ErrorCode::InvalidArtifact);
    EXPECT_NE(w.status().to_string().find("'layers.1.mlp.down_proj.weight' holds a non-finite value"),
              std::string::npos)
        << w.status().to_string();
  }
}

}  // namespace
}  // namespace kev
