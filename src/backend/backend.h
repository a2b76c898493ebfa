// The backend interface: device memory, transfers, and the op set the model is written in.
//
// The model (src/model/forward.cpp) calls only these ops, so a backend differs from another only in
// kernels and memory. Every op has a matching OpKind; `supports(OpDesc)` states each kernel's
// preconditions (dtypes, strides, sizes) and the engine refuses to run — with a message naming the op —
// anything a backend does not support. There is no silent fallback.
//
// Conventions (docs/architecture.md): activations are F32 [n_tokens, features] unless a backend's
// supports() says otherwise; weights are [out, in] (x · Wᵀ); the innermost dim is contiguous.
// Ops may run asynchronously; `synchronize()` waits; `download` returns data valid after it returns.
//
// Packed rows (SeqLayout): a pass holds R sequences back to back in the token dimension. Sequence r
// spans tokens [offsets[r], offsets[r+1]) and its first token has position `pos0`. With
// `from_prefix`, every sequence continues from the same read-only prefix (conv state, recurrent
// state, K/V); without it, the pass is a fresh state pass (zero conv and recurrent state, no K/V).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "kev/kev.h"
#include "kev/result.h"

namespace kev {

enum class OpKind {
  Embedding,         // out[t,:] = table[ids[t],:]
  RmsNorm,           // out = x / sqrt(mean(x^2) + eps) * (1 + w), per innermost row
  AddRmsNorm,        // x += y (in place), then out = rms_norm(x) as RmsNorm: the residual add and next norm
  Matmul,            // out = x · Wᵀ (+ bias)
  CausalConv1dSilu,  // depthwise causal conv (kernel K) over each sequence, conv state in/out, then SiLU
  GdnGates,          // beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
  L2Norm,            // out = x / sqrt(sum(x^2) + eps) * scale, per innermost row
  GatedDeltaRule,    // chunked gated delta rule with read-only initial state and optional final state
  RmsNormGated,      // out = w * o / sqrt(mean(o^2) + eps) * SiLU(z)
  Rope,              // rotate-half RoPE on the first n_rot dims of each head, positions from SeqLayout
  Attention,         // causal GQA over prefix K/V + the sequence's own K/V, softmax(q·kᵀ·scale)·v
  SigmoidMul,        // out = x * sigmoid(gate)
  Swiglu,            // out = SiLU(gate) * up
  Add,               // out = a + b
  GatherRows,        // out[i,:] = x[idx[i],:]
  PointerLogits,     // out[j] = (kappa[j] · u[question[j]]) * scale
  Copy,              // out = x (dtype conversion allowed where supported)
  kCount
};
const char* op_name(OpKind op);

// What supports() is asked: the op and its operands (shapes, dtypes, strides).
struct OpDesc {
  OpKind op;
  std::vector<Tensor> operands;  // in the op's argument order, outputs last
};

struct SeqLayout {
  std::vector<int32_t> offsets{0};  // R+1 sequence starts in the packed token dimension
  int64_t pos0 = 0;                 // position of each sequence's first token
  bool from_prefix = false;         // continue from the prefix state instead of a zero state
  int64_t n_seqs() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t n_tokens() const { return offsets.back(); }
  int64_t longest() const {  // tokens in the longest sequence
    int64_t m = 0;
    for (size_t r = 0; r + 1 < offsets.size(); ++r) m = std::max<int64_t>(m, offsets[r + 1] - offsets[r]);
    return m;
  }
};

enum class BufferUsage { Weights, Activations, PrefixState, Staging };

struct BackendInfo {
  std::string name;         // "cpu", "cuda", "webgpu"
  std::string device;       // e.g. "x86-64, 2 threads, OpenBLAS 0.3.21"
  DType activation_dtype = DType::F32;
  size_t max_buffer_bytes = SIZE_MAX;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendInfo info() const = 0;
  virtual bool supports(const OpDesc& desc) const = 0;

  // ---- memory -----------------------------------------------------------------------------------
  virtual Result<std::shared_ptr<Buffer>> alloc(size_t bytes, BufferUsage usage) = 0;
  virtual Status upload(const Tensor& dst, const void* src, size_t bytes) = 0;  // dst contiguous
  virtual Status download(const Tensor& src, void* dst, size_t bytes) = 0;      // src contiguous
  virtual Status fill_zero(const Tensor& dst) = 0;                              // dst contiguous
  virtual Status synchronize() = 0;
  // Device memory counters of a GPU backend (CUDA's pool, WebGPU's buffers); nullopt for the CPU.
  virtual std::optional<DeviceMemory> memory() const { return std::nullopt; }
  // A hint, not an op: the op called next is the last to read x's values (the forward calls it before
  // a matmul whose input nothing else reads). A backend may then leave x's values unwritten where it
  // hands that op x another way (CUDA: the FP16 copy that x's producer writes for an F16-weight
  // matmul). Any other call in between cancels it; backends that run ops as they come ignore it.
  virtual void next_op_is_last_reader(const Tensor& x) { (void)x; }

  // ---- ops (shapes outermost first; n = tokens in the pass) ---------------------------------------
  // table [V,d] F32|BF16, ids [n] I32 -> out [n,d].
  virtual Status embedding(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // x [...,d], w [d] -> out like x. Gain is (1 + w) (zero-centred RMSNorm).
  virtual Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;
  // x [...,d] updated in place to x + y, y like x, w [d] -> out like x = rms_norm(x + y, w, eps): the
  // same arithmetic as add(x, y, x) then rms_norm(x, w, eps, out). out and y must not overlap x or each
  // other.
  virtual Status add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) = 0;
  // x [n,k], w [m,k], bias [m] or empty -> out [n,m].
  virtual Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) = 0;
  // x [n,C] pre-conv stream, w [C,K]; state_in [C,K] (last K inputs before the pass; only the last
  // K-1 are read) used when layout.from_prefix, else zeros. out [n,C] = SiLU(conv). state_out [C,K]
  // (optional; single-sequence passes only) receives the last K inputs of the sequence, zero-left-padded.
  virtual Status causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in,
                                    const SeqLayout& layout, const Tensor& out, const Tensor& state_out) = 0;
  // b, a [n,Hv]; a_log, dt_bias [Hv] -> beta, g [n,Hv] (F32).
  virtual Status gdn_gates(const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                           const Tensor& beta, const Tensor& g) = 0;
  // x [...,d] -> out = x / sqrt(sum(x^2) + eps) * scale.
  virtual Status l2_norm(const Tensor& x, float eps, float scale, const Tensor& out) = 0;
  // q, k [n,Hk,dk] (already normalised/scaled), v [n,Hv,dv], g, beta [n,Hv]; value head h uses key head
  // h / (Hv/Hk). state_in [Hv,dk,dv] F32 (read-only; used when layout.from_prefix, else zero).
  // out [n,Hv,dv]; state_out [Hv,dk,dv] (optional; single-sequence passes only).
  virtual Status gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const Tensor& state_in, const SeqLayout& layout,
                                  const Tensor& out, const Tensor& state_out) = 0;
  // o, z [n,Hv,dv], w [dv] (plain gain) -> out [n,Hv,dv].
  virtual Status rms_norm_gated(const Tensor& o, const Tensor& z, const Tensor& w, float eps,
                                const Tensor& out) = 0;
  // x [n,H,hd] rotated in place on dims [0,n_rot): pair (i, i+n_rot/2), angle pos * theta^(-2i/n_rot).
  virtual Status rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) = 0;
  // q [n,H,hd], k, v [n,Hkv,hd] (this pass's rows); prefix_k, prefix_v [Ls,Hkv,hd] or empty (used when
  // layout.from_prefix). Token t of a sequence attends to all Ls prefix keys and its sequence's keys
  // up to t. out [n,H,hd].
  virtual Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                           const Tensor& prefix_v, const SeqLayout& layout, float scale,
                           const Tensor& out) = 0;
  virtual Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) = 0;
  virtual Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  virtual Status add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // x [n,d], idx [m] I32 -> out [m,d].
  virtual Status gather_rows(const Tensor& x, const Tensor& idx, const Tensor& out) = 0;
  // u [Q,P], kappa [M,P], question [M] I32 -> out [M] F32 = (kappa[j] · u[question[j]]) * scale.
  virtual Status pointer_logits(const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                                const Tensor& out) = 0;
  // Same shape; dtype conversion F32<->BF16 where supported.
  virtual Status copy(const Tensor& x, const Tensor& out) = 0;
};

// CUDA, projection weights exported as BF16: the GEMM operands (docs/numerics.md has each one's error).
enum class CudaGemm : uint8_t {
  F16,     // weights converted to FP16 at load (exact for BF16 values in FP16's range), x rounded to FP16
           // after a per-row power-of-two scale; BF16 weights (if given) as BF16x2
  BF16x2,  // BF16 weights; x as two BF16 halves (hi + lo) stacked in one GEMM of 2n rows (2x the FLOPs)
  BF16,    // BF16 weights; x rounded to BF16
};

struct BackendOptions {
  int threads = 0;              // CPU: worker threads (0 = hardware concurrency)
  bool reference_mode = false;  // CPU: plain loops, no BLAS, token-by-token GDN (the op-test yardstick)
  // CPU FAST: matmul through the row-invariant GEMM (a row's bits do not depend on the other rows of
  // the pass or on the thread count) instead of OpenBLAS sgemm (whose bits do).
  bool row_invariant_matmul = true;
  int device = 0;               // CUDA: device ordinal
  bool cuda_graphs = true;      // CUDA: replay recurring passes as CUDA graphs
  CudaGemm cuda_gemm = CudaGemm::F16;  // CUDA: GEMM operands for 16-bit projection weights
  // CUDA: attention's two products on FP16 tensor cores (operands under power-of-two scales, FP32
  // softmax and accumulation) instead of 3xTF32. The engine sets it for bf16 exports in the f16 and
  // bf16 GEMM modes, whose projections already round their inputs to 16 bits (docs/numerics.md).
  bool cuda_attention_f16 = false;
  std::string adapter;          // WebGPU: adapter name substring or type ("discrete", "cpu", ...); empty = default
  // Only supports() is needed (kev_export's op audit): succeed without a device, answering for the
  // backend's kernels under conservative default limits; memory and ops then return Unsupported.
  bool audit_only = false;
};

// Creates a backend by name ("cpu", ...). Unknown or unavailable backends are Unsupported errors that
// list the backends this build has.
Result<std::shared_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options);
std::vector<std::string> available_backends();

}  // namespace kev
