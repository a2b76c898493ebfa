// Dense projections through cuBLASLt: out[n,m] = x[n,k] · W[m,k]ᵀ (+ bias[m]), row-major, x and out
// row-strided views, W contiguous.
//
// cuBLASLt is column-major, so the row-major product is computed as its transpose: D (m×n, ld = out's
// row stride) = op_T(A) · B with A = W seen as k×m (ld = k) and B = x seen as k×n (ld = x's row stride).
//   F32 W: A, B, D F32, CUBLAS_COMPUTE_32F (no TF32: the FP32 engine's golden parity needs ~1e-6).
//   BF16 W: x arrives as BF16 in contiguous scratch (ld = k): rounded, or split into two BF16 halves
//   stacked as 2n rows (cuda_backend.cpp's matmul); A, B BF16, D F32, CUBLAS_COMPUTE_32F with F32 scale.
//   F16 W: x arrives as F16 in contiguous scratch, each row scaled by a power of two (f16_rows.cuh),
//   written by a conversion kernel or by the op that produced x (cuda_backend.cpp's matmul); A, B F16,
//   D F32, CUBLAS_COMPUTE_32F.
// A bias is added by a separate row kernel after the GEMM (one extra pass over out, only for the few
// projections that have a bias), which avoids depending on cuBLASLt's per-type bias-epilogue rules.
// k = 0 writes the bias (or zeros) only. Descriptors and the algorithm are cached per shape key (sizes,
// leading dimensions, dtype, pointer alignments); enqueue() makes no allocation and no
// synchronisation, so it can be captured into a CUDA graph.
// Algorithm choice: cuBLASLt's first heuristic answer, except for GEMMs of at least kTunedGemmFlops
// and at most kTunedMaxRows rows, where the first kTunedCandidates answers are timed once per shape (on
// the backend's stream after it drains, with the real weights and throw-away x and out; ~2–4 ms per
// 4B shape) and the fastest is kept. At the 4B's gate_up with the 470 rows of a fused state + score
// pass the first answer took 82 µs and the sixth 68 (H200, 2026-12-03); at the 0.8B's shapes and at
// 220–250 rows no answer beat the first by more than ~1.5 µs (docs/backends.md, Tracing), a small
// GEMM's timing would cost more than it could save, and long prefills' GEMMs (n in the thousands, each
// candidate's timing ~3 ms) were not measured to gain.
// K split into planes (GemmShape::splits > 1): one batched GEMM over `splits` equal slices of k writes
// one FP32 plane per slice ([splits, n, m] contiguous scratch); cuda_backend.cpp's matmul adds the
// planes in slice order, either in a row kernel with the row rescale (launch_planes_sum_rows) or in the
// add_rms_norm that reads the product (NormArgs::z_planes), the same bits either way. For narrow outputs
// at few rows cuBLASLt's own split-K runs a separate reduce kernel (4B MLP down at 220 rows: its split-3
// GEMM 21.8 µs + splitKreduce 5.4 µs under Nsight Compute) or its plain GEMM leaves SMs idle;
// k_splits() picks the slices. H200, 2026-12-03, GEMM alone in a CUDA graph of 20, weights cycled past
// L2, cuBLASLt's first answer, unsplit → split: 4B down (n 220, k 9216, m 2560) 23.5 → 18.8 µs in 3
// slices, 4B out_proj (k 4096) 14.1 → 11.9 in 2, 0.8B down (k 3584, m 1024) 8.5 → 6.4 in 2 (5.9 in 4),
// 0.8B out_proj (k 2048) 6.3 → 4.7 in 2; at 470 rows the 4B shapes gained nothing (down 30.6 → 31.4 in
// 2). The consumer pays for reading the planes (`KEV_CUDA_TRACE=ops`, model pass): add_rms_norm +f16
// 7.9 → 9.2 µs a call at 4B (3 and 2 planes), 6.5 → 7.4 at 0.8B with 4 planes, which ate the 0.8B's
// GEMM gain at slices of 512 and 896 (and at 470 rows); hence slices of at least kMinSlice and at most
// two 128-row tiles of x. Docs: docs/backends.md (Thirteenth session).

#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/kernels.h"
#include "backend/tensor.h"
#include "kev/result.h"

namespace kev::cuda {

constexpr double kTunedGemmFlops = 16e9;  // 2·n·k·m
constexpr int64_t kTunedMaxRows = 1024;
constexpr int kTunedCandidates = 8;

struct GemmShape {
  int64_t n = 0, k = 0, m = 0;
  int64_t ldx = 0, ldo = 0;  // leading dimensions in elements (x's as given to cuBLASLt)
  DType w = DType::F32;  // F32, BF16 or F16 (x as given to cuBLASLt has the same dtype)
  int align_x = 0, align_w = 0, align_out = 0;  // guaranteed byte alignment of every column start
  // k in `splits` equal slices, one plane of out each: out [splits, n, m] with ldo = m (see above).
  int splits = 1;
  auto key() const { return std::tie(n, k, m, ldx, ldo, w, align_x, align_w, align_out, splits); }
  bool operator<(const GemmShape& o) const { return key() < o.key(); }
};

class GemmRunner {
 public:
  GemmRunner() = default;
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Loads cuBLASLt (cublaslt_api.h) and creates its handle.
  Status init(void* workspace, size_t workspace_bytes);
  // Builds (or finds) the plan for `shape`; call before recording so enqueue() cannot fail on planning.
  // `w` (the weights) and `stream` serve the timing of a large GEMM's candidates; the stream is
  // synchronised first, so no capture may be open on it.
  Status prepare(const GemmShape& shape, const void* w, cudaStream_t stream);
  // x has shape.w's dtype (the F32 input, or its BF16 / F16 copy), with shape.ldx; requires prepare(shape) first.
  Status enqueue(const GemmShape& shape, const void* x, const void* w, float* out, cudaStream_t stream) const;
  size_t cublaslt_version() const { return lt_->cublasLtGetVersion(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  void destroy(Plan& p) const;
  // The index of the fastest of `n` candidate algorithms for `p` (see prepare()).
  Result<int> fastest(const Plan& p, const GemmShape& s, const cublasLtMatmulHeuristicResult_t* candidates, int n,
                      const void* w, cudaStream_t stream) const;

  const CublasLtApi* lt_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<GemmShape, Plan> plans_;
};

// Largest power of two (<= 256) dividing both the address and the leading dimension in bytes.
int column_alignment(const void* ptr, int64_t ld_bytes);

// The k slices for an [n, k] · [k, m] GEMM on a GPU of `sms` SMs: for n <= kMaxSplitRows, the most
// slices s <= kMaxKSplits whose 128 × 128 output tiles times s still fit one wave
// (⌈m/128⌉·⌈n/128⌉·s <= sms), each slice a multiple of 64 and at least kMinSlice long; 1 (no split)
// when none does.
constexpr int64_t kMaxSplitRows = 256, kMinSlice = 1024;
int k_splits(int64_t n, int64_t k, int64_t m, int sms);

}  // namespace kev::cuda
