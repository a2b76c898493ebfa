// How an Engine's Options become the options of the backend it creates. Shared with tools that
// create a second backend beside an Engine (kev_benchmark's ceilings), so both are configured alike.
#pragma once

#include "backend/backend.h"
#include "kev/kev.h"

namespace kev {

// Fails, naming the accepted values, on an unknown Options::cuda_gemm.
Result<BackendOptions> backend_options(const Options& options);

}  // namespace kev
