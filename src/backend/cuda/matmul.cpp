// GemmRunner (see matmul.h).
#include "backend/cuda/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace kev::cuda {

namespace {

constexpr int kTuneCandidates = 8;
constexpr int kTuneRounds = 3;  // timed runs per candidate, each after an L2 flush
constexpr unsigned char kTuneFill = 0x3c;  // x bytes: BF16 0x3c3c ≈ 0.0115, F32 0x3c3c3c3c ≈ 0.0115

// The timed choices of this process, per (device, shape).
std::mutex tuned_mutex;
std::map<std::pair<int, GemmShape>, cublasLtMatmulAlgo_t>& tuned_algos() {
  static std::map<std::pair<int, GemmShape>, cublasLtMatmulAlgo_t> algos;
  return algos;
}

}  // namespace

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

Status GemmRunner::init(int device, void* workspace, size_t workspace_bytes) {
  KEV_CUBLAS_TRY(cublasLtCreate(&handle_));
  device_ = device;
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
  const char* env = std::getenv("KEV_CUDA_GEMM_TUNE");
  tune_ = env != nullptr && std::strcmp(env, "1") == 0;
  return Status::success();
}

int column_alignment(const void* ptr, int64_t ld_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(ld_bytes) | 256u;
  return static_cast<int>(bits & (~bits + 1));
}

Result<int> GemmRunner::fastest(const GemmShape& s, const Plan& p, const cublasLtMatmulHeuristicResult_t* algos,
                                int n, const void* w, cudaStream_t stream) {
  const size_t x_bytes = static_cast<size_t>((s.n - 1) * s.ldx + s.k) * (s.w_bf16 ? 2 : 4);
  const size_t out_bytes = static_cast<size_t>((s.n - 1) * s.ldo + s.m) * 4;
  // In a pass the weights stream from device memory (a model's weights far exceed the L2), so each
  // timed run starts from an L2 overwritten by a buffer of twice its size.
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_) != cudaSuccess) cudaGetLastError();
  const size_t flush_bytes = std::max<size_t>(2 * static_cast<size_t>(l2), size_t{1} << 20);
  void *x = nullptr, *o = nullptr, *flush = nullptr;
  if (cudaMalloc(&x, x_bytes) != cudaSuccess || cudaMalloc(&o, out_bytes) != cudaSuccess ||
      cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    cudaGetLastError();  // no memory to spare for timing: keep the heuristic's choice
    for (void* q : {x, o}) {
      if (q) cudaFree(q);
    }
    return -1;
  }
  cudaEvent_t ev[2] = {nullptr, nullptr};
  auto timed = [&]() -> Result<int> {
    KEV_CUDA_TRY(cudaEventCreate(&ev[0]));
    KEV_CUDA_TRY(cudaEventCreate(&ev[1]));
    KEV_CUDA_TRY(cudaMemsetAsync(x, kTuneFill, x_bytes, stream));
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&](int i) {
      return cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, o, p.d, o, p.d, &algos[i].algo,
                            workspace_, workspace_bytes_, stream);
    };
    std::vector<float> total(static_cast<size_t>(n), 0.0f);
    std::vector<char> usable(static_cast<size_t>(n), 1);
    for (int i = 0; i < n; ++i) {
      if (run(i) != CUBLAS_STATUS_SUCCESS) {  // this candidate is unusable here: skip it
        cudaGetLastError();                   // and leave no launch error for the next op to report
        usable[i] = 0;
      }
    }
    for (int round = 0; round < kTuneRounds; ++round) {
      for (int i = 0; i < n; ++i) {
        if (!usable[i]) continue;
        KEV_CUDA_TRY(cudaMemsetAsync(flush, round + 1, flush_bytes, stream));
        KEV_CUDA_TRY(cudaEventRecord(ev[0], stream));
        KEV_CUBLAS_TRY(run(i));
        KEV_CUDA_TRY(cudaEventRecord(ev[1], stream));
        KEV_CUDA_TRY(cudaEventSynchronize(ev[1]));
        float ms = 0;
        KEV_CUDA_TRY(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        total[i] += ms;
      }
    }
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (usable[i] && (best < 0 || total[i] < total[best])) best = i;
    }
    return best;
  };
  Result<int> best = timed();
  for (cudaEvent_t e : ev) {
    if (e) cudaEventDestroy(e);
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);  // the scratch is idle before it is freed
  cudaFree(x);
  cudaFree(o);
  cudaFree(flush);
  KEV_CUDA_TRY(sync);
  return best;
}

Status GemmRunner::prepare(const GemmShape& s, const void* w, cudaStream_t stream) {
  if (s.n == 0 || s.m == 0 || s.k == 0 || plans_.count(s)) return Status::success();
  Plan p;
  const cudaDataType_t ab = s.w_bf16 ? CUDA_R_16BF : CUDA_R_32F;
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
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
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
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.d, p.d, pref, w && tune_ ? kTuneCandidates : 1,
                                          results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
      found = 0;  // reported below with the shape
    } else {
      KEV_CUBLAS_TRY(st);
    }
    KEV_CHECK(found > 0, ErrorCode::Unsupported, "matmul: cuBLASLt has no algorithm for n=", s.n, " k=", s.k,
              " m=", s.m, " (", s.w_bf16 ? "bf16" : "f32", " weights, ldx ", s.ldx, ", ldo ", s.ldo, ", alignments ",
              s.align_x, "/", s.align_w, "/", s.align_out, " bytes)");
    p.algo = results[0].algo;
    if (w == nullptr || !tune_ || found < 2) return Status::success();
    std::lock_guard<std::mutex> lock(tuned_mutex);
    const auto key = std::make_pair(device_, s);
    auto it = tuned_algos().find(key);
    if (it != tuned_algos().end()) {
      p.algo = it->second;
      return Status::success();
    }
    KEV_ASSIGN_OR_RETURN(const int pick, fastest(s, p, results, found, w, stream));
    if (pick >= 0) {
      p.algo = results[pick].algo;
      tuned_algos().emplace(key, p.algo);
    }
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
