// CUDA status codes turned into kev Status values at the call site, with file:line, so a failing
// runtime call surfaces as a Device error naming the call instead of an abort (cuBLASLt's: cublaslt_api.h).
//
//   KEV_CUDA_TRY(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));   // returns a Device Status on error
#pragma once

#include <cuda_runtime.h>

#include "common/check.h"

namespace kev::cuda {

inline Status cuda_status(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return Status::success();
  return Status(ErrorCode::Device, cat("cuda: ", call, " failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ") at ", file, ":", line));
}

}  // namespace kev::cuda

#define KEV_CUDA_TRY(call) KEV_TRY(::kev::cuda::cuda_status((call), #call, __FILE__, __LINE__))
