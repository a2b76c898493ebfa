// GemmRunner (see matmul.h).
#include "backend/cuda/matmul.h"

#include <limits>

#include "backend/cuda/cuda_check.h"

namespace kev::cuda {

GemmRunner::~GemmRunner() {
  for (auto& [shape, plan] : plans_) destroy(plan);
  if (handle_) lt_->cublasLtDestroy(handle_);
}

void GemmRunner::destroy(Plan& p) const {
  if (p.a) lt_->cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) lt_->cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) lt_->cublasLtMatrixLayoutDestroy(p.d);
  if (p.op) lt_->cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

Status GemmRunner::init(void* workspace, size_t workspace_bytes) {
  KEV_ASSIGN_OR_RETURN(lt_, load_cublaslt());
  KEV_CUBLAS_TRY(lt_->cublasLtCreate(&handle_));
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
  return Status::success();
}

int column_alignment(const void* ptr, int64_t ld_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld_bytes) | 256u;
  return static_cast<int>(bits & (~bits + 1));
}

int k_splits(int64_t n, int64_t k, int64_t m, int sms) {
  if (n > kMaxSplitRows) return 1;
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128);
  for (int s = kMaxKSplits; s > 1; --s) {
    if (k % s == 0 && (k / s) % 64 == 0 && k / s >= kMinSlice && tiles * s <= sms) return s;
  }
  return 1;
}

Status GemmRunner::prepare(const GemmShape& s, const void* w, cudaStream_t stream) {
  if (s.n == 0 || s.m == 0 || s.k == 0 || plans_.count(s)) return Status::success();
  Plan p;
  const cudaDataType_t ab = s.w == DType::BF16 ? CUDA_R_16BF : s.w == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  auto fail = [&](Status st) {
    destroy(p);
    return st;
  };
  auto attempt = [&]() -> Status {
    KEV_CUBLAS_TRY(lt_->cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    KEV_CUBLAS_TRY(lt_->cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    KEV_CUBLAS_TRY(lt_->cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    const int64_t ks = s.k / s.splits;  // the k of one slice
    KEV_CUBLAS_TRY(
        lt_->cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(ks), static_cast<uint64_t>(s.m), s.k));
    KEV_CUBLAS_TRY(
        lt_->cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(ks), static_cast<uint64_t>(s.n), s.ldx));
    KEV_CUBLAS_TRY(lt_->cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, static_cast<uint64_t>(s.m),
                                                   static_cast<uint64_t>(s.n), s.ldo));
    if (s.splits > 1) {
      // Slice j: W's and x's columns j·ks.. (their rows in cuBLASLt's column-major view), plane j of out.
      const int32_t count = s.splits;
      const int64_t plane = s.ldo * s.n;
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) {
        KEV_CUBLAS_TRY(
            lt_->cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      }
      KEV_CUBLAS_TRY(
          lt_->cublasLtMatrixLayoutSetAttribute(p.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ks, sizeof(ks)));
      KEV_CUBLAS_TRY(
          lt_->cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ks, sizeof(ks)));
      KEV_CUBLAS_TRY(lt_->cublasLtMatrixLayoutSetAttribute(p.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &plane,
                                                           sizeof(plane)));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    KEV_CUBLAS_TRY(lt_->cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t al_a = static_cast<uint32_t>(s.align_w), al_b = static_cast<uint32_t>(s.align_x),
                   al_d = static_cast<uint32_t>(s.align_out);
    const bool tuned = s.n <= kTunedMaxRows && 2.0 * static_cast<double>(s.n) * static_cast<double>(s.k) *
                                                     static_cast<double>(s.m) >= kTunedGemmFlops;
    cublasLtMatmulHeuristicResult_t results[kTunedCandidates] = {};
    int found = 0;
    cublasStatus_t st =
        lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                     sizeof(al_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                     sizeof(al_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                     sizeof(al_d));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lt_->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                     sizeof(al_d));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lt_->cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.d, p.d, pref, tuned ? kTunedCandidates : 1,
                                               results, &found);
    lt_->cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
      found = 0;  // reported below with the shape
    } else {
      KEV_CUBLAS_TRY(st);
    }
    KEV_CHECK(found > 0, ErrorCode::Unsupported, "matmul: cuBLASLt has no algorithm for n=", s.n, " k=", s.k,
              " m=", s.m, " (", dtype_name(s.w), " weights, ldx ", s.ldx, ", ldo ", s.ldo, ", alignments ",
              s.align_x, "/", s.align_w, "/", s.align_out, " bytes, ", s.splits, " k slices)");
    int pick = 0;
    if (found > 1) {
      KEV_ASSIGN_OR_RETURN(pick, fastest(p, s, results, found, w, stream));
    }
    p.algo = results[pick].algo;
    return Status::success();
  };
  Status st = attempt();
  if (!st.ok()) return fail(st);
  plans_.emplace(s, p);
  return Status::success();
}

Result<int> GemmRunner::fastest(const Plan& p, const GemmShape& s, const cublasLtMatmulHeuristicResult_t* candidates,
                                int n, const void* w, cudaStream_t stream) const {
  constexpr int kWarmups = 2, kRuns = 5;
  const size_t x_bytes = static_cast<size_t>(s.ldx * (s.n - 1) + s.k) * dtype_size(s.w);
  const size_t out_bytes = static_cast<size_t>(s.ldo * (s.n - 1) + s.m) * sizeof(float) * s.splits;
  KEV_CUDA_TRY(cudaStreamSynchronize(stream));  // segments of the pass being recorded may still run
  void* x = nullptr;
  void* out = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // Everything is released on every path; the first failure is the result.
  auto timed = [&]() -> Result<int> {
    KEV_CUDA_TRY(cudaMallocAsync(&x, x_bytes, stream));
    KEV_CUDA_TRY(cudaMallocAsync(&out, out_bytes, stream));
    KEV_CUDA_TRY(cudaMemsetAsync(x, 0, x_bytes, stream));
    KEV_CUDA_TRY(cudaEventCreate(&start));
    KEV_CUDA_TRY(cudaEventCreate(&stop));
    const float alpha = 1.0f, beta = 0.0f;
    int best = 0;
    float best_ms = std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) {
      auto run = [&]() {
        return lt_->cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d,
                                   &candidates[i].algo, workspace_, workspace_bytes_, stream);
      };
      bool ok = true;
      for (int r = 0; r < kWarmups && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
      if (!ok) continue;  // a candidate that cannot run here is passed over
      KEV_CUDA_TRY(cudaEventRecord(start, stream));
      for (int r = 0; r < kRuns; ++r) KEV_CUBLAS_TRY(run());
      KEV_CUDA_TRY(cudaEventRecord(stop, stream));
      KEV_CUDA_TRY(cudaEventSynchronize(stop));
      float ms = 0;
      KEV_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
      if (ms < best_ms) {
        best_ms = ms;
        best = i;
      }
    }
    return best;
  };
  Result<int> best = timed();
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (x) cudaFreeAsync(x, stream);
  if (out) cudaFreeAsync(out, stream);
  const cudaError_t drained = cudaStreamSynchronize(stream);
  if (!best.ok()) return best;
  KEV_CUDA_TRY(drained);
  return best;
}

Status GemmRunner::enqueue(const GemmShape& s, const void* x, const void* w, float* out, cudaStream_t stream) const {
  if (s.n == 0 || s.m == 0 || s.k == 0) return Status::success();
  auto it = plans_.find(s);
  KEV_CHECK(it != plans_.end(), ErrorCode::Internal, "matmul: no cuBLASLt plan prepared for n=", s.n, " k=", s.k,
            " m=", s.m);
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = 0.0f;
  KEV_CUBLAS_TRY(lt_->cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &p.algo,
                                     workspace_, workspace_bytes_, stream));
  return Status::success();
}

}  // namespace kev::cuda
