// Weight upload (model/weights.h): projections of one input stacked into one weight in the order the
// forward slices them, and the FP16 conversion's exactness and refusals.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "model/checkpoint_import.h"

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

}  // namespace
}  // namespace kev
