// The CPU kernels, one family per source file, each with two implementations chosen by Exec:
// FAST (FP32, multithreaded over the pool, GEMMs through OpenBLAS) and REFERENCE (plain serial
// loops accumulating in double, no BLAS, no fusion; the op-test yardstick).
//
// Every op function validates its operands with the matching check_* function in Bound mode before
// touching memory, and CpuBackend::supports() calls the same check_* in Shapes mode, so supports()
// states exactly the preconditions the kernels enforce. Argument order and meaning are those of the
// Backend methods in backend/backend.h.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/operands.h"
#include "backend/cpu/thread_pool.h"

namespace kev::cpu {

struct Exec {
  ThreadPool& pool;
  bool reference;
  bool row_invariant_matmul = true;  // BackendOptions::row_invariant_matmul
};

// Items per parallel block so that one block holds roughly 32k elementary operations: enough to
// amortise a block hand-out, small enough to balance two to a few dozen threads.
inline int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kBlockWork = 1 << 15;
  return work_per_item >= kBlockWork ? 1 : kBlockWork / (work_per_item > 0 ? work_per_item : 1);
}

// gather.cpp
Status check_embedding(const OpCheck& c, const Tensor& table, const Tensor& ids, const Tensor& out);
Status embedding(const Exec& e, const Tensor& table, const Tensor& ids, const Tensor& out);
Status check_gather_rows(const OpCheck& c, const Tensor& x, const Tensor& idx, const Tensor& out);
Status gather_rows(const Exec& e, const Tensor& x, const Tensor& idx, const Tensor& out);

// norms.cpp
Status check_rms_norm(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& out);
Status rms_norm(const Exec& e, const Tensor& x, const Tensor& w, float eps, const Tensor& out);
Status check_add_rms_norm(const OpCheck& c, const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& out);
Status add_rms_norm(const Exec& e, const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out);
Status check_l2_norm(const OpCheck& c, const Tensor& x, const Tensor& out);
Status l2_norm(const Exec& e, const Tensor& x, float eps, float scale, const Tensor& out);
Status check_rms_norm_gated(const OpCheck& c, const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out);
Status rms_norm_gated(const Exec& e, const Tensor& o, const Tensor& z, const Tensor& w, float eps, const Tensor& out);

// matmul.cpp
Status check_matmul(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
Status matmul(const Exec& e, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);

// causal_conv1d.cpp
Status check_causal_conv1d_silu(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& state_in,
                                const Tensor& out, const Tensor& state_out);
Status causal_conv1d_silu(const Exec& e, const Tensor& x, const Tensor& w, const Tensor& state_in,
                          const SeqLayout& layout, const Tensor& out, const Tensor& state_out);

// gated_delta_net.cpp
Status check_gated_delta_rule(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, const Tensor& state_in, const Tensor& out, const Tensor& state_out);
Status gated_delta_rule(const Exec& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const Tensor& state_in, const SeqLayout& layout, const Tensor& out,
                        const Tensor& state_out);

// attention.cpp
Status check_attention(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                       const Tensor& prefix_v, const Tensor& out);
Status attention(const Exec& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                 const Tensor& prefix_v, const SeqLayout& layout, float scale, const Tensor& out);

// rope.cpp
Status check_rope(const OpCheck& c, const Tensor& x);
Status rope(const Exec& e, const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta);

// elementwise.cpp
Status check_gdn_gates(const OpCheck& c, const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                       const Tensor& beta, const Tensor& g);
Status gdn_gates(const Exec& e, const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                 const Tensor& beta, const Tensor& g);
Status check_binary(const OpCheck& c, const Tensor& x, const Tensor& y, const Tensor& out);  // same-shape F32
Status sigmoid_mul(const Exec& e, const Tensor& x, const Tensor& gate, const Tensor& out);
Status swiglu(const Exec& e, const Tensor& gate, const Tensor& up, const Tensor& out);
Status add(const Exec& e, const Tensor& a, const Tensor& b, const Tensor& out);
Status check_copy(const OpCheck& c, const Tensor& x, const Tensor& out);

// supports() through the checks above: the right operand count for desc.op, then its check. Every
// backend's supports() starts here (CUDA and WebGPU replace or add the rules their kernels differ in).
bool check_op_desc(const OpCheck& c, const OpDesc& desc);
Status copy(const Exec& e, const Tensor& x, const Tensor& out);

// pointer_head.cpp
Status check_pointer_logits(const OpCheck& c, const Tensor& u, const Tensor& kappa, const Tensor& question,
                            const Tensor& out);
Status pointer_logits(const Exec& e, const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                      const Tensor& out);

}  // namespace kev::cpu
