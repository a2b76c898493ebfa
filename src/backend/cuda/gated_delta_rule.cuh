// Chunked gated delta rule on the GPU (the GatedDeltaRule op). The kernel's math, layout, gate and
// q-scaling conventions and launch shape are documented in gated_delta_rule.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kev::cuda {

constexpr int kGdnChunkTokens = 64;  // the chunk length C

// Operands of one launch. All pointers are device pointers; rows of q/k/v/out are tokens of the
// packed pass (sequence r spans tokens [offsets[r], offsets[r+1])); within a token, heads are
// contiguous (head stride = dk for q/k, dv for v/out). Value head h reads key head h / (Hv / Hk).
struct GdnArgs {
  const float* q = nullptr;  // [n, Hk, dk], already L2-normalised and scaled by 1/sqrt(dk)
  const float* k = nullptr;  // [n, Hk, dk], already L2-normalised
  int64_t qk_token_stride = 0;
  const float* v = nullptr;  // [n, Hv, dv]
  int64_t v_token_stride = 0;
  const float* g = nullptr;     // [n, Hv] log decay (< 0), natural log
  const float* beta = nullptr;  // [n, Hv] in (0, 1)
  int64_t gate_token_stride = 0;
  const float* state_in = nullptr;  // [Hv, dk, dv] key-major, read-only, shared by every sequence; null = zero
  float* out = nullptr;             // [n, Hv, dv]
  int64_t out_token_stride = 0;
  float* state_out = nullptr;       // [Hv, dk, dv] or null; only when n_seqs == 1
  const int32_t* offsets = nullptr;  // device [n_seqs + 1]
  int n_seqs = 0, n_tokens = 0, Hk = 0, Hv = 0, dk = 0, dv = 0;
  // Every sequence has at most kGdnChunkTokens tokens (one chunk; Kev's question rows): selects the
  // token recurrence or the rows kernels instead of the chunked form.
  // Only speed depends on it, not the result, but a recorded pass must keep it in its signature (it
  // picks the kernels and the workspace size).
  bool short_seqs = false;
};

// Scratch the launch needs (bytes, 256-aligned by the caller); depends only on the shapes and
// n_tokens / n_seqs, never on the offsets' values (so a captured CUDA graph stays valid).
size_t gated_delta_rule_workspace_bytes(const GdnArgs& a);

// Enqueues the kernel(s) on `stream`. Launch configuration depends only on shapes, n_tokens and n_seqs.
// Returns cudaErrorInvalidValue for shapes the kernel does not handle (see gated_delta_rule_supported).
cudaError_t launch_gated_delta_rule(const GdnArgs& a, void* workspace, cudaStream_t stream);

// The shapes the kernel handles; the backend's supports() asks this: dk ∈ {32, 64, 128}, dv >= 1,
// Hk >= 1 divides Hv, Hv <= 65535. The launch additionally needs 1 <= n_seqs <= 65535 and state_out
// only with n_seqs == 1 (cudaErrorInvalidValue otherwise). Any strides and alignment are accepted
// (float4 accesses when aligned). The workspace (gated_delta_rule_workspace_bytes, 16-byte aligned) holds
// the chunk products (question rows: Q̃, see gated_delta_rule_rows.cu).
bool gated_delta_rule_supported(int Hk, int Hv, int dk, int dv);

}  // namespace kev::cuda
