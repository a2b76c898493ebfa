// The Kev forward pass (Qwen3.5 hybrid backbone + pointer head), written once against the Backend op
// set. Backends differ only in kernels and memory, never here.
//
//   prefill(tokens)      the state pass: batch 1, positions 0..Ls-1, from zero state; returns the
//                        immutable PrefixState (per GDN layer conv + recurrent state, per attention
//                        layer K/V). Hidden states are discarded.
//   score(prefix, pass)  R question rows packed back to back (no padding), each continuing from the
//                        same prefix with positions Ls..; returns one logit per option. A pass
//                        without layout.from_prefix ignores `prefix` and runs its sequences from
//                        zero state (a full recompute of state + row, used to check the prefix path).
//   prefill_and_score(tokens, pass)
//                        both in one forward pass: the state's tokens first, then the rows, which
//                        read the snapshot the same pass has just written, layer by layer. Token-wise
//                        ops (projections, norms, MLP) run once over both, so the weights stream once;
//                        sequence ops (conv, delta rule, RoPE, attention) run once per segment. Same
//                        arithmetic per row as prefill then score: bit-identical where the matmul is
//                        row-invariant (CPU, WebGPU), within the GEMM's rounding on CUDA.
//
// Math: KEV_SPEC.md §5-§7; shapes are listed outermost first (docs/architecture.md).
// Not thread-safe: one pass at a time per ModelRunner (the Engine serialises calls).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace kev {

// The state snapshot, resident on the backend. Never written after prefill returns.
struct PrefixState {
  int64_t n_tokens = 0;            // Ls
  std::vector<Tensor> conv;        // per GDN layer [C, K]: pre-conv inputs Ls-K..Ls-1 (zero-left-padded)
  std::vector<Tensor> recurrent;   // per GDN layer [H_v, d_k, d_v] F32, key-major (o = Sᵀq)
  std::vector<Tensor> k, v;        // per attention layer [Ls, H_kv, head_dim], K after norm + RoPE
  std::shared_ptr<Buffer> buffer;  // holds all of the above
  size_t bytes = 0;
};

// One score pass: rows packed back to back; readouts are indices into the packed token dimension.
struct ScorePass {
  std::vector<int32_t> tokens;           // n packed row tokens
  SeqLayout layout;                      // offsets per row; pos0 = Ls; from_prefix = true
  std::vector<int32_t> option_rows;      // M: packed index of each option's close token
  std::vector<int32_t> option_question;  // M: row (question) of each option within the pass
  std::vector<int32_t> decide_rows;      // R: packed index of each row's decide token
};

// A scratch allocator over backend buffers for one pass's activations. Chunks grow on demand; after
// a pass that needed several chunks the next pass gets one chunk of the combined size.
class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape);
  size_t mark() const { return used_total_; }
  void rewind(size_t mark);  // frees allocations made after `mark` (within the current chunk)
  Status reset();            // end of a pass
  size_t capacity() const;

 private:
  struct Chunk {
    std::shared_ptr<Buffer> buffer;
    size_t used = 0;
  };
  Backend& backend_;
  std::vector<Chunk> chunks_;
  size_t used_total_ = 0;
  size_t peak_ = 0;
};

struct OpStats {
  std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> calls{};
  std::array<double, static_cast<size_t>(OpKind::kCount)> seconds{};  // when profiling
  std::array<double, static_cast<size_t>(OpKind::kCount)> flops{};    // when profiling
};

// The snapshot and the logits of a state pass fused with the first score pass.
struct PrefillScore {
  PrefixState prefix;
  std::vector<float> logits;
};

class ModelRunner {
 public:
  // `logit_scale` = 1 / sqrt(P) / T.
  ModelRunner(std::shared_ptr<Backend> backend, ModelConfig config, ModelWeights weights, double logit_scale);

  Result<PrefixState> prefill(std::span<const int32_t> tokens);
  Result<std::vector<float>> score(const PrefixState& prefix, const ScorePass& pass);
  // `pass` must continue from the state: layout.pos0 == tokens.size() and layout.from_prefix.
  Result<PrefillScore> prefill_and_score(std::span<const int32_t> tokens, const ScorePass& pass);

  Backend& backend() { return *backend_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const OpStats& op_stats() const { return stats_; }
  // Times every op (synchronising after each) and counts matmul/attention FLOPs.
  void set_profiling(bool on) { profiling_ = on; }
  void reset_op_stats() { stats_ = {}; }

 private:
  // Checks supports() for the op (an Unsupported error names the op and operands), counts it, runs it.
  template <class F>
  Status run(OpKind op, std::initializer_list<Tensor> operands, F&& call, double flops = 0);
  Status matmul_last_read(const Tensor& x, const Tensor& w, const Tensor& out);

  // Consecutive packed sequences of a pass that continue the same state: the state segment (one
  // sequence from zero state, writing the snapshot) or the question rows.
  struct Segment {
    int64_t begin = 0, n = 0;           // its token rows within the pass
    SeqLayout layout;                   // offsets from `begin`
    const PrefixState* from = nullptr;  // the snapshot its sequences continue; null: zero state
    PrefixState* to = nullptr;          // the snapshot it writes (the state segment)
    Tensor rows(const Tensor& t) const { return t.slice(0, begin, n); }
    // In the last layer only question rows need the mixer's output (the state keeps its snapshot).
    bool needs_output(bool last_layer) const { return !(last_layer && to != nullptr); }
  };

  // The pass of prefill / score / prefill_and_score: `state` (may be empty) as the first segment,
  // writing `snapshot`; then `pass`'s rows (may be null) over `prefix`. Returns the rows' logits.
  Result<std::vector<float>> forward(std::span<const int32_t> state, PrefixState* snapshot,
                                     const PrefixState* prefix, const ScorePass* pass);
  Result<Tensor> embed(std::span<const int32_t> tokens);
  Status mixer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs, bool last_layer,
               const Tensor& mix);
  Status attention_layer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs,
                         bool last_layer, const Tensor& mix);
  Status gdn_layer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs, const Tensor& mix);
  // x += MLP(a) in place for a = N_post(x); then a = N(x) with `next_norm`'s gain (add_rms_norm).
  Status mlp(const LayerWeights& L, const Tensor& x, const Tensor& a, const Tensor& next_norm);
  Result<PrefixState> alloc_prefix(int64_t n_tokens);

  std::shared_ptr<Backend> backend_;
  ModelConfig config_;
  ModelWeights weights_;
  double logit_scale_;
  Arena arena_;
  OpStats stats_;
  bool profiling_ = false;
  std::vector<size_t> gdn_index_, attn_index_;  // layer -> index among its kind
};

}  // namespace kev
