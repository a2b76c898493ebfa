// The WebGPU backend: FP32 kernels in WGSL on native Dawn (Vulkan, Metal or D3D12; lavapipe in CI).
//
//   BackendOptions opts;
//   opts.adapter = "cpu";           // "" = default (high-performance) adapter; or "discrete", a name part
//   KEV_ASSIGN_OR_RETURN(std::shared_ptr<Backend> gpu, create_webgpu_backend(opts));
//   // ops record in call order (submitted in pieces as they come); download() / synchronize() wait
//
// Contracts:
// - One queue-ordered stream of commands per pass: ops record compute passes in call order, handed to
//   the GPU in pieces while recording goes on; upload() of activations lands at its place in that
//   order (staged through a ring and copied in the command stream), so the forward's arena may reuse
//   memory within a pass; synchronize() and download() submit the rest and wait. Weight uploads
//   (BufferUsage::Weights) go straight to the queue.
// - Limits are planned for, not assumed: a Weights buffer larger than the storage binding limit is
//   split at upload on row boundaries into several GPU buffers, and embedding / matmul dispatch per
//   piece; every other operand must fit one binding (supports() says so). Workgroup counts beyond the
//   per-dimension limit are folded into 2-D grids.
// - supports() applies the CPU backend's operand rules (same op semantics) plus the WebGPU kernels'
//   own preconditions (FP32; BF16 only for embedding tables and copy; GDN dk <= 128; attention head
//   size <= 256; binding sizes). With options.audit_only no adapter is opened and supports() answers
//   under the WebGPU specification's default limits; memory and ops then return Unsupported.
// - Buffers hold WGPUBuffers; handle() is the first one. One backend is used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace kev {

Result<std::shared_ptr<Backend>> create_webgpu_backend(const BackendOptions& options);

// Test hooks.
// The same backend planning with a storage binding limit of at most `max_binding_bytes` (split
// weights and binding-size checks can then be exercised with small tensors) and, with `subgroups`
// false, building its kernels with the workgroup-memory reductions even where the adapter's
// subgroups work (so both variants run against the CPU reference on one adapter).
struct WebGpuTestHooks {
  uint64_t max_binding_bytes = 0;
  bool subgroups = true;
  bool null_backend_only = false;  // offer open() only Dawn's Null adapter (which it must refuse)
};
Result<std::shared_ptr<Backend>> create_webgpu_backend_for_test(const BackendOptions& options,
                                                                const WebGpuTestHooks& hooks);
// The same with only the binding limit lowered.
Result<std::shared_ptr<Backend>> create_webgpu_backend_with_binding_limit(const BackendOptions& options,
                                                                          uint64_t max_binding_bytes);

}  // namespace kev
