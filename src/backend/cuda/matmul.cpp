// GemmRunner (see matmul.h).
#include "backend/cuda/matmul.h"


#include "backend/cuda/cuda_check.h"

namespace kev::cuda {

GemmRunner::~GemmRunner() {
  for (auto& [shape, plan] : plans_) destroy(plan);
  if (handle_) cublasLtDestroy(handle_);
}

void GemmRunner::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

Status GemmRunner::init(void* workspace, size_t workspace_bytes) {
  KEV_CUBLAS_TRY(cublasLtCreate(&handle_));
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
  return Status::success();
}

int column_alignment(const void* ptr, int64_t ld_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld_bytes) | 256u;
  return static_cast<int>(bits & (~bits + 1));
}

Status GemmRunner::prepare(const GemmShape& s) {
  if (s.n == 0 || s.m == 0 || s.k == 0 || plans_.count(s)) return Status::success();
  Plan p;
  const cudaDataType_t ab = s.w == DType::BF16 ? CUDA_R_16BF : s.w == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
  auto fail = [&](Status st) {
    destroy(p);
    return st;
  };
  auto attempt = [&]() -> Status {
    KEV_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    KEV_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    KEV_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    KEV_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(s.k), static_cast<uint64_t>(s.m), s.k));
    KEV_CUBLAS_TRY(
        cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(s.k), static_cast<uint64_t>(s.n), s.ldx));
    KEV_CUBLAS_TRY(
        cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, static_cast<uint64_t>(s.m), static_cast<uint64_t>(s.n), s.ldo));
    cublasLtMatmulPreference_t pref = nullptr;
    KEV_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t al_a = static_cast<uint32_t>(s.align_w), al_b = static_cast<uint32_t>(s.align_x),
                   al_d = static_cast<uint32_t>(s.align_out);
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
      found = 0;  // reported below with the shape
    } else {
      KEV_CUBLAS_TRY(st);
    }
    KEV_CHECK(found > 0, ErrorCode::Unsupported, "matmul: cuBLASLt has no algorithm for n=", s.n, " k=", s.k,
              " m=", s.m, " (", dtype_name(s.w), " weights, ldx ", s.ldx, ", ldo ", s.ldo, ", alignments ",
              s.align_x, "/", s.align_w, "/", s.align_out, " bytes)");
    p.algo = result.algo;
    return Status::success();
  };
  Status st = attempt();
  if (!st.ok()) return fail(st);
  plans_.emplace(s, p);
  return Status::success();
}

Status GemmRunner::enqueue(const GemmShape& s, const void* x, const void* w, float* out, cudaStream_t stream) const {
  if (s.n == 0 || s.m == 0 || s.k == 0) return Status::success();
  auto it = plans_.find(s);
  KEV_CHECK(it != plans_.end(), ErrorCode::Internal, "matmul: no cuBLASLt plan prepared for n=", s.n, " k=", s.k,
            " m=", s.m);
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = 0.0f;
  KEV_CUBLAS_TRY(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &p.algo, workspace_,
                                workspace_bytes_, stream));
  return Status::success();
}

}  // namespace kev::cuda
