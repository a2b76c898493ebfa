// Causal GQA attention over a shared read-only prefix K/V plus each packed sequence's own keys (the
// Attention op). Math, layout and launch shape are documented in attention.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kev::cuda {

// All pointers are device pointers, FP32. Strides are in elements. Token t of sequence r (tokens
// [offsets[r], offsets[r+1])) attends to all prefix_len prefix keys and to its own sequence's keys
// up to and including t. Query head h uses KV head h / (H / Hkv).
struct AttentionArgs {
  const float* q = nullptr;  // [n, H, hd]
  int64_t q_token_stride = 0, q_head_stride = 0;
  const float* k = nullptr;  // [n, Hkv, hd]
  const float* v = nullptr;  // [n, Hkv, hd]
  int64_t kv_token_stride = 0, kv_head_stride = 0;
  const float* prefix_k = nullptr;  // [prefix_len, Hkv, hd] contiguous, or null (prefix_len == 0)
  const float* prefix_v = nullptr;
  int64_t prefix_len = 0;
  float* out = nullptr;  // [n, H, hd]
  int64_t out_token_stride = 0, out_head_stride = 0;
  const int32_t* offsets = nullptr;  // device [n_seqs + 1]
  int n_seqs = 0, n_tokens = 0, H = 0, Hkv = 0, hd = 0;
  float scale = 1.0f;
  int splits = 1;  // key splits per query tile: attention_split_count(), chosen when the op is recorded
  // The products on FP16 tensor cores (operands rounded to FP16 under power-of-two scales; softmax and
  // accumulation FP32) instead of 3xTF32; attention.cu gives the error of each.
  bool f16 = false;
};

// The key splits for these shapes on the current device (1..16, 1..8 where they merge in a thread
// block cluster; see attention.cu). Depends only on n_tokens, H, Hkv, hd, prefix_len, f16 and the device.
int attention_split_count(const AttentionArgs& a);

// Scratch bytes (may be 0) for a.splits and a.f16; depends only on shapes, n_tokens, prefix_len,
// a.splits, a.f16 and the device.
size_t attention_workspace_bytes(const AttentionArgs& a);

// Enqueues the kernel(s) on `stream`; launch configuration depends only on shapes, n_tokens, n_seqs and
// prefix_len, never on the offsets' values.
cudaError_t launch_attention(const AttentionArgs& a, void* workspace, cudaStream_t stream);

// The shapes the kernel handles; the backend's supports() asks this: hd ∈ {64, 128, 256}, Hkv >= 1
// divides H, H / Hkv <= 64, Hkv <= 65535. The launch additionally needs n_seqs >= 1 and both prefix
// pointers when prefix_len > 0 (cudaErrorInvalidValue otherwise); n_tokens == 0 launches nothing.
// The kernel applies `scale` itself (q unscaled). Any strides and alignment are accepted (float4
// accesses when aligned). The workspace (attention_workspace_bytes, 16-byte aligned) holds the key
// splits' partial rows (none where they merge in a cluster: FP16 products on sm_90) and, with f16,
// the FP16 copies of the keys and values; it is 0 bytes for the 3xTF32 products when the pass fills
// the GPU without splitting.
bool attention_supported(int H, int Hkv, int hd);

}  // namespace kev::cuda
