// The CUDA backend: FP32 activations on one NVIDIA GPU, GEMMs through cuBLASLt, everything else in
// hand-written kernels (one file per op family, each documenting its math and launch shape).
//
//   BackendOptions opts;
//   opts.device = 0;            // CUDA device ordinal
//   opts.cuda_graphs = true;    // replay recurring passes as CUDA graphs
//   KEV_ASSIGN_OR_RETURN(std::shared_ptr<Backend> gpu, create_cuda_backend(opts));
//
// Contracts:
// - Ops validate their operands when called (the same shape rules as the CPU backend's checks, plus the
//   GPU kernels' own limits, plus buffer bounds) and are then only recorded: nothing runs until
//   synchronize() or download(), which run the pass recorded since the last flush on one stream and
//   wait for it once. An error from the GPU is reported by that flush and names the op that failed
//   (for faults found only at the final wait: the ops of the pass).
// - upload() of weights (BufferUsage::Weights, or more than 1 MiB with nothing recorded) copies at
//   once; other uploads are staged in pinned host memory and land in order with the recorded ops.
// - Buffers come from a caching pool (CudaPoolStats); a freed Buffer returns its block to the pool.
// - Ids given to embedding / gather_rows / pointer_logits are not range-checked on the GPU (that would
//   need a synchronisation per op); an out-of-range id yields a NaN row instead of reading out of
//   bounds. The engine's ids come from its tokenizer and layout, which are checked on the host.
// - One backend instance may be used from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace kev {

Result<std::shared_ptr<Backend>> create_cuda_backend(const BackendOptions& options);

// The device memory pool's counters (bytes are block sizes, i.e. rounded to the size class).
struct CudaPoolStats {
  size_t bytes_in_use = 0;        // blocks held by live buffers and the backend's scratch
  size_t bytes_cached = 0;        // freed blocks kept for reuse
  size_t blocks_cached = 0;
  uint64_t device_allocations = 0;  // cudaMalloc calls
  uint64_t reuses = 0;              // requests served from the cache
};

// Pool counters of a backend made by create_cuda_backend; InvalidRequest for any other backend.
Result<CudaPoolStats> cuda_pool_stats(const Backend& backend);

// How flushes ran: passes captured into a graph, graph launches (captures + replays), execs cached,
// and passes that fell back to a direct run because capture or instantiation failed; and the commands
// recorded (an op that joined the command before it, such as a GDN layer's k l2_norm and gates with its
// q l2_norm, adds none).
struct CudaGraphStats {
  uint64_t captures = 0;
  uint64_t launches = 0;
  size_t cached = 0;
  uint64_t capture_failures = 0;
  uint64_t commands = 0;
};
Result<CudaGraphStats> cuda_graph_stats(const Backend& backend);

// How many k slices an F16-weight matmul without bias of x [n, k] and W [m, k] runs in on this
// backend's GPU (1: one GEMM; see matmul.h, k_splits), for tests that must reach the split path.
Result<int> cuda_matmul_k_splits(const Backend& backend, int64_t n, int64_t k, int64_t m);

}  // namespace kev
