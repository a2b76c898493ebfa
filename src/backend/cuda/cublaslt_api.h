// cuBLASLt, loaded when the CUDA backend starts instead of linked. libcublasLt is ~540 MB, and loading
// it alone costs every process that links it ~0.4 s and ~210 MB of resident memory before main() (an
// empty program on the 2-core build machine: 0.00 → 0.42 s), whether or not it ever runs a GPU op: CPU
// and WebGPU runs of the tools, and each of the hundreds of test processes ctest starts. A linked
// binary also does not start at all where the library is missing. Loaded on demand, only
// create_backend("cuda") pays, and where the library is missing it fails with the loader's reason.
//
//   KEV_ASSIGN_OR_RETURN(const CublasLtApi* lt, load_cublaslt());
//   KEV_CUBLAS_TRY(lt->cublasLtCreate(&handle));   // a Device Status naming the call on error
//
// The table's members carry the names and (through decltype) the exact types of cublasLt.h's functions,
// so a call through it reads and type-checks as the direct call did.
#pragma once

#include <cublasLt.h>

#include <string>
#include <vector>

#include "common/check.h"
#include "kev/result.h"

namespace kev::cuda {

struct CublasLtApi {
  decltype(&::cublasLtCreate) cublasLtCreate;
  decltype(&::cublasLtDestroy) cublasLtDestroy;
  decltype(&::cublasLtGetVersion) cublasLtGetVersion;
  decltype(&::cublasLtGetStatusName) cublasLtGetStatusName;
  decltype(&::cublasLtGetStatusString) cublasLtGetStatusString;
  decltype(&::cublasLtMatmul) cublasLtMatmul;
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) cublasLtMatrixLayoutSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic;
};

// The library this build's header belongs to (libcublasLt.so.<CUBLAS_VER_MAJOR>), looked up as dlopen
// does (LD_LIBRARY_PATH, the program's run path, the system's cache), then in the toolkit directory
// the build found. Loaded once per process: later calls return the same table, or the same error.
Result<const CublasLtApi*> load_cublaslt();

// The same from the first of `candidates` (file names or paths) that dlopen accepts, uncached: what
// load_cublaslt() does once. The library stays loaded for the life of the process.
Result<CublasLtApi> load_cublaslt_from(const std::vector<std::string>& candidates);

// A status a call through the loaded table returned, named by the library itself.
inline Status cublas_status(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::success();
  const Result<const CublasLtApi*> lt = load_cublaslt();  // loaded: only a loaded library returns a status
  const std::string name = lt.ok() ? cat(lt.value()->cublasLtGetStatusName(st), " (",
                                         lt.value()->cublasLtGetStatusString(st), ")")
                                   : cat("status ", static_cast<int>(st));
  return Status(ErrorCode::Device, cat("cuBLASLt: ", call, " failed: ", name, " at ", file, ":", line));
}

}  // namespace kev::cuda

#define KEV_CUBLAS_TRY(call) KEV_TRY(::kev::cuda::cublas_status((call), #call, __FILE__, __LINE__))
