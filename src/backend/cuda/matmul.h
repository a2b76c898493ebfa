// Dense projections through cuBLASLt: out[n,m] = x[n,k] · W[m,k]ᵀ (+ bias[m]), row-major, x and out
// row-strided views, W contiguous.
//
// cuBLASLt is column-major, so the row-major product is computed as its transpose: D (m×n, ld = out's
// row stride) = op_T(A) · B with A = W seen as k×m (ld = k) and B = x seen as k×n (ld = x's row stride).
//   F32 W: A, B, D F32, CUBLAS_COMPUTE_32F (no TF32: the FP32 engine's golden parity needs ~1e-6).
//   BF16 W: x is first rounded to BF16 into contiguous scratch (ld = k); A, B BF16, D F32,
//   CUBLAS_COMPUTE_32F with F32 scale, so only x's rounding separates it from an FP32 product with the
//   BF16 weights widened.
// A bias is added by a separate row kernel after the GEMM (one extra pass over out, only for the few
// projections that have a bias), which avoids depending on cuBLASLt's per-type bias-epilogue rules.
// k = 0 writes the bias (or zeros) only. Descriptors and the algorithm are cached per shape key (sizes,
// leading dimensions, dtype, pointer alignments); enqueue() makes no allocation and no
// synchronisation, so it can be captured into a CUDA graph.
// Algorithm choice: cuBLASLt's first heuristic answer. With KEV_CUDA_GEMM_TUNE=1 in the environment
// (an experiment: on the H200 it made the 0.8B short workload slower, 5.39/5.34 ms prefill/evaluation
// against 5.26/4.92 without, so it is off by default) prepare() asks for up to kTuneCandidates and,
// when given a stream and the weights, times each on scratch operands (the real W, x filled
// with a small constant, out in its own cudaMalloc'd scratch, freed after), three runs each after an
// L2 flush (in a pass W comes from device memory), and keeps the fastest.
// That costs a few ms once per shape and process: the choice is kept process-wide per (device,
// shape), so every backend of a process computes the same bits for the same shape (two processes may
// choose differently). It needs an idle stream (the backend records between flushes, so its stream
// is). A failed scratch allocation keeps the heuristic's answer.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kev/result.h"

namespace kev::cuda {

struct GemmShape {
  int64_t n = 0, k = 0, m = 0;
  int64_t ldx = 0, ldo = 0;  // leading dimensions in elements (x's as given to cuBLASLt)
  bool w_bf16 = false;
  int align_x = 0, align_w = 0, align_out = 0;  // guaranteed byte alignment of every column start
  auto key() const { return std::tie(n, k, m, ldx, ldo, w_bf16, align_x, align_w, align_out); }
  bool operator<(const GemmShape& o) const { return key() < o.key(); }
};

class GemmRunner {
 public:
  GemmRunner() = default;
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  Status init(int device, void* workspace, size_t workspace_bytes);
  // Builds (or finds) the plan for `shape`; call before recording so enqueue() cannot fail on planning.
  // With `w` (the weights the GEMM will read) and an idle `stream`, times the candidates (see above).
  Status prepare(const GemmShape& shape, const void* w = nullptr, cudaStream_t stream = nullptr);
  // x is F32 or (w_bf16) the BF16 copy, with shape.ldx; requires prepare(shape) first.
  Status enqueue(const GemmShape& shape, const void* x, const void* w, float* out, cudaStream_t stream) const;
  size_t cublaslt_version() const { return cublasLtGetVersion(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  static void destroy(Plan& p);
  // Index of the fastest of `algos` on scratch operands (see above); -1 when scratch is unavailable.
  Result<int> fastest(const GemmShape& s, const Plan& p, const cublasLtMatmulHeuristicResult_t* algos, int n,
                      const void* w, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<GemmShape, Plan> plans_;
  int device_ = 0;
  bool tune_ = true;
};

// Largest power of two (<= 256) dividing both the address and the leading dimension in bytes.
int column_alignment(const void* ptr, int64_t ld_bytes);

}  // namespace kev::cuda
