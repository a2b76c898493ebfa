// cp.async staging of global memory into shared memory (sm_80+), shared by the tensor-core kernels
// (attention, the gated delta rule, the small-n FP16 GEMM).
#pragma once

#include <cuda_runtime.h>

namespace kev::cuda {

// Asynchronous global → shared copies of N = 16 or 4 bytes; fill = false writes zeros and reads
// nothing (src must still be a valid address).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool fill) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(fill ? 16 : 0) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(fill ? 4 : 0) : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// Waits until at most `Pending` of this thread's committed groups are still in flight (a multi-stage
// pipeline's wait for its oldest stage).
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

}  // namespace kev::cuda
