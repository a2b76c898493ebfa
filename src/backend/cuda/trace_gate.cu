// The per-op trace's stream gate (pass_recorder.h, KEV_CUDA_TRACE=ops): one thread spins until a word
// in mapped pinned host memory reaches `value`, holding back everything enqueued after it on the
// stream. The host enqueues a batch of commands with their timing events behind the gate and then
// writes the word, so the events time the kernels back to back rather than the host's launch rate.
// Launch: 1 block of 1 thread; polls every ~1 µs, for at most 200 ms. Only used while tracing.
#include "backend/cuda/kernels.h"

namespace kev::cuda {

namespace {

// Gives up after kGiveUpNs so that nothing can hang on a gate (e.g. a driver operation that waits for
// the device to idle while the host has not yet opened it); the trace then includes the wait.
constexpr unsigned long long kGiveUpNs = 200ull * 1000 * 1000;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void wait_gate_kernel(const volatile uint32_t* word, uint32_t value) {
  const unsigned long long start = global_ns();
  while (*word < value && global_ns() - start < kGiveUpNs) __nanosleep(1000);
}

}  // namespace

cudaError_t launch_wait_gate(const uint32_t* word, uint32_t value, cudaStream_t stream) {
  wait_gate_kernel<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

}  // namespace kev::cuda
