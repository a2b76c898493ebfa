// WebGPU-specific engine-level parity: the golden fixture's model on a WebGPU backend whose storage
// binding limit is lowered to 256 KiB (the test hook of webgpu_backend.h), so its 258 KiB embedding
// table is split into pieces at upload exactly as the 0.8B table (~1 GiB) is on lavapipe's real
// 128 MiB limit. The reused state after the state pass of each fixture request that fits the lowered
// limit (states of up to one 64-token GDN chunk) must match the CPU path. The unlowered
// backend's golden parity (HF probabilities, logits and state against the CPU, prefix bit-identical
// after 50 evaluations) is in gpu_parity_test.cpp, shared with CUDA.
#ifdef KEV_HAVE_WEBGPU

#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "backend/webgpu/webgpu_backend.h"
#include "golden_support.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/weights.h"

namespace kev {
namespace {

// Against the CPU FP32 path on the same weights: different summation orders only (as gpu_parity_test).
constexpr double kStateVsCpuTol = 2e-4;
constexpr uint64_t kLimit = uint64_t{256} << 10;
// A longer state's activations and GDN chunk matrices would not fit kLimit.
constexpr size_t kMaxStateTokens = 64;

struct Side {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
};

Side load(std::shared_ptr<Backend> backend, const ModelFile& model) {
  auto weights = load_model_weights(*backend, model);
  EXPECT_TRUE(weights.ok()) << weights.status().to_string();
  Side s{backend, nullptr};
  if (weights.ok()) s.runner = std::make_unique<ModelRunner>(backend, model.config, std::move(*weights), 1.0);
  return s;
}

double worst_diff(const Side& a, const Tensor& ta, const Side& b, const Tensor& tb) {
  std::vector<float> va(static_cast<size_t>(ta.numel())), vb(static_cast<size_t>(tb.numel()));
  EXPECT_TRUE(a.backend->download(ta, va.data(), va.size() * 4).ok());
  EXPECT_TRUE(b.backend->download(tb, vb.data(), vb.size() * 4).ok());
  double w = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) w = std::max(w, std::fabs(double(va[i]) - double(vb[i])));
  return w;
}

TEST(WebGpuGolden, SplitEmbeddingStateMatchesCpu) {
  auto gpu = create_webgpu_backend_with_binding_limit(BackendOptions{}, kLimit);
  if (!gpu.ok()) {
    std::printf("no WebGPU adapter: %s\n", gpu.status().to_string().c_str());
    GTEST_SKIP() << "no WebGPU adapter: " << gpu.status().to_string();
  }
  const golden::json expected = golden::read_json(golden::golden_dir() + "/expected.json");
  golden::ExportedModel exported(golden::golden_dir() + "/tiny", golden::golden_dir() + "/tiny", "webgpu-split");
  auto model = read_model_file(exported.dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const uint64_t table_bytes = static_cast<uint64_t>(model->config.n_vocab * model->config.n_embd) * sizeof(float);
  ASSERT_GT(table_bytes, kLimit) << "the fixture's table must exceed the lowered limit to be split";
  auto cpu_backend = create_backend("cpu", BackendOptions{});
  ASSERT_TRUE(cpu_backend.ok());
  Side cpu = load(*cpu_backend, *model);
  Side dev = load(*gpu, *model);
  ASSERT_TRUE(cpu.runner && dev.runner);
  double worst[4] = {0, 0, 0, 0};  // conv, recurrent, K, V
  int compared = 0;
  for (const golden::json& r : expected["requests"]) {
    const auto ids = r["state_ids"].get<std::vector<int32_t>>();
    if (ids.size() > kMaxStateTokens) continue;
    ++compared;
    auto pc = cpu.runner->prefill(ids);
    ASSERT_TRUE(pc.ok()) << pc.status().to_string();
    auto pd = dev.runner->prefill(ids);
    ASSERT_TRUE(pd.ok()) << pd.status().to_string();
    for (size_t i = 0; i < pc->conv.size(); ++i) {
      worst[0] = std::max(worst[0], worst_diff(cpu, pc->conv[i], dev, pd->conv[i]));
      worst[1] = std::max(worst[1], worst_diff(cpu, pc->recurrent[i], dev, pd->recurrent[i]));
    }
    for (size_t i = 0; i < pc->k.size(); ++i) {
      worst[2] = std::max(worst[2], worst_diff(cpu, pc->k[i], dev, pd->k[i]));
      worst[3] = std::max(worst[3], worst_diff(cpu, pc->v[i], dev, pd->v[i]));
    }
  }
  EXPECT_GE(compared, 3);
  for (double w : worst) EXPECT_LE(w, kStateVsCpuTol);
  std::printf("webgpu (256 KiB bindings, split table) vs cpu, %d state passes: max |Δ| conv %.3g, recurrent %.3g, "
              "K %.3g, V %.3g\n", compared, worst[0], worst[1], worst[2], worst[3]);
}

}  // namespace
}  // namespace kev

#endif  // KEV_HAVE_WEBGPU
