// The CPU backend: FP32 kernels over 64-byte aligned host memory.
//
//   BackendOptions opts;            // opts.threads = 0: hardware concurrency
//   opts.reference_mode = false;    // true: plain serial loops in double, the op-test yardstick
//   KEV_ASSIGN_OR_RETURN(std::shared_ptr<Backend> cpu, create_cpu_backend(opts));
//
// Contracts:
// - Ops run synchronously on the calling thread (helped by the backend's thread pool), so
//   synchronize() has nothing to wait for and download() data is ready when it returns.
// - Buffers are HostBuffers; handle() is the host pointer. upload/download/fill_zero are bounds-checked
//   memcpy/memset over a contiguous tensor.
// - FAST mode sets OpenBLAS's (process-global) thread count to the backend's thread count; kernels that
//   call BLAS from several pool threads drop it to 1 for their duration. One backend instance may be
//   used from one thread at a time; two FAST instances in one process share OpenBLAS's setting.
// - supports() runs the same operand checks as the ops (minus buffer bounds and the parameters it
//   cannot see: SeqLayout, n_rot, ...), so an op that supports() accepts fails only on those.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace kev {

Result<std::shared_ptr<Backend>> create_cpu_backend(const BackendOptions& options);

}  // namespace kev
