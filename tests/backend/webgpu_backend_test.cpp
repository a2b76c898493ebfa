// The WebGPU backend against the CPU reference: every op case of the tables (op_cases_support.cpp),
// the reductions' subgroup and workgroup-memory variants, weights split at the binding limit, dispatch
// folding, upload ordering inside one pass, and the audit-only mode. Runs on whatever adapter Dawn
// finds (lavapipe in CI); without one the tests skip with the reason printed. Rerun one op with
// --gtest_filter='WebGpu/OpVsReference.Matches/matmul*'.
#ifdef KEV_HAVE_WEBGPU

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>

#include "backend/op_harness.h"
#include "backend/test_tensors.h"
#include "backend/webgpu/webgpu_backend.h"
#include "support/run_command.h"

namespace kev::optest {
namespace {

// The shared WebGPU backend, or null with the reason in `why` (no adapter on this machine).
// Never destroyed: released from a static destructor, after the NVIDIA Vulkan driver's own exit-time
// teardown, the device crashed the process at exit on the H200 (every test had passed).
std::shared_ptr<Backend> webgpu(std::string* why) {
  static std::shared_ptr<Backend>& b = *new std::shared_ptr<Backend>();
  static std::string reason;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto r = create_backend("webgpu", BackendOptions{});
    if (r.ok()) {
      b = r.value();
    } else {
      reason = r.status().to_string();
    }
  }
  if (why) *why = reason;
  return b;
}

// A second WebGPU backend on the same adapter whose kernels use the workgroup-memory reductions even
// where the adapter's subgroups pass the device's check (WebGpuTestHooks::subgroups = false), or null
// without an adapter. Never destroyed, as webgpu().
std::shared_ptr<Backend> webgpu_without_subgroups() {
  static std::shared_ptr<Backend>& b = *new std::shared_ptr<Backend>();
  static bool tried = false;
  if (!tried) {
    tried = true;
    WebGpuTestHooks hooks;
    hooks.subgroups = false;
    auto r = create_webgpu_backend_for_test(BackendOptions{}, hooks);
    if (r.ok()) b = r.value();
  }
  return b;
}

Backend& cpu_reference() {
  static std::shared_ptr<Backend> ref = [] {
    BackendOptions o;
    o.reference_mode = true;
    return create_backend("cpu", o).value();
  }();
  return *ref;
}

#define REQUIRE_WEBGPU(var)                                   \
  std::string why_;                                           \
  std::shared_ptr<Backend> var = webgpu(&why_);               \
  if (!var) {                                                 \
    std::printf("no WebGPU adapter: %s\n", why_.c_str());     \
    GTEST_SKIP() << "no WebGPU adapter: " << why_;            \
  }

TEST(WebGpu, ReportsAdapterAndLimits) {
  REQUIRE_WEBGPU(gpu);
  const BackendInfo info = gpu->info();
  EXPECT_EQ(info.name, "webgpu");
  EXPECT_FALSE(info.device.empty());
  std::printf("webgpu adapter: %s\n", info.device.c_str());
}

// Dawn's Null adapter (what Dawn offers when no Vulkan loader loads) runs no shaders: the device layer
// must refuse it with a clear error instead of computing garbage. Needs only Dawn, not a driver.
TEST(WebGpu, RefusesTheNullAdapter) {
  WebGpuTestHooks hooks;
  hooks.null_backend_only = true;
  auto r = create_webgpu_backend_for_test(BackendOptions{}, hooks);
  ASSERT_FALSE(r.ok()) << "the Null adapter was accepted: " << (*r)->info().device;
  EXPECT_EQ(r.status().code(), ErrorCode::Device) << r.status().to_string();
  EXPECT_NE(r.status().to_string().find("Null backend"), std::string::npos) << r.status().to_string();
}

// Runs `c` on `gpu` and on the CPU reference: the case must be supported and within its tolerance.
void expect_matches_reference(const OpCase& c, Backend& gpu) {
  const CaseReport r = run_case(c, gpu, cpu_reference());
  ASSERT_TRUE(r.supported) << r.message;
  EXPECT_TRUE(r.ok) << r.message;
  std::cout << r.message;
}

// `shared`, or (limit > 0) a backend planning with that storage binding limit.
std::shared_ptr<Backend> with_binding_limit(const std::shared_ptr<Backend>& shared, uint64_t limit) {
  if (limit == 0) return shared;
  auto limited = create_webgpu_backend_with_binding_limit(BackendOptions{}, limit);
  EXPECT_TRUE(limited.ok()) << limited.status().to_string();
  return limited.ok() ? *limited : nullptr;
}

// Test names of the edge tables (each entry's `name`).
template <const auto& kTable>
std::string edge_name(const ::testing::TestParamInfo<size_t>& info) {
  return kTable[info.param].name;
}

class OpVsReference : public ::testing::TestWithParam<size_t> {};

TEST_P(OpVsReference, Matches) {
  REQUIRE_WEBGPU(gpu);
  const OpCase& c = all_op_cases()[GetParam()];
  expect_matches_reference(c, *gpu);
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return std::string(op_name(all_op_cases()[info.param].kind)) + "_" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(WebGpu, OpVsReference, ::testing::Range<size_t>(0, all_op_cases().size()), case_name);

// ---- direct tests (own buffers, not the harness) --------------------------------------------------

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor put(Backend& b, std::vector<std::shared_ptr<Buffer>>& keep, BufferUsage usage, DType dt,
           std::initializer_list<int64_t> shape, const void* data) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  auto buf = b.alloc(n * dtype_size(dt), usage);
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  keep.push_back(buf.value());
  Tensor t = Tensor::contiguous(keep.back().get(), 0, dt, shape);
  if (data) {
    Status s = b.upload(t, data, n * dtype_size(dt));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  return t;
}

std::vector<float> get(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  Status s = b.download(t, v.data(), v.size() * 4);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// ---- subgroups ------------------------------------------------------------------------------------
// The row reductions (norms, pointer head) take reduce_subgroups.wgsl's workgroup_sum where the
// device's subgroups pass its layout check, else reduce_workgroup.wgsl's tree, and the question rows'
// gated delta rule its group8_sum (shuffles, else workgroup memory). The default backend runs whichever
// the adapter allows (lavapipe: subgroups of 8); every case of those ops (for the gated delta rule, its
// question-row cases: the op table's `rows` and GdnEdges' `rows_*`) also runs on a backend with
// subgroups turned off, so both variants are checked against the CPU on one adapter.
bool has_subgroup_variant(const OpCase& c) {
  const OpKind k = c.kind;
  return k == OpKind::RmsNorm || k == OpKind::AddRmsNorm || k == OpKind::L2Norm || k == OpKind::RmsNormGated ||
         k == OpKind::PointerLogits || (k == OpKind::GatedDeltaRule && c.params.rfind("rows,", 0) == 0);
}

std::vector<size_t> subgroup_variant_cases() {
  std::vector<size_t> idx;
  for (size_t i = 0; i < all_op_cases().size(); ++i) {
    if (has_subgroup_variant(all_op_cases()[i])) idx.push_back(i);
  }
  return idx;
}

class OpWithoutSubgroups : public ::testing::TestWithParam<size_t> {};

TEST_P(OpWithoutSubgroups, MatchesReference) {
  REQUIRE_WEBGPU(unused);
  const std::shared_ptr<Backend> gpu = webgpu_without_subgroups();
  ASSERT_TRUE(gpu);
  expect_matches_reference(all_op_cases()[GetParam()], *gpu);
}

INSTANTIATE_TEST_SUITE_P(WebGpu, OpWithoutSubgroups, ::testing::ValuesIn(subgroup_variant_cases()), case_name);

// Where the adapter offers subgroups (lavapipe and the H200 do), the default backend uses them — they
// pass the layout check, so the subgroup variant is what the op tables test — and the hook's backend
// does not; each description says which.
TEST(WebGpu, SubgroupsCanBeTurnedOff) {
  REQUIRE_WEBGPU(gpu);
  const std::shared_ptr<Backend> off = webgpu_without_subgroups();
  ASSERT_TRUE(off);
  const std::string with = gpu->info().device, without = off->info().device;
  std::printf("default: %s\nhook:    %s\n", with.c_str(), without.c_str());
  if (with.find(", subgroups of ") != std::string::npos) {
    EXPECT_EQ(with.find("(not used"), std::string::npos) << with;
    EXPECT_NE(without.find("(not used: turned off)"), std::string::npos) << without;
  }
}

// A row's norm is computed by one workgroup from that row alone, so its bits must not depend on the
// rows around it: rows of a 300-row call equal the same rows in a 7-row call and alone, for
// add_rms_norm (d 1,024) and l2_norm (d 128), in both reduction variants.
TEST(WebGpu, NormRowsDoNotDependOnTheBatch) {
  REQUIRE_WEBGPU(shared);
  for (const std::shared_ptr<Backend>& gpu : {shared, webgpu_without_subgroups()}) {
    ASSERT_TRUE(gpu);
    std::vector<std::shared_ptr<Buffer>> keep;
    for (const int64_t d : {1024, 128}) {
      const int64_t n = 300;
      const std::vector<float> x = random_floats(n * d, 51), y = random_floats(n * d, 52), w = random_floats(d, 53);
      const Tensor tw = put(*gpu, keep, BufferUsage::Weights, DType::F32, {d}, w.data());
      std::vector<std::vector<float>> outs;
      for (const int64_t rows : {n, int64_t{7}, int64_t{1}}) {
        const Tensor tx = put(*gpu, keep, BufferUsage::Activations, DType::F32, {rows, d}, x.data());
        const Tensor ty = put(*gpu, keep, BufferUsage::Activations, DType::F32, {rows, d}, y.data());
        const Tensor to = put(*gpu, keep, BufferUsage::Activations, DType::F32, {rows, d}, nullptr);
        ASSERT_TRUE((d == 128 ? gpu->l2_norm(tx, 1e-6f, 0.5f, to) : gpu->add_rms_norm(tx, ty, tw, 1e-6f, to)).ok());
        outs.push_back(get(*gpu, to));
      }
      for (size_t i = 1; i < outs.size(); ++i) {
        EXPECT_TRUE(std::equal(outs[i].begin(), outs[i].end(), outs[0].begin()))
            << "d " << d << ": rows of a " << outs[i].size() / d << "-row call differ from the 300-row call's";
      }
    }
  }
}

// Weights above a (test-lowered, 1 MiB) binding limit are split on rows at upload; embedding and
// matmul dispatch per piece and must equal the CPU on the same data.
TEST(WebGpu, SplitWeightsMatchTheCpu) {
  REQUIRE_WEBGPU(unused);
  auto split = create_webgpu_backend_with_binding_limit(BackendOptions{}, uint64_t{1} << 20);
  ASSERT_TRUE(split.ok()) << split.status().to_string();
  Backend& gpu = **split;
  Backend& cpu = cpu_reference();
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t V = 1000, d = 1024, n = 9, m = 700;  // table 4 MB, w 2.8 MB: 4 and 3 pieces
  const std::vector<float> table = random_floats(V * d, 1);
  const std::vector<int32_t> ids = {0, 999, 255, 256, 511, 512, 767, 768, 3};
  const std::vector<float> w = random_floats(m * d, 2, 0.03f);
  const std::vector<float> bias = random_floats(m, 3);
  std::vector<float> want_x, want_y;
  for (Backend* b : {&gpu, &cpu}) {
    const Tensor t_table = put(*b, keep, BufferUsage::Weights, DType::F32, {V, d}, table.data());
    const Tensor t_ids = put(*b, keep, BufferUsage::Activations, DType::I32, {n}, ids.data());
    const Tensor t_w = put(*b, keep, BufferUsage::Weights, DType::F32, {m, d}, w.data());
    const Tensor t_bias = put(*b, keep, BufferUsage::Weights, DType::F32, {m}, bias.data());
    const Tensor x = put(*b, keep, BufferUsage::Activations, DType::F32, {n, d}, nullptr);
    const Tensor y = put(*b, keep, BufferUsage::Activations, DType::F32, {n, m}, nullptr);
    ASSERT_TRUE(b->embedding(t_table, t_ids, x).ok());
    ASSERT_TRUE(b->matmul(x, t_w, t_bias, y).ok());
    if (b == &gpu) {
      want_x = get(*b, x);
      want_y = get(*b, y);
      EXPECT_GT(t_table.buffer->size(), size_t{1} << 20);
    } else {
      EXPECT_EQ(max_abs_diff(want_x, get(*b, x)), 0.0) << "embedding rows from split pieces";
      EXPECT_LE(max_abs_diff(want_y, get(*b, y)), 1e-4) << "matmul over split weight pieces";
    }
  }
  // A non-weight tensor above the (lowered) limit is refused by supports().
  Tensor big;
  big.rank = 2;
  big.shape = {400, 1024};
  big.stride = {1024, 1};
  EXPECT_FALSE(gpu.supports(OpDesc{OpKind::Add, {big, big, big}}));
}

// ---- matmul edges ---------------------------------------------------------------------------------
// The matmul dispatch picks matmul.wgsl's few-row entry point for n ≤ 8, its 64×128-tile split-K one
// where k is split, else a 128×128-tile one for outputs of at least 264 such tiles and its unsplit
// 64×128-tile one below (ops.cpp); each is checked at shapes
// off every tile grid (n, m not multiples of 4, 16, 32, 64 or 128; k not a multiple of the 16- or
// 128-deep k steps), with strided x/out views and a bias, against the CPU reference at the op tables'
// FP32 reduction bound. Weights of at most 2,048 rows (outputs of under 264 tiles of 128 in a
// 2,048-row pass) with k ≥ 512 have k split into pieces (matmul_split in ops.cpp; several rows above
// are split too): the split_* rows run the few-row and the split-K entry points over pieces, a ragged
// last piece included.
struct MatmulEdge {
  const char* name;
  int64_t n, k, m;
  bool bias;
  int64_t x_pad, out_pad;
};

const MatmulEdge kMatmulEdges[] = {
    {"one_row", 1, 1024, 300, true, 0, 0},
    {"k3", 70, 3, 130, false, 0, 0},
    {"k1", 5, 1, 9, true, 2, 1},
    {"rows8_strided", 8, 300, 37, true, 4, 3},       // the few-row kernel's full row set, k off its 128 step
    {"rows2_k3", 2, 3, 17, false, 0, 0},
    {"rows3_long_k", 3, 2600, 1100, true, 0, 0},     // 21 k steps of 128 with a ragged tail
    {"rows9", 9, 129, 40, true, 1, 1},               // just past the few-row kernel
    {"wide_ragged_strided", 131, 1030, 67, true, 3, 2},  // 3×1 tiles of 64×128, edges on both sides
    {"wide_edges", 65, 50, 129, false, 1, 2},            // one row and one column past a 64×128 tile
    {"wide_short_pass", 250, 1024, 1030, true, 0, 0},    // Kev's short-pass shape: 4×9 tiles of 64×128
    {"wide_many_tiles", 1000, 40, 1000, true, 0, 0},     // 16×8 tiles of 64×128 (8×8 = 64 of 128)
    {"wide_ragged", 700, 130, 1500, true, 3, 2},         // 11×12 tiles of 64×128, 6×12 = 72 of 128
    {"wide_under_threshold", 2187, 40, 1024, true, 0, 0},  // long's 18×8 = 144 tiles of 128: the 64×128 kernel
    {"big_at_threshold", 1100, 40, 3800, false, 2, 0},  // 9×30 = 270 tiles of 128: just over the big kernel's 264
    {"big_ragged", 2050, 19, 2100, true, 0, 0},      // 17×17 tiles of 128: the big kernel, edges on both sides
    {"big_strided", 2049, 37, 2053, false, 5, 3},    // x and out row-strided views
    {"big_exact", 2048, 48, 2304, true, 0, 0},       // exactly 16×18 tiles, k a multiple of 16
    {"big_tall", 4100, 260, 1030, false, 0, 0},      // 33×9 tiles, k across 17 steps with a ragged tail
    {"split_rows", 5, 2600, 37, true, 3, 1},          // 10 pieces (272 × 9 + 152) folded by the few-row kernel
    {"split_small", 300, 1100, 100, true, 3, 2},      // 4 pieces (288 × 3 + 236), 5 tiles of 64×128, strided views
    {"split_small_ragged", 20, 2600, 37, false, 0, 0},  // 10 pieces, one tile per piece
    {"split_big", 1030, 1040, 2000, true, 1, 4},      // 4 pieces (272 × 3 + 224): 17×16×4 = 1,088 tiles
};

class MatmulEdges : public ::testing::TestWithParam<size_t> {};

TEST_P(MatmulEdges, MatchReference) {
  REQUIRE_WEBGPU(gpu);
  const MatmulEdge& e = kMatmulEdges[GetParam()];
  const OpCase c{OpKind::Matmul,
                 std::string(e.name) + ",n=" + std::to_string(e.n) + ",k=" + std::to_string(e.k) + ",m=" +
                     std::to_string(e.m),
                 {padded(in("x", {e.n, e.k}, normal()), 0, e.x_pad), in("w", {e.m, e.k}, normal(0, 0.03)),
                  e.bias ? in("bias", {e.m}, normal()) : absent("bias"), padded(out("out", {e.n, e.m}), e.out_pad, 0)},
                 1e-10,
                 [](Backend& b, const std::vector<Tensor>& t) { return b.matmul(t[0], t[1], t[2], t[3]); }};
  expect_matches_reference(c, *gpu);
}

INSTANTIATE_TEST_SUITE_P(WebGpu, MatmulEdges, ::testing::Range<size_t>(0, std::size(kMatmulEdges)),
                         edge_name<kMatmulEdges>);

// Every output element is accumulated in ascending k with one FMA per step by all matmul entry
// points, so a row's result depends neither on how many rows share the pass nor on which kernel ran.
// A weight of 34,000 × 170 split at a (test-lowered) 22 MiB binding limit: pieces of 33,924 rows
// (266 tiles of 128 per tile row: the 128×128 kernel) and 76 rows (the 64×128 kernel). Checked: the
// whole 130-row product against the CPU; its first rows against the same rows computed in a 3-row
// pass (the few-row kernel); its first 2,000 and 5,500 columns against 2,000- and 5,500-row weights
// (2 × 16 and 2 × 43 tiles of 128, under the 128×128 kernel's threshold: the 64×128 kernel), bit for
// bit.
TEST(WebGpu, MatmulRowsDoNotDependOnThePassOrTheKernel) {
  REQUIRE_WEBGPU(unused);
  const std::shared_ptr<Backend> split = with_binding_limit(nullptr, uint64_t{22} << 20);
  ASSERT_TRUE(split);
  Backend& gpu = *split;
  Backend& cpu = cpu_reference();
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t n = 130, k = 170, m = 34000, few = 3;
  const std::vector<float> x = random_floats(n * k, 11);
  const std::vector<float> w = random_floats(m * k, 12, 0.05f);
  const std::vector<float> bias = random_floats(m, 13);
  std::vector<float> got, want;
  for (Backend* b : {&gpu, &cpu}) {
    const Tensor tx = put(*b, keep, BufferUsage::Activations, DType::F32, {n, k}, x.data());
    const Tensor tw = put(*b, keep, BufferUsage::Weights, DType::F32, {m, k}, w.data());
    const Tensor tb = put(*b, keep, BufferUsage::Weights, DType::F32, {m}, bias.data());
    const Tensor y = put(*b, keep, BufferUsage::Activations, DType::F32, {n, m}, nullptr);
    ASSERT_TRUE(b->matmul(tx, tw, tb, y).ok());
    if (b == &cpu) {
      want = get(cpu, y);
      break;
    }
    EXPECT_GT(tw.buffer->size(), size_t{22} << 20);
    got = get(gpu, y);
    const Tensor x_few = put(gpu, keep, BufferUsage::Activations, DType::F32, {few, k}, x.data());
    const Tensor y_few = put(gpu, keep, BufferUsage::Activations, DType::F32, {few, m}, nullptr);
    ASSERT_TRUE(gpu.matmul(x_few, tw, tb, y_few).ok());
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + few * m), get(gpu, y_few))
        << "rows of the 130-row pass differ from the same rows computed in a 3-row pass (few-row kernel)";
    for (const int64_t cols : {2000, 5500}) {
      const Tensor w_cols = put(gpu, keep, BufferUsage::Weights, DType::F32, {cols, k}, w.data());
      const Tensor b_cols = put(gpu, keep, BufferUsage::Weights, DType::F32, {cols}, bias.data());
      const Tensor y_cols = put(gpu, keep, BufferUsage::Activations, DType::F32, {n, cols}, nullptr);
      ASSERT_TRUE(gpu.matmul(tx, w_cols, b_cols, y_cols).ok());
      const std::vector<float> got_cols = get(gpu, y_cols);
      size_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < cols; ++j) differ += got_cols[i * cols + j] != got[i * m + j];
      }
      EXPECT_EQ(differ, 0u) << "the first " << cols
                            << " columns computed alone (64×128 kernel) differ from the 128×128 kernel's";
    }
  }
  EXPECT_LE(kev::testing::nmse(got, want), 1e-10)
      << "matmul over split pieces (128×128 and 64×128 kernels) vs the CPU reference";
}

// The first `rows` rows of x [·, k] times w [m, k] plus bias on `b`.
std::vector<float> first_rows_times(Backend& b, const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& bias, int64_t rows, int64_t k, int64_t m) {
  std::vector<std::shared_ptr<Buffer>> keep;
  const Tensor tx = put(b, keep, BufferUsage::Activations, DType::F32, {rows, k}, x.data());
  const Tensor tw = put(b, keep, BufferUsage::Weights, DType::F32, {m, k}, w.data());
  const Tensor tb = put(b, keep, BufferUsage::Weights, DType::F32, {m}, bias.data());
  const Tensor y = put(b, keep, BufferUsage::Activations, DType::F32, {rows, m}, nullptr);
  EXPECT_TRUE(b.matmul(tx, tw, tb, y).ok());
  return get(b, y);
}

// Split-K keeps the invariance: a weight of 2,000 × 1,100 has k cut into four pieces (288 × 3 + 236,
// chosen from its shape), and a row must get the same bits from the split-K kernel in a pass of 1,030
// rows (17 × 16 × 4 = 1,088 tiles of 64×128) and of 130 rows (3 × 16 × 4), from the few-row kernel
// that folds the pieces itself (3 rows), and from a backend whose 8 MiB binding limit splits the weight
// in two (1,906 + 94 rows: col0 in the partial sums' reduction) and runs the 1,030 rows in chunks of
// 256 (the partial planes, 4 × 1,920 floats a row in tiles of 128 columns, do not fit one binding for
// all rows). The whole product is also checked against the CPU.
TEST(WebGpu, MatmulSplitKRowsDoNotDependOnThePassOrTheKernel) {
  REQUIRE_WEBGPU(gpu);
  const std::shared_ptr<Backend> limited = with_binding_limit(gpu, uint64_t{8} << 20);
  ASSERT_TRUE(limited);
  Backend& cpu = cpu_reference();
  const int64_t n = 1030, k = 1100, m = 2000;
  const std::vector<float> x = random_floats(n * k, 31);
  const std::vector<float> w = random_floats(m * k, 32, 0.05f);
  const std::vector<float> bias = random_floats(m, 33);
  auto product = [&](Backend& b, int64_t rows) { return first_rows_times(b, x, w, bias, rows, k, m); };
  const std::vector<float> all = product(*gpu, n);
  for (const int64_t rows : {130, 3}) {
    EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + rows * m), product(*gpu, rows))
        << "the first " << rows << " rows differ from the same rows of the " << n << "-row pass";
  }
  EXPECT_EQ(all, product(*limited, n)) << "split weight and row chunks under an 8 MiB binding limit";
  const std::vector<float> want = product(cpu, n);
  EXPECT_LE(kev::testing::nmse(all, want), 1e-10) << "split-K matmul vs the CPU reference";
}

// More pieces than `matmul_reduce` loads at once (8): a 96 × 3,000 weight has k cut into 11 pieces
// (288 × 10 + 120; its 16 tiles of 128 in a 2,048-row pass ask for 64, capped at k / 256), so the
// reduction adds them in two batches; a row must still get the bits of the few-row kernel, which folds
// the pieces itself, and the product must match the CPU.
TEST(WebGpu, MatmulSplitKWithMorePiecesThanOneReductionBatch) {
  REQUIRE_WEBGPU(gpu);
  Backend& cpu = cpu_reference();
  const int64_t n = 300, k = 3000, m = 96, few = 3;
  const std::vector<float> x = random_floats(n * k, 41);
  const std::vector<float> w = random_floats(m * k, 42, 0.05f);
  const std::vector<float> bias = random_floats(m, 43);
  auto product = [&](Backend& b, int64_t rows) { return first_rows_times(b, x, w, bias, rows, k, m); };
  const std::vector<float> all = product(*gpu, n);
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + few * m), product(*gpu, few))
      << "rows of the reduced " << n << "-row pass differ from the few-row kernel's";
  const std::vector<float> want = product(cpu, n);
  EXPECT_LE(kev::testing::nmse(all, want), 1e-10) << "split-K matmul in 11 pieces vs the CPU reference";
}

// Milliseconds per call of `run` on `gpu` (median over samples; the first call, which builds the
// pipelines, is not timed): each sample records `per_sync` calls into one pass and synchronises, and
// samples are taken until there are at least 3 and `min_seconds` have passed. Not a benchmark
// protocol; lavapipe's numbers only show large relative differences.
struct Timing {
  double median_ms, min_ms;
  size_t samples;
};

Timing time_calls(Backend& gpu, const std::function<Status()>& run, int per_sync, double min_seconds) {
  EXPECT_TRUE(run().ok());
  EXPECT_TRUE(gpu.synchronize().ok());
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  while (ms.size() < 3 || std::chrono::steady_clock::now() - start < std::chrono::duration<double>(min_seconds)) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_sync; ++i) EXPECT_TRUE(run().ok());
    EXPECT_TRUE(gpu.synchronize().ok());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / per_sync);
    if (::testing::Test::HasFailure()) break;
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.size()};
}

// The matmul at the 0.8B model's projections in Kev's passes: long's 2,187-token prefill (MLP gate+up,
// GDN in_proj, MLP down, out_proj / o_proj), short's 250-token prefill (also attention's k|v|q, m =
// 5,120) and its 220- and 222-row evaluations, the few-row kernel (8 rows of MLP down: k in 8 pieces
// that it folds itself), and 4096³ (the benchmark's ceiling shape). Three calls per synchronisation. Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='WebGpu.DISABLED_MatmulTiming'
TEST(WebGpu, DISABLED_MatmulTiming) {
  REQUIRE_WEBGPU(gpu);
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t shapes[][3] = {{2187, 1024, 7168}, {2187, 1024, 8224}, {2187, 3584, 1024}, {2187, 2048, 1024},
                               {250, 1024, 7168},  {250, 1024, 8224},  {250, 1024, 5120},  {220, 1024, 7168},
                               {220, 1024, 8224},  {250, 3584, 1024},  {250, 2048, 1024},  {222, 3584, 1024},
                               {1, 1024, 3584},    {8, 3584, 1024},    {4096, 4096, 4096}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1], m = s[2];
    const std::vector<float> x = random_floats(n * k, 21), w = random_floats(m * k, 22, 0.03f);
    const Tensor tx = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, k}, x.data());
    const Tensor tw = put(*gpu, keep, BufferUsage::Weights, DType::F32, {m, k}, w.data());
    const Tensor y = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, m}, nullptr);
    const Timing t = time_calls(*gpu, [&] { return gpu->matmul(tx, tw, Tensor(), y); }, 3, 0.3);
    std::printf("matmul n=%lld k=%lld m=%lld: median %.3f ms, min %.3f ms (%zu samples), %.2f TFLOP/s\n",
                static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), t.median_ms,
                t.min_ms, t.samples, 2.0 * n * k * m / t.median_ms * 1e-9);
  }
}

// The row reductions at long's shapes, with the subgroup and the workgroup-memory workgroup_sum:
// add_rms_norm over 2,187 × 1,024, l2_norm over 2,187 × 32 rows of 128 (GDN q and k), rms_norm_gated
// over 2,187 × 16 rows of 128, rms_norm over 2,187 × 8 rows of 256 (attention's q heads). Twenty calls
// per synchronisation (each is tens of µs). Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='WebGpu.DISABLED_NormTiming'
TEST(WebGpu, DISABLED_NormTiming) {
  REQUIRE_WEBGPU(shared);
  for (const std::shared_ptr<Backend>& gpu : {shared, webgpu_without_subgroups()}) {
    ASSERT_TRUE(gpu);
    std::vector<std::shared_ptr<Buffer>> keep;
    const char* variant = gpu == shared ? "default" : "no subgroups";
    const std::vector<float> big = random_floats(2187 * 32 * 128, 71), w = random_floats(1024, 72);
    auto t2 = [&](int64_t rows, int64_t d) {
      return put(*gpu, keep, BufferUsage::Activations, DType::F32, {rows, d}, big.data());
    };
    const Tensor tw = put(*gpu, keep, BufferUsage::Weights, DType::F32, {1024}, w.data());
    const Tensor x = t2(2187, 1024), y = t2(2187, 1024), o = t2(2187, 1024);
    const Tensor q = t2(2187 * 32, 128), qo = t2(2187 * 32, 128);
    const Tensor g = t2(2187 * 16, 128), gz = t2(2187 * 16, 128), go = t2(2187 * 16, 128);
    const Tensor h = t2(2187 * 8, 256), ho = t2(2187 * 8, 256);  // the long prefill's attention q heads
    Tensor w128 = tw, w256 = tw;
    w128.shape[0] = 128;
    w256.shape[0] = 256;
    const std::pair<const char*, std::function<Status()>> ops[] = {
        {"add_rms_norm 2187x1024", [&] { return gpu->add_rms_norm(x, y, tw, 1e-6f, o); }},
        {"l2_norm 69984x128", [&] { return gpu->l2_norm(q, 1e-6f, 1.0f, qo); }},
        {"rms_norm_gated 34992x128", [&] { return gpu->rms_norm_gated(g, gz, w128, 1e-6f, go); }},
        {"rms_norm 17496x256", [&] { return gpu->rms_norm(h, w256, 1e-6f, ho); }},
    };
    for (const auto& [name, run] : ops) {
      const Timing t = time_calls(*gpu, run, 20, 0.2);
      std::printf("%-26s %-12s: median %.4f ms, min %.4f ms (%zu samples)\n", name, variant, t.median_ms, t.min_ms,
                  t.samples);
    }
  }
}

// ---- attention edges ------------------------------------------------------------------------------
// attention.wgsl puts 64 query rows (tokens × the G heads of a KV group; G > 64 in head chunks) in a
// workgroup, walks keys in tiles of 64 (P·V in halves of 32, a half past the last key skipped) and hd
// in chunks of 16 dims, and splits a query tile's key tiles over up to 16 workgroups (merged by a
// combine kernel) where the pass has few or uneven tiles. Each case is checked against the CPU
// reference at the FP32 reduction bound; the split counts in the names follow ops.cpp's rule (pieces
// of at least one key tile and of about the pass's key tiles over 264 workgroups, at most 16 a tile,
// the partial rows within one binding).
struct AttnEdge {
  const char* name;
  int64_t H, Hkv, hd, Ls;
  std::vector<int64_t> seqs;
  int64_t q_pad, kv_pad, out_pad;
  uint64_t binding_limit;  // > 0: a backend planning with this storage binding limit
};

const AttnEdge kAttnEdges[] = {
    {"long_prefix_12_splits", 8, 2, 256, 2187, {40, 37, 1}, 256, 0, 0, 0},  // Kev's long evaluation
    {"short_prefix_5_splits", 8, 2, 256, 250, {37, 37}, 256, 0, 0, 0},
    {"prefill_1_to_5_splits", 8, 2, 128, 0, {300}, 0, 0, 0, 0},  // causal: split and unsplit tiles mixed
    // Causal prefills at hd 256 (16 dim chunks): Kev's heads (16 tokens per workgroup) and G = 1
    // (64 tokens per workgroup); last key tiles ending in either half of 64 keys.
    {"prefill_hd256_1_to_6_splits", 8, 2, 256, 0, {700}, 0, 0, 0, 0},
    {"g1_hd256_prefill_1_to_10_splits", 4, 4, 256, 0, {600}, 0, 0, 0, 0},
    {"g3_packed_prefill_1_to_5_splits", 6, 2, 128, 0, {150, 17, 290}, 0, 0, 0, 0},  // 21 tokens × 3 heads
    {"g1_strided_kv_2_3_splits", 4, 4, 128, 100, {5, 70}, 0, 3, 2, 0},  // 64 tokens per workgroup
    {"g3_ragged_hd_5_6_splits", 6, 2, 100, 300, {30, 2}, 1, 0, 5, 0},   // 21 tokens × 3 heads, hd off 4
    {"g80_head_chunks_4_splits", 80, 1, 64, 200, {3, 2}, 0, 0, 0, 0},    // heads 64 + 16
    {"hd64_packed_empty_seq", 8, 2, 64, 0, {9, 1, 0, 40}, 0, 1, 0, 0},
    {"hd1", 2, 1, 1, 3, {4}, 0, 0, 0, 0},
    {"unsplit_at_binding_limit", 8, 2, 256, 400, {20, 20, 20, 20}, 0, 0, 0, uint64_t{1} << 20},
};

class AttentionEdges : public ::testing::TestWithParam<size_t> {};

TEST_P(AttentionEdges, MatchReference) {
  REQUIRE_WEBGPU(shared);
  const AttnEdge& e = kAttnEdges[GetParam()];
  const std::shared_ptr<Backend> gpu = with_binding_limit(shared, e.binding_limit);
  ASSERT_TRUE(gpu);
  const int64_t n = std::accumulate(e.seqs.begin(), e.seqs.end(), int64_t{0});
  const SeqLayout layout = layout_of(e.seqs, e.Ls, e.Ls > 0);
  const bool prefix = e.Ls > 0;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(e.hd)));
  const OpCase c{OpKind::Attention,
                 std::string(e.name) + ",H=" + std::to_string(e.H) + ",Hkv=" + std::to_string(e.Hkv) +
                     ",hd=" + std::to_string(e.hd) + ",Ls=" + std::to_string(e.Ls) + ",seqs=" + lengths_str(e.seqs),
                 {padded(in("q", {n, e.H, e.hd}, normal(0, 2)), 0, e.q_pad),
                  padded(in("k", {n, e.Hkv, e.hd}, normal(0, 2)), e.kv_pad, 0),
                  padded(in("v", {n, e.Hkv, e.hd}, normal()), 0, e.kv_pad),
                  prefix ? padded(in("prefix_k", {e.Ls, e.Hkv, e.hd}, normal(0, 2)), 0, e.kv_pad) : absent("prefix_k"),
                  prefix ? in("prefix_v", {e.Ls, e.Hkv, e.hd}, normal()) : absent("prefix_v"),
                  padded(out("out", {n, e.H, e.hd}), e.out_pad, 1)},
                 1e-10,
                 [=](Backend& b, const std::vector<Tensor>& t) {
                   return b.attention(t[0], t[1], t[2], t[3], t[4], layout, scale, t[5]);
                 }};
  expect_matches_reference(c, *gpu);
}

INSTANTIATE_TEST_SUITE_P(WebGpu, AttentionEdges, ::testing::Range<size_t>(0, std::size(kAttnEdges)),
                         edge_name<kAttnEdges>);

// Gated delta rule shapes the op table does not reach: sequences of many chunks (the recurrence
// walking 11-16 chunks, each chunk's output from its stored starting state), a partial last dv slice,
// sequences split into several scratch groups by a (test-lowered) storage binding limit, and sequences
// longer than one binding holds, run in segments that carry the state from one to the next.
struct GdnEdge {
  const char* name;
  int64_t Hk, Hv, dk, dv;
  std::vector<int64_t> seqs;
  bool from_state, state_out, spiky;
  uint64_t binding_limit;  // > 0: a backend planning with this storage binding limit
};

const GdnEdge kGdnEdges[] = {
    {"long_spiky_from_state", 1, 2, 128, 128, {1000}, true, true, true, 0},   // 16 chunks
    {"long_fresh_dv42", 2, 4, 64, 42, {700}, false, true, false, 0},  // 11 chunks, last dv slices partial
    // dk not a multiple of the recurrence's 32-load batches, so W S ends in single steps (dk 100: the
    // second half's 36 dims, one batch and 4 steps; dk 20: all single steps), as does the update over
    // a last chunk shorter than a batch (150 = 2·64 + 22, 90 = 64 + 26).
    {"dk100_from_state", 1, 2, 100, 24, {150}, true, true, false, 0},
    {"dk20_fresh", 2, 2, 20, 36, {90, 150}, false, false, false, 0},
    // 4 value heads × 147,968-byte regions: 5 chunks per 3 MiB group, so groups 130+65 | 200+64 | 1.
    {"groups_at_binding_limit", 2, 4, 128, 128, {130, 65, 200, 64, 1}, true, false, false, uint64_t{3} << 20},
    // Same 5-chunk capacity: 700 tokens = 11 chunks in segments of 5, 5, 1 (from a state, spiky, with
    // state_out); 330 fresh tokens in segments of 5 and 1; a long row among packed rows (its segments
    // start from the shared state, the rows around it run as groups).
    {"segments_from_state", 2, 4, 128, 128, {700}, true, true, true, uint64_t{3} << 20},
    {"segments_fresh", 2, 4, 128, 128, {330}, false, true, false, uint64_t{3} << 20},
    {"segments_among_rows", 2, 4, 128, 128, {130, 400, 64, 37}, true, false, false, uint64_t{3} << 20},
    // Question rows (every sequence within one chunk, no state_out) take the token recurrence
    // (gated_delta_net_short.wgsl): spiky gates (σ folded into the state), an empty row, rows of 1 and
    // 64 tokens and 37 (8-token batches, the last partial); dk not a multiple of 4 and dv over one
    // 64-column slice (the last partial), from the zero state.
    {"rows_spiky_from_state", 2, 4, 128, 128, {37, 37, 0, 36, 1, 64}, true, false, true, 0},
    {"rows_dk98_dv130_fresh", 1, 2, 98, 130, {20, 9, 8}, false, false, false, 0},
};

class GdnEdges : public ::testing::TestWithParam<size_t> {};

OpCase gdn_edge_case(const GdnEdge& e) {
  OpCase c = gdn_case(std::string(e.name) + ",", {e.Hk, e.Hv, e.dk, e.dv}, e.seqs, e.from_state, e.state_out);
  if (e.spiky) c.args[3].init = spiky_log_decay();
  return c;
}

TEST_P(GdnEdges, MatchReference) {
  REQUIRE_WEBGPU(shared);
  const GdnEdge& e = kGdnEdges[GetParam()];
  const std::shared_ptr<Backend> gpu = with_binding_limit(shared, e.binding_limit);
  ASSERT_TRUE(gpu);
  expect_matches_reference(gdn_edge_case(e), *gpu);
}

// The question-row edges with group8_sum through workgroup memory (subgroups off; see OpWithoutSubgroups).
TEST(WebGpu, GdnRowEdgesWithoutSubgroups) {
  REQUIRE_WEBGPU(unused);
  const std::shared_ptr<Backend> gpu = webgpu_without_subgroups();
  ASSERT_TRUE(gpu);
  int rows_cases = 0;
  for (const GdnEdge& e : kGdnEdges) {
    if (std::string(e.name).rfind("rows_", 0) != 0) continue;
    SCOPED_TRACE(e.name);
    expect_matches_reference(gdn_edge_case(e), *gpu);
    ++rows_cases;
  }
  EXPECT_EQ(rows_cases, 2);
}

INSTANTIATE_TEST_SUITE_P(WebGpu, GdnEdges, ::testing::Range<size_t>(0, std::size(kGdnEdges)),
                         edge_name<kGdnEdges>);

// Heads whose one chunk of matrices exceeds the storage binding limit are refused, naming the limit
// (591,872 bytes per chunk for 4 value heads at dk = dv = 128, against 512 KiB).
TEST(WebGpu, GdnRefusesAChunkOverTheBindingLimit) {
  REQUIRE_WEBGPU(unused);
  const std::shared_ptr<Backend> limited = with_binding_limit(nullptr, uint64_t{512} << 10);
  ASSERT_TRUE(limited);
  Backend& gpu = *limited;
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t n = 330, Hk = 2, Hv = 4, d = 128;
  const Tensor q = put(gpu, keep, BufferUsage::Activations, DType::F32, {n, Hk, d}, nullptr);
  const Tensor v = put(gpu, keep, BufferUsage::Activations, DType::F32, {n, Hv, d}, nullptr);
  const Tensor g = put(gpu, keep, BufferUsage::Activations, DType::F32, {n, Hv}, nullptr);
  const Tensor o = put(gpu, keep, BufferUsage::Activations, DType::F32, {n, Hv, d}, nullptr);
  const Status s = gpu.gated_delta_rule(q, q, v, g, g, Tensor{}, layout_of({n}, 0, false), o, Tensor{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::Unsupported) << s.to_string();
  EXPECT_NE(s.to_string().find("storage binding limit is 524288"), std::string::npos) << s.to_string();
}

#ifdef KEV_HAVE_PIPELINE_STATS
// kev_pipeline_stats over the .spvasm files in `dir`.
test_support::CommandRun pipeline_stats(const std::filesystem::path& dir) {
  return test_support::run_command(test_support::built_tool("kev_pipeline_stats") + " '" + dir.string() + "'");
}
#endif

// KEV_WEBGPU_DUMP_SPIRV: the device files the SPIR-V Dawn generates for each pipeline it builds, named
// by kernel file and entry point, and kev_pipeline_stats builds each such module on the Vulkan driver
// (lavapipe reports no statistics; NVIDIA's driver reports registers and more: docs/backends.md).
TEST(WebGpu, DumpsEachPipelinesSpirvForTheDriversStatistics) {
  REQUIRE_WEBGPU(shared);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kev-spirv-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  setenv("KEV_WEBGPU_DUMP_SPIRV", dir.c_str(), 1);
  Result<std::shared_ptr<Backend>> dumping = create_backend("webgpu", BackendOptions{});
  unsetenv("KEV_WEBGPU_DUMP_SPIRV");
  ASSERT_TRUE(dumping.ok()) << dumping.status().to_string();
  Backend& gpu = **dumping;
  std::vector<std::shared_ptr<Buffer>> keep;
  const std::vector<float> x = random_floats(4 * 64, 7), w = random_floats(64, 8, 0.1f);
  const Tensor tx = put(gpu, keep, BufferUsage::Activations, DType::F32, {4, 64}, x.data());
  const Tensor tw = put(gpu, keep, BufferUsage::Weights, DType::F32, {64}, w.data());
  const Tensor out = put(gpu, keep, BufferUsage::Activations, DType::F32, {4, 64}, nullptr);
  ASSERT_TRUE(gpu.rms_norm(tx, tw, 1e-6f, out).ok());
  ASSERT_TRUE(gpu.synchronize().ok());

  const std::filesystem::path file = dir / "norms.rms_norm.spvasm";
  std::ifstream dumped(file);
  ASSERT_TRUE(dumped.good()) << "no " << file.string();
  const std::string text((std::istreambuf_iterator<char>(dumped)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("OpEntryPoint GLCompute"), std::string::npos) << text.substr(0, 400);
#ifdef KEV_HAVE_PIPELINE_STATS
  const test_support::CommandRun stats = pipeline_stats(dir);
  std::printf("%s", stats.output.c_str());
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_NE(stats.output.find("\nnorms.rms_norm "), std::string::npos) << stats.output;
  EXPECT_EQ(stats.output.find("FAILED"), std::string::npos) << stats.output;
#else
  std::printf("kev_pipeline_stats is not built here (needs libvulkan-dev and spirv-tools): dump checked only\n");
#endif
  std::filesystem::remove_all(dir);
}

#ifdef KEV_HAVE_PIPELINE_STATS
// A file that is not SPIR-V assembly fails by name (exit 2), and so does a path that does not exist.
TEST(WebGpu, PipelineStatsNamesAModuleThatDoesNotAssemble) {
  REQUIRE_WEBGPU(shared);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kev-bad-spirv-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "bogus.entry.spvasm") << "OpCapability NotACapability\n";
  const test_support::CommandRun bad = pipeline_stats(dir);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("bogus.entry"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("FAILED"), std::string::npos) << bad.output;
  std::filesystem::remove_all(dir);
  const test_support::CommandRun empty = pipeline_stats(dir);
  EXPECT_NE(empty.exit_code, 0) << empty.output;
}
#endif

// A dump directory that cannot be created is refused when the device opens, naming the variable.
TEST(WebGpu, ADumpDirectoryThatCannotBeCreatedIsAnError) {
  REQUIRE_WEBGPU(shared);
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("kev-not-a-dir-" + std::to_string(getpid()));
  std::ofstream(file) << "x";
  setenv("KEV_WEBGPU_DUMP_SPIRV", (file / "spirv").c_str(), 1);
  const Result<std::shared_ptr<Backend>> r = create_backend("webgpu", BackendOptions{});
  unsetenv("KEV_WEBGPU_DUMP_SPIRV");
  std::filesystem::remove(file);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("KEV_WEBGPU_DUMP_SPIRV"), std::string::npos) << r.status().to_string();
}

// Timing of the attention kernel at Kev's passes (0.8B heads 8/2/256): causal prefills without a
// prefix (short, 700 and long's 2,187 tokens) and packed question rows over a long prefix (key
// splits). Not a benchmark protocol; on lavapipe the numbers only show work reduction. Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='WebGpu.DISABLED_AttentionTiming'
TEST(WebGpu, DISABLED_AttentionTiming) {
  REQUIRE_WEBGPU(gpu);
  std::vector<std::shared_ptr<Buffer>> keep;
  struct Pass {
    int64_t Ls, rows, len;
  };
  const int64_t H = 8, Hkv = 2, hd = 256;
  for (const Pass& s : {Pass{0, 1, 250}, Pass{250, 6, 37}, Pass{0, 1, 700}, Pass{0, 1, 2187}, Pass{2187, 5, 40}}) {
    const int64_t n = s.rows * s.len;
    SeqLayout layout;
    for (int64_t r = 0; r < s.rows; ++r) layout.offsets.push_back(static_cast<int32_t>((r + 1) * s.len));
    layout.from_prefix = s.Ls > 0;
    const std::vector<float> q = random_floats(n * H * hd, 31), kv = random_floats(n * Hkv * hd, 32);
    const std::vector<float> pkv = random_floats(std::max<int64_t>(s.Ls, 1) * Hkv * hd, 33);
    const Tensor tq = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H, hd}, q.data());
    const Tensor tkv = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, Hkv, hd}, kv.data());
    const Tensor tp = s.Ls > 0 ? put(*gpu, keep, BufferUsage::PrefixState, DType::F32, {s.Ls, Hkv, hd}, pkv.data())
                               : Tensor();
    const Tensor out = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H, hd}, nullptr);
    const Timing t =
        time_calls(*gpu, [&] { return gpu->attention(tq, tkv, tkv, tp, tp, layout, 1.0f / 16.0f, out); }, 1, 2.0);
    // Visible (query, key) pairs: every prefix key plus the causal own keys, 4·hd FLOPs each per head.
    const double pairs = static_cast<double>(s.rows) * (s.len * s.Ls + s.len * (s.len + 1) / 2);
    std::printf("attention Ls=%lld, %lld rows x %lld: median %.2f ms, min %.2f ms (%zu runs), %.1f GFLOP/s\n",
                static_cast<long long>(s.Ls), static_cast<long long>(s.rows), static_cast<long long>(s.len),
                t.median_ms, t.min_ms, t.samples, 4.0 * hd * H * pairs / t.median_ms * 1e-6);
  }
}

// Timing of the gated delta rule at Kev's passes (0.8B: Hk = Hv = 16, dk = dv = 128): the short
// prefill (250 tokens from zero, with state_out), its evaluation (6 packed rows of 37 tokens from a
// shared state) and the long prefill (2,187 tokens); then 35 rows of 64 tokens from a state, the same
// parallel work (prep and output over 35 chunks) as the long prefill with a one-chunk recurrence, so
// the difference is about the cost of the long prefill's sequential walk. Not a benchmark protocol;
// on lavapipe the numbers only show work reduction. Run with
//   kev_test_backend --gtest_also_run_disabled_tests --gtest_filter='WebGpu.DISABLED_GdnTiming'
TEST(WebGpu, DISABLED_GdnTiming) {
  REQUIRE_WEBGPU(gpu);
  std::vector<std::shared_ptr<Buffer>> keep;
  struct Pass {
    int64_t rows, len;
    bool from_state;
  };
  const int64_t H = 16, d = 128;
  for (const Pass& s : {Pass{1, 250, false}, Pass{6, 37, true}, Pass{1, 2187, false}, Pass{35, 64, true}}) {
    const int64_t n = s.rows * s.len;
    SeqLayout layout;
    for (int64_t r = 0; r < s.rows; ++r) layout.offsets.push_back(static_cast<int32_t>((r + 1) * s.len));
    layout.from_prefix = s.from_state;
    // Unit-norm-sized q and k (N(0, 1/d) per element), log decays in [-0.5, 0), β = 0.5.
    const std::vector<float> qk = random_floats(n * H * d, 41, 1.0f / std::sqrt(float(d)));
    const std::vector<float> v = random_floats(n * H * d, 42);
    std::vector<float> g = random_floats(n * H, 43, 0.2f), beta(n * H, 0.5f);
    for (float& x : g) x = -std::min(0.5f, std::fabs(x) + 1e-3f);
    const std::vector<float> state = random_floats(H * d * d, 44, 0.3f);
    const Tensor tq = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H, d}, qk.data());
    const Tensor tv = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H, d}, v.data());
    const Tensor tg = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H}, g.data());
    const Tensor tb = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H}, beta.data());
    const Tensor ts = put(*gpu, keep, BufferUsage::PrefixState, DType::F32, {H, d, d}, state.data());
    const Tensor out = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n, H, d}, nullptr);
    const Tensor ts_out =
        s.rows == 1 ? put(*gpu, keep, BufferUsage::Activations, DType::F32, {H, d, d}, nullptr) : Tensor();
    const Timing t = time_calls(
        *gpu, [&] { return gpu->gated_delta_rule(tq, tq, tv, tg, tb, ts, layout, out, ts_out); }, 1, 2.0);
    std::printf("gated_delta_rule %lld rows x %lld tokens%s: median %.3f ms, min %.3f ms (%zu runs)\n",
                static_cast<long long>(s.rows), static_cast<long long>(s.len), s.from_state ? " from a state" : "",
                t.median_ms, t.min_ms, t.samples);
  }
}

// 70,000 rows, one workgroup each: more than the 65,535 workgroups of one dimension.
TEST(WebGpu, FoldsDispatchesAboveTheDimensionLimit) {
  REQUIRE_WEBGPU(gpu);
  Backend& cpu = cpu_reference();
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t rows = 70000, d = 8;
  const std::vector<float> x = random_floats(rows * d, 4);
  const std::vector<float> w = random_floats(d, 5, 0.1f);
  std::vector<float> got;
  for (Backend* b : {gpu.get(), &cpu}) {
    const Tensor tx = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, x.data());
    const Tensor tw = put(*b, keep, BufferUsage::Weights, DType::F32, {d}, w.data());
    const Tensor out = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, nullptr);
    ASSERT_TRUE(b->rms_norm(tx, tw, 1e-6f, out).ok());
    if (b == gpu.get()) {
      got = get(*b, out);
    } else {
      EXPECT_LE(max_abs_diff(got, get(*b, out)), 1e-5);
    }
  }
}

// Inside one pass, an upload lands where it sits in the op order: the same region uploaded twice, read
// by an op after each upload, gives each op its own data (a queue write straight into the region
// would make both ops see the second upload).
TEST(WebGpu, UploadsLandInOpOrder) {
  REQUIRE_WEBGPU(gpu);
  std::vector<std::shared_ptr<Buffer>> keep;
  const int64_t n = 64;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), zero(n, 0.0f);
  const Tensor region = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n}, nullptr);
  const Tensor z = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n}, zero.data());
  const Tensor out1 = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n}, nullptr);
  const Tensor out2 = put(*gpu, keep, BufferUsage::Activations, DType::F32, {n}, nullptr);
  ASSERT_TRUE(gpu->synchronize().ok());
  ASSERT_TRUE(gpu->upload(region, a.data(), n * 4).ok());
  ASSERT_TRUE(gpu->add(region, z, out1).ok());
  ASSERT_TRUE(gpu->upload(region, b.data(), n * 4).ok());
  ASSERT_TRUE(gpu->add(region, z, out2).ok());
  EXPECT_EQ(get(*gpu, out1), a);
  EXPECT_EQ(get(*gpu, out2), b);
}

// KEV_WEBGPU_TRACE=ops (read when the device opens): every dispatch of a flush is timed by timestamp
// queries and printed per op after its wait, and the results are those of an untraced run.
TEST(WebGpu, TraceTimesEveryDispatch) {
  REQUIRE_WEBGPU(plain);
  setenv("KEV_WEBGPU_TRACE", "ops", 1);
  auto r = create_backend("webgpu", BackendOptions{});
  unsetenv("KEV_WEBGPU_TRACE");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::shared_ptr<Backend> traced = r.value();
  const int64_t rows = 3, d = 64;
  const std::vector<float> x = random_floats(rows * d, 6), y = random_floats(rows * d, 7);
  const std::vector<float> w = random_floats(d, 8, 0.1f);
  std::vector<std::vector<float>> results;
  std::string log;
  for (Backend* b : {plain.get(), traced.get()}) {
    std::vector<std::shared_ptr<Buffer>> keep;
    const Tensor tx = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, x.data());
    const Tensor ty = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, y.data());
    const Tensor tw = put(*b, keep, BufferUsage::Weights, DType::F32, {d}, w.data());
    const Tensor sum = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, nullptr);
    const Tensor out = put(*b, keep, BufferUsage::Activations, DType::F32, {rows, d}, nullptr);
    ASSERT_TRUE(b->synchronize().ok());
    if (b == traced.get()) ::testing::internal::CaptureStderr();
    ASSERT_TRUE(b->add(tx, ty, sum).ok());
    ASSERT_TRUE(b->rms_norm(sum, tw, 1e-6f, out).ok());
    results.push_back(get(*b, out));
    if (b == traced.get()) log = ::testing::internal::GetCapturedStderr();
  }
  if (log.find("no timestamp queries") != std::string::npos) {
    std::printf("%s", log.c_str());
    GTEST_SKIP() << log;
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_NE(log.find("kev-webgpu-trace pass 1 ops: 2 dispatches, GPU "), std::string::npos) << log;
  EXPECT_NE(log.find("  add add x"), std::string::npos) << log;
  EXPECT_NE(log.find("  rms_norm rms_norm x3 "), std::string::npos) << log;
}

// kev_export's audit: no adapter, WebGPU default limits; the model's ops are supported, and a
// tensor over the default 128 MiB binding limit is not (unless it is a splittable weight).
TEST(WebGpu, AuditOnlyAnswersUnderDefaultLimits) {
  BackendOptions o;
  o.audit_only = true;
  auto b = create_backend("webgpu", o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto mk = [](DType dt, std::initializer_list<int64_t> shape) {
    Tensor t;
    t.dtype = dt;
    t.rank = static_cast<int>(shape.size());
    int i = 0;
    for (int64_t s : shape) t.shape[i++] = s;
    int64_t st = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.stride[d] = st;
      st *= t.shape[d];
    }
    return t;
  };
  // The 0.8B embedding table (~1 GiB F32) is split at upload; its rows are small.
  EXPECT_TRUE((*b)->supports(
      OpDesc{OpKind::Embedding, {mk(DType::F32, {248320, 1024}), mk(DType::I32, {7}), mk(DType::F32, {7, 1024})}}));
  EXPECT_FALSE((*b)->supports(OpDesc{OpKind::Add, {mk(DType::F32, {40000, 1024}), mk(DType::F32, {40000, 1024}),
                                                   mk(DType::F32, {40000, 1024})}}));
  EXPECT_FALSE((*b)->supports(
      OpDesc{OpKind::Matmul, {mk(DType::F32, {4, 64}), mk(DType::BF16, {8, 64}), Tensor(), mk(DType::F32, {4, 8})}}));
  EXPECT_EQ((*b)->alloc(16, BufferUsage::Activations).status().code(), ErrorCode::Unsupported);
}

}  // namespace
}  // namespace kev::optest

#endif  // KEV_HAVE_WEBGPU
