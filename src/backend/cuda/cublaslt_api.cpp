// Loading cuBLASLt at run time (see cublaslt_api.h).
#include "backend/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <type_traits>

namespace kev::cuda {

Result<CublasLtApi> load_cublaslt_from(const std::vector<std::string>& candidates) {
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : candidates) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += cat(tried.empty() ? "" : "; ", why ? why : name);
  }
  KEV_CHECK(lib != nullptr, ErrorCode::Device, "cuda: cannot load cuBLASLt (", tried,
            "); install the CUDA toolkit's cuBLAS or put its lib directory on LD_LIBRARY_PATH");
  CublasLtApi api{};
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) missing += cat(missing.empty() ? "" : ", ", name);
  };
  // Each member is looked up by its own name.
#define KEV_BIND(f) bind(api.f, #f)
  KEV_BIND(cublasLtCreate);
  KEV_BIND(cublasLtDestroy);
  KEV_BIND(cublasLtGetVersion);
  KEV_BIND(cublasLtGetStatusName);
  KEV_BIND(cublasLtGetStatusString);
  KEV_BIND(cublasLtMatmul);
  KEV_BIND(cublasLtMatmulDescCreate);
  KEV_BIND(cublasLtMatmulDescDestroy);
  KEV_BIND(cublasLtMatmulDescSetAttribute);
  KEV_BIND(cublasLtMatrixLayoutCreate);
  KEV_BIND(cublasLtMatrixLayoutDestroy);
  KEV_BIND(cublasLtMatrixLayoutSetAttribute);
  KEV_BIND(cublasLtMatmulPreferenceCreate);
  KEV_BIND(cublasLtMatmulPreferenceDestroy);
  KEV_BIND(cublasLtMatmulPreferenceSetAttribute);
  KEV_BIND(cublasLtMatmulAlgoGetHeuristic);
#undef KEV_BIND
  if (!missing.empty()) {
    dlclose(lib);
    return Status(ErrorCode::Device, cat("cuda: the cuBLASLt library found lacks ", missing));
  }
  return api;
}

Result<const CublasLtApi*> load_cublaslt() {
  static const Result<CublasLtApi> loaded = load_cublaslt_from(
      {cat("libcublasLt.so.", CUBLAS_VER_MAJOR), cat(KEV_CUDA_LIBRARY_DIR, "/libcublasLt.so.", CUBLAS_VER_MAJOR)});
  if (!loaded.ok()) return loaded.status();
  return &loaded.value();
}

}  // namespace kev::cuda
