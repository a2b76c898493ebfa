// How the backend's kernels are launched: every kernel of ours goes through launch(), which makes it the
// programmatic dependent of the kernel before it on the stream (PDL, sm_90+): the driver may start its
// blocks while that kernel still runs, so the gap between two kernels (block scheduling, the launch's
// own latency) overlaps the earlier kernel's tail instead of idling the GPU. Most of a Kev pass's ~290
// commands are 5–40 µs kernels, so those gaps are a visible share of it.
//
// The contract that keeps this correct, kept by every kernel launched here:
//   1. wait_for_producers() (griddepcontrol.wait) runs in every thread before its first global memory
//      access, read or write (a kernel may overwrite what the previous one still reads), and before
//      any early return. It returns once the previous kernel has completed and its memory is visible.
//   2. release_dependents() (griddepcontrol.launch_dependents) comes after that wait, so the next
//      kernel's blocks start only once this one's wait has returned in every block.
// Transitivity: the wait covers the immediately preceding kernel only. By (1) a kernel launched here
// cannot complete before its predecessor has, so "K completed" implies "everything before K on the
// stream completed", by induction over the stream. Non-kernel predecessors keep full serialisation:
// the attribute only relaxes kernel-to-kernel order, so a kernel after a memcpy or memset starts after
// it as before (and, in a captured graph, gets an ordinary edge). A predecessor that never triggers
// (a cuBLASLt GEMM, the trace gate, a kernel launched plainly) triggers implicitly as its blocks exit,
// so the dependent starts at its completion, waits for nothing more and has lost nothing. A plainly
// launched kernel after one of ours (a GEMM) waits for full completion, which by (1) again covers all
// earlier work. The one exception to (1) is the GDN recurrence of a short pass, which reads (never
// writes) its inputs before it waits for the products kernel; that products kernel is therefore
// launched plainly (LaunchShape::dependent = false), so the inputs' writers have completed in stream
// order before the recurrence can start (gated_delta_rule.cu).
// Stream capture keeps the attribute: a captured kernel node gets a programmatic edge from the kernel
// node before it, so graph replays overlap the same way (and the first kernel of a graph, with no
// kernel before it in the graph, simply waits for the graph's start).
// Where the kernels were compiled without griddepcontrol (no sm_90 code in the image, e.g. a build
// for sm_80 only running from PTX on a Hopper) or the device is older than sm_90, the attribute is
// never set and both instructions compile to nothing; launches are then exactly plain ones.
// KEV_CUDA_PDL=0 in the environment turns the attribute off (A/B timing; ruling PDL out when
// debugging a race).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/kernels.h"

namespace kev::cuda {

// Rule (1) above: wait for the previous kernel (its completion and memory flush). A no-op when the
// kernel was launched plainly or is compiled for an architecture before sm_90.
__device__ __forceinline__ void wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Rule (2): lets the next kernel's blocks be scheduled (they then wait in wait_for_producers).
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The prologue of every kernel that needs nothing before its wait: the first statement of the kernel.
__device__ __forceinline__ void begin_dependent() {
  wait_for_producers();
  release_dependents();
}

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  unsigned cluster_z = 0;  // > 0: thread block clusters of (1, 1, cluster_z)
  bool dependent = true;   // false: wait for full completion of the previous work (see the exception above)
};

// Launches kernel<<<shape>>>(args...) on `stream`; returns the launch's error (or cudaGetLastError()).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (shape.cluster_z > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = shape.cluster_z;
    ++n;
  }
  if (shape.dependent && dependent_launches()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace kev::cuda
