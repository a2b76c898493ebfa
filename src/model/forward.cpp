// The Kev forward pass over the Backend op set. Formulas quoted from KEV_SPEC.md §5-§7.
#include "model/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/check.h"

namespace kev {

namespace {

constexpr size_t kArenaAlign = 256;
constexpr size_t kMinChunkBytes = size_t{16} << 20;

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// q·kᵀ and p·v: 4·H·hd FLOPs per (query, visible key) pair; a row token sees the prefix and its
// sequence's earlier tokens.
double attention_flops(const SeqLayout& layout, int64_t n_prefix, int64_t H, int64_t hd) {
  double pairs = 0;
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    const double L = layout.offsets[r + 1] - layout.offsets[r];
    pairs += L * static_cast<double>(n_prefix) + L * (L + 1) / 2;
  }
  return 4.0 * static_cast<double>(H * hd) * pairs;
}

}  // namespace

// ---- Arena --------------------------------------------------------------------------------------

Result<Tensor> Arena::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  size_t numel = 1;
  for (int64_t s : shape) numel *= static_cast<size_t>(s);
  const size_t bytes = align_up(std::max<size_t>(numel * dtype_size(dtype), 1), kArenaAlign);
  size_t base = 0;
  for (Chunk& c : chunks_) {
    const size_t size = c.buffer->size();
    if (used_total_ < base + size) {
      const size_t local = used_total_ - base;
      if (local + bytes <= size) {
        used_total_ += bytes;
        peak_ = std::max(peak_, used_total_);
        return Tensor::contiguous(c.buffer.get(), local, dtype, shape);
      }
      used_total_ = base + size;  // skip the chunk's tail
    }
    base += size;
  }
  const size_t size = std::max(bytes, std::max(kMinChunkBytes, capacity()));
  KEV_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, backend_.alloc(size, BufferUsage::Activations));
  chunks_.push_back({std::move(buffer), 0});
  used_total_ = base + bytes;
  peak_ = std::max(peak_, used_total_);
  return Tensor::contiguous(chunks_.back().buffer.get(), 0, dtype, shape);
}

void Arena::rewind(size_t mark) { used_total_ = std::min(used_total_, mark); }

Status Arena::reset() {
  used_total_ = 0;
  if (chunks_.size() > 1) {
    const size_t size = align_up(peak_, kArenaAlign);
    chunks_.clear();
    KEV_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, backend_.alloc(size, BufferUsage::Activations));
    chunks_.push_back({std::move(buffer), 0});
  }
  peak_ = 0;
  return Status::success();
}

size_t Arena::capacity() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.buffer->size();
  return total;
}

// ---- ModelRunner --------------------------------------------------------------------------------

ModelRunner::ModelRunner(std::shared_ptr<Backend> backend, ModelConfig config, ModelWeights weights,
                         double logit_scale)
    : backend_(std::move(backend)),
      config_(std::move(config)),
      weights_(std::move(weights)),
      logit_scale_(logit_scale),
      arena_(*backend_) {
  size_t n_gdn = 0, n_attn = 0;
  for (LayerType t : config_.layer_types) {
    gdn_index_.push_back(t == LayerType::GatedDeltaNet ? n_gdn++ : SIZE_MAX);
    attn_index_.push_back(t == LayerType::FullAttention ? n_attn++ : SIZE_MAX);
  }
}

template <class F>
Status ModelRunner::run(OpKind op, std::initializer_list<Tensor> operands, F&& call, double flops) {
  OpDesc desc{op, std::vector<Tensor>(operands)};
  if (!backend_->supports(desc)) {
    std::string shapes;
    for (const Tensor& t : desc.operands) shapes += (shapes.empty() ? "" : ", ") + t.describe();
    return Status(ErrorCode::Unsupported, cat("backend '", backend_->info().name, "' does not support ",
                                              op_name(op), "(", shapes, ")"));
  }
  const size_t i = static_cast<size_t>(op);
  ++stats_.calls[i];
  if (!profiling_) return call();
  const auto t0 = std::chrono::steady_clock::now();
  KEV_TRY(call());
  KEV_TRY(backend_->synchronize());
  stats_.seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (op == OpKind::Matmul) {
    const Tensor& x = *operands.begin();
    const Tensor& w = *(operands.begin() + 1);
    flops = 2.0 * static_cast<double>(x.dim(0)) * static_cast<double>(w.dim(0)) * static_cast<double>(w.dim(1));
  }
  stats_.flops[i] += flops;
  return Status::success();
}

// out = x · wᵀ where this matmul is x's last reader (every projection's input but the head's: a norm,
// swiglu or gated output that nothing else reads); the backend is told so first.
Status ModelRunner::matmul_last_read(const Tensor& x, const Tensor& w, const Tensor& out) {
  backend_->next_op_is_last_reader(x);
  const Tensor none;
  return run(OpKind::Matmul, {x, w, none, out}, [&] { return backend_->matmul(x, w, none, out); });
}

Result<Tensor> ModelRunner::embed(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int32_t id : tokens) {
    KEV_CHECK(id >= 0 && id < config_.n_vocab, ErrorCode::InvalidRequest, "token id ", id,
              " is outside the model's vocabulary of ", config_.n_vocab, " rows");
  }
  KEV_ASSIGN_OR_RETURN(Tensor ids, arena_.alloc(DType::I32, {n}));
  KEV_TRY(backend_->upload(ids, tokens.data(), tokens.size() * sizeof(int32_t)));
  KEV_ASSIGN_OR_RETURN(Tensor x, arena_.alloc(DType::F32, {n, config_.n_embd}));
  KEV_TRY(run(OpKind::Embedding, {weights_.embed, ids, x}, [&] { return backend_->embedding(weights_.embed, ids, x); }));
  return x;
}

Result<PrefixState> ModelRunner::alloc_prefix(int64_t n_tokens) {
  const ModelConfig& c = config_;
  const int64_t C = c.gdn_conv_channels(), K = c.gdn_conv_kernel;
  const size_t conv_bytes = align_up(static_cast<size_t>(C * K) * 4, kArenaAlign);
  const size_t rec_bytes =
      align_up(static_cast<size_t>(c.gdn_n_v_heads * c.gdn_k_dim * c.gdn_v_dim) * 4, kArenaAlign);
  const size_t kv_bytes = align_up(static_cast<size_t>(n_tokens * c.n_head_kv * c.head_dim) * 4, kArenaAlign);
  const size_t n_gdn = static_cast<size_t>(c.n_gdn_layers()), n_attn = static_cast<size_t>(c.n_attn_layers());
  PrefixState p;
  p.n_tokens = n_tokens;
  p.bytes = n_gdn * (conv_bytes + rec_bytes) + n_attn * 2 * kv_bytes;
  KEV_ASSIGN_OR_RETURN(p.buffer, backend_->alloc(p.bytes, BufferUsage::PrefixState));
  // Zeroed so the padding between tensors is defined: the snapshot hashes bit-identically.
  KEV_TRY(backend_->fill_zero(Tensor::contiguous(p.buffer.get(), 0, DType::F32, {static_cast<int64_t>(p.bytes / 4)})));
  size_t off = 0;
  for (size_t i = 0; i < n_gdn; ++i) {
    p.conv.push_back(Tensor::contiguous(p.buffer.get(), off, DType::F32, {C, K}));
    off += conv_bytes;
    p.recurrent.push_back(
        Tensor::contiguous(p.buffer.get(), off, DType::F32, {c.gdn_n_v_heads, c.gdn_k_dim, c.gdn_v_dim}));
    off += rec_bytes;
  }
  for (size_t i = 0; i < n_attn; ++i) {
    p.k.push_back(Tensor::contiguous(p.buffer.get(), off, DType::F32, {n_tokens, c.n_head_kv, c.head_dim}));
    off += kv_bytes;
    p.v.push_back(Tensor::contiguous(p.buffer.get(), off, DType::F32, {n_tokens, c.n_head_kv, c.head_dim}));
    off += kv_bytes;
  }
  return p;
}

// Gated attention (KEV_SPEC §5.3). mix = o_proj(attn(N_q(q), N_k(k), v) ⊙ σ(gate)). A segment that
// writes a snapshot stores its K after norm + RoPE and its V there.
Status ModelRunner::attention_layer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs,
                                    bool last_layer, const Tensor& mix) {
  const ModelConfig& c = config_;
  const AttentionWeights& W = L.attn;
  const int64_t n = a.dim(0), H = c.n_head, Hkv = c.n_head_kv, hd = c.head_dim;
  const Tensor none;
  const size_t ia = attn_index_[il];
  const float eps = static_cast<float>(c.rms_eps);
  // The rows whose output is needed: from the first segment that needs it to the end of the pass.
  int64_t out_begin = n;
  for (const Segment& s : segs) {
    if (s.needs_output(last_layer)) out_begin = std::min(out_begin, s.begin);
  }
  const bool need_output = out_begin < n;

  // One GEMM for K, V and (when the output is needed) the query and gate: kvq_proj's rows are [k | v | q].
  const int64_t kv = Hkv * hd, qw = need_output ? H * 2 * hd : 0;
  const Tensor w = need_output ? W.kvq_proj : W.kvq_proj.slice(0, 0, 2 * kv);
  KEV_ASSIGN_OR_RETURN(Tensor proj, arena_.alloc(DType::F32, {n, 2 * kv + qw}));
  KEV_TRY(matmul_last_read(a, w, proj));
  // k ← N_knorm(k) per head, then RoPE on dims [0, n_rot), in place: k and v stay views of proj with the
  // same strides, which attention kernels take as one layout.
  const Tensor k = proj.slice(1, 0, kv).split_last(Hkv);
  const Tensor v = proj.slice(1, kv, kv).split_last(Hkv);
  for (const Segment& s : segs) {
    const Tensor ks = s.rows(k), vs = s.rows(v);
    KEV_TRY(run(OpKind::RmsNorm, {ks, W.k_norm, ks}, [&] { return backend_->rms_norm(ks, W.k_norm, eps, ks); }));
    KEV_TRY(run(OpKind::Rope, {ks}, [&] { return backend_->rope(ks, s.layout, c.n_rot, c.rope_theta); }));
    if (s.to) {
      KEV_TRY(run(OpKind::Copy, {ks, s.to->k[ia]}, [&] { return backend_->copy(ks, s.to->k[ia]); }));
      KEV_TRY(run(OpKind::Copy, {vs, s.to->v[ia]}, [&] { return backend_->copy(vs, s.to->v[ia]); }));
    }
  }
  if (!need_output) return Status::success();

  // q → [n, H, 2·hd]: per head the first hd values are the query, the last hd the output gate.
  const Tensor qg_heads = proj.slice(1, 2 * kv, qw).split_last(H);
  const Tensor q_raw = qg_heads.slice(2, 0, hd);  // [n, H, hd] strided
  const Tensor gate = qg_heads.slice(2, hd, hd);  // [n, H, hd] strided
  KEV_ASSIGN_OR_RETURN(Tensor q, arena_.alloc(DType::F32, {n, H, hd}));
  KEV_ASSIGN_OR_RETURN(Tensor att, arena_.alloc(DType::F32, {n, H, hd}));
  // Causal GQA with scale 1/sqrt(hd), over the prefix K/V (rows) and the sequence's own keys.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (const Segment& s : segs) {
    if (!s.needs_output(last_layer)) continue;
    const Tensor qr = s.rows(q_raw), qs = s.rows(q), ks = s.rows(k), vs = s.rows(v), as = s.rows(att);
    KEV_TRY(run(OpKind::RmsNorm, {qr, W.q_norm, qs}, [&] { return backend_->rms_norm(qr, W.q_norm, eps, qs); }));
    KEV_TRY(run(OpKind::Rope, {qs}, [&] { return backend_->rope(qs, s.layout, c.n_rot, c.rope_theta); }));
    const Tensor pk = s.from ? s.from->k[ia] : none;
    const Tensor pv = s.from ? s.from->v[ia] : none;
    KEV_TRY(run(OpKind::Attention, {qs, ks, vs, pk, pv, as},
                [&] { return backend_->attention(qs, ks, vs, pk, pv, s.layout, scale, as); },
                attention_flops(s.layout, s.from ? s.from->n_tokens : 0, H, hd)));
  }
  const int64_t m = n - out_begin;
  const Tensor att_out = att.slice(0, out_begin, m), gate_out = gate.slice(0, out_begin, m);
  KEV_TRY(run(OpKind::SigmoidMul, {att_out, gate_out, att_out},
              [&] { return backend_->sigmoid_mul(att_out, gate_out, att_out); }));
  const Tensor att_flat = att_out.reshaped({m, H * hd}), mix_out = mix.slice(0, out_begin, m);
  KEV_TRY(matmul_last_read(att_flat, W.o_proj, mix_out));
  return Status::success();
}

// Gated DeltaNet (KEV_SPEC §5.4). Projections, causal conv (K=4) + SiLU, split q̂ k̂ v, l2 norms (q scaled
// by 1/sqrt(d_k)), gates, the chunked delta rule from a snapshot's state (rows) or zero (the state),
// gated RMSNorm with SiLU(z), out projection.
Status ModelRunner::gdn_layer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs,
                              const Tensor& mix) {
  const ModelConfig& c = config_;
  const GdnWeights& W = L.gdn;
  const int64_t n = a.dim(0), C = c.gdn_conv_channels();
  const int64_t Hk = c.gdn_n_k_heads, Hv = c.gdn_n_v_heads, dk = c.gdn_k_dim, dv = c.gdn_v_dim;
  const Tensor none;
  const size_t ig = gdn_index_[il];
  const float eps = static_cast<float>(c.rms_eps);

  // The four input projections as one GEMM; qkv, z, b and α are column views of its output.
  const int64_t Z = Hv * dv;
  KEV_ASSIGN_OR_RETURN(Tensor proj, arena_.alloc(DType::F32, {n, C + Z + 2 * Hv}));
  KEV_TRY(matmul_last_read(a, W.in_proj, proj));
  const Tensor qkv = proj.slice(1, 0, C);
  const Tensor z_heads = proj.slice(1, C, Z).split_last(Hv);
  const Tensor b = proj.slice(1, C + Z, Hv);
  const Tensor alpha = proj.slice(1, C + Z + Hv, Hv);

  // c'_t = SiLU(Σ_j W[·,j] c_{t-3+j}); earlier inputs from the snapshot's conv state (rows) or zeros.
  KEV_ASSIGN_OR_RETURN(Tensor conv, arena_.alloc(DType::F32, {n, C}));
  for (const Segment& s : segs) {
    const Tensor conv_in = s.from ? s.from->conv[ig] : none;
    const Tensor conv_out = s.to ? s.to->conv[ig] : none;
    const Tensor xs = s.rows(qkv), ys = s.rows(conv);
    KEV_TRY(run(OpKind::CausalConv1dSilu, {xs, W.conv1d, conv_in, ys, conv_out},
                [&] { return backend_->causal_conv1d_silu(xs, W.conv1d, conv_in, s.layout, ys, conv_out); }));
  }

  // Split c' as q̂ [n,H_k,d_k], k̂ [n,H_k,d_k], v [n,H_v,d_v] (strided views); q = l2n(q̂)/√d_k, k = l2n(k̂).
  const Tensor q_hat = conv.slice(1, 0, Hk * dk).split_last(Hk);
  const Tensor k_hat = conv.slice(1, Hk * dk, Hk * dk).split_last(Hk);
  const Tensor v = conv.slice(1, 2 * Hk * dk, Hv * dv).split_last(Hv);
  KEV_ASSIGN_OR_RETURN(Tensor q, arena_.alloc(DType::F32, {n, Hk, dk}));
  KEV_ASSIGN_OR_RETURN(Tensor k, arena_.alloc(DType::F32, {n, Hk, dk}));
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  KEV_TRY(run(OpKind::L2Norm, {q_hat, q}, [&] { return backend_->l2_norm(q_hat, 1e-6f, q_scale, q); }));
  KEV_TRY(run(OpKind::L2Norm, {k_hat, k}, [&] { return backend_->l2_norm(k_hat, 1e-6f, 1.0f, k); }));

  // β = σ(b), g = −exp(A_log)·softplus(α̃ + dt_bias).
  KEV_ASSIGN_OR_RETURN(Tensor beta, arena_.alloc(DType::F32, {n, Hv}));
  KEV_ASSIGN_OR_RETURN(Tensor g, arena_.alloc(DType::F32, {n, Hv}));
  KEV_TRY(run(OpKind::GdnGates, {b, alpha, W.a_log, W.dt_bias, beta, g},
              [&] { return backend_->gdn_gates(b, alpha, W.a_log, W.dt_bias, beta, g); }));

  KEV_ASSIGN_OR_RETURN(Tensor o, arena_.alloc(DType::F32, {n, Hv, dv}));
  for (const Segment& s : segs) {
    const Tensor s_in = s.from ? s.from->recurrent[ig] : none;
    const Tensor s_out = s.to ? s.to->recurrent[ig] : none;
    const Tensor qs = s.rows(q), ks = s.rows(k), vs = s.rows(v), gs = s.rows(g), bs = s.rows(beta), os = s.rows(o);
    KEV_TRY(run(OpKind::GatedDeltaRule, {qs, ks, vs, gs, bs, s_in, os, s_out},
                [&] { return backend_->gated_delta_rule(qs, ks, vs, gs, bs, s_in, s.layout, os, s_out); }));
  }

  // y = out_proj(concat_h G(o_h, z_h)), G(o, z) = w ⊙ o/√(mean(o²)+ε) ⊙ SiLU(z).
  KEV_TRY(run(OpKind::RmsNormGated, {o, z_heads, W.norm, o},
              [&] { return backend_->rms_norm_gated(o, z_heads, W.norm, eps, o); }));
  const Tensor o_flat = o.reshaped({n, Hv * dv});
  KEV_TRY(matmul_last_read(o_flat, W.out_proj, mix));
  return Status::success();
}

Status ModelRunner::mixer(size_t il, const LayerWeights& L, const Tensor& a, std::span<const Segment> segs,
                          bool last_layer, const Tensor& mix) {
  if (L.type == LayerType::FullAttention) return attention_layer(il, L, a, segs, last_layer, mix);
  return gdn_layer(il, L, a, segs, mix);
}

// x += down_proj(SiLU(gate_proj(a)) ⊙ up_proj(a)) for the caller's a = N_post(x); then a = N_next(x)
// (the next layer's input norm, or the final norm), fused with the residual add.
Status ModelRunner::mlp(const LayerWeights& L, const Tensor& x, const Tensor& a, const Tensor& next_norm) {
  const int64_t n = x.dim(0), d = config_.n_embd, F = config_.n_ff;
  const size_t mark = arena_.mark();
  const float eps = static_cast<float>(config_.rms_eps);
  // gate and up as one GEMM; the two halves of its output are column views.
  KEV_ASSIGN_OR_RETURN(Tensor gate_up, arena_.alloc(DType::F32, {n, 2 * F}));
  KEV_TRY(matmul_last_read(a, L.gate_up_proj, gate_up));
  // (The two views' byte ranges interleave, so the product goes to its own buffer, not in place.)
  const Tensor gate = gate_up.slice(1, 0, F), up = gate_up.slice(1, F, F);
  KEV_ASSIGN_OR_RETURN(Tensor act, arena_.alloc(DType::F32, {n, F}));
  KEV_TRY(run(OpKind::Swiglu, {gate, up, act}, [&] { return backend_->swiglu(gate, up, act); }));
  KEV_ASSIGN_OR_RETURN(Tensor down, arena_.alloc(DType::F32, {n, d}));
  KEV_TRY(matmul_last_read(act, L.down_proj, down));
  KEV_TRY(run(OpKind::AddRmsNorm, {x, down, next_norm, a},
              [&] { return backend_->add_rms_norm(x, down, next_norm, eps, a); }));
  arena_.rewind(mark);
  return Status::success();
}

Result<PrefixState> ModelRunner::prefill(std::span<const int32_t> tokens) {
  KEV_CHECK(!tokens.empty(), ErrorCode::InvalidRequest, "the state pass needs at least one token");
  KEV_ASSIGN_OR_RETURN(PrefixState prefix, alloc_prefix(static_cast<int64_t>(tokens.size())));
  KEV_TRY(forward(tokens, &prefix, nullptr, nullptr).status());
  return prefix;
}

Result<std::vector<float>> ModelRunner::score(const PrefixState& prefix, const ScorePass& pass) {
  return forward({}, nullptr, &prefix, &pass);
}

Result<PrefillScore> ModelRunner::prefill_and_score(std::span<const int32_t> tokens, const ScorePass& pass) {
  KEV_CHECK(!tokens.empty(), ErrorCode::InvalidRequest, "the state pass needs at least one token");
  KEV_CHECK(pass.layout.from_prefix, ErrorCode::Internal, "a score pass fused with the state pass must continue it");
  PrefillScore out;
  KEV_ASSIGN_OR_RETURN(out.prefix, alloc_prefix(static_cast<int64_t>(tokens.size())));
  KEV_ASSIGN_OR_RETURN(out.logits, forward(tokens, &out.prefix, &out.prefix, &pass));
  return out;
}

Result<std::vector<float>> ModelRunner::forward(std::span<const int32_t> state, PrefixState* snapshot,
                                                const PrefixState* prefix, const ScorePass* pass) {
  const ModelConfig& c = config_;
  std::vector<Segment> segs;
  std::vector<int32_t> tokens(state.begin(), state.end());
  if (!state.empty()) {
    Segment& s = segs.emplace_back();
    s.n = static_cast<int64_t>(state.size());
    s.layout.offsets = {0, static_cast<int32_t>(s.n)};
    s.to = snapshot;
  }
  int64_t M = 0, R = 0;
  if (pass) {
    const int64_t n_rows = static_cast<int64_t>(pass->tokens.size());
    M = static_cast<int64_t>(pass->option_rows.size());
    R = static_cast<int64_t>(pass->decide_rows.size());
    KEV_CHECK(n_rows > 0 && M > 0 && R == pass->layout.n_seqs() && pass->layout.n_tokens() == n_rows &&
                  static_cast<int64_t>(pass->option_question.size()) == M &&
                  (!pass->layout.from_prefix || pass->layout.pos0 == prefix->n_tokens),
              ErrorCode::Internal, "inconsistent score pass: ", n_rows, " tokens, ", R, " rows, ", M, " options");
    Segment& s = segs.emplace_back();
    s.begin = static_cast<int64_t>(tokens.size());
    s.n = n_rows;
    s.layout = pass->layout;
    s.from = pass->layout.from_prefix ? prefix : nullptr;
    tokens.insert(tokens.end(), pass->tokens.begin(), pass->tokens.end());
  }
  const int64_t n = static_cast<int64_t>(tokens.size());

  KEV_ASSIGN_OR_RETURN(Tensor x, embed(tokens));
  const float eps = static_cast<float>(c.rms_eps);
  const size_t n_layers = weights_.layers.size();
  // a: the normed input of the next mixer or MLP. After layer 0's input norm, every norm of x comes
  // fused with the residual add before it (add_rms_norm).
  KEV_ASSIGN_OR_RETURN(Tensor a, arena_.alloc(DType::F32, {n, c.n_embd}));
  const Tensor& norm0 = weights_.layers.front().input_norm;
  KEV_TRY(run(OpKind::RmsNorm, {x, norm0, a}, [&] { return backend_->rms_norm(x, norm0, eps, a); }));
  for (size_t il = 0; il + 1 < n_layers; ++il) {
    const LayerWeights& L = weights_.layers[il];
    const size_t mark = arena_.mark();
    KEV_ASSIGN_OR_RETURN(Tensor mix, arena_.alloc(DType::F32, {n, c.n_embd}));
    KEV_TRY(mixer(il, L, a, segs, false, mix));
    KEV_TRY(run(OpKind::AddRmsNorm, {x, mix, L.post_norm, a},
                [&] { return backend_->add_rms_norm(x, mix, L.post_norm, eps, a); }));
    arena_.rewind(mark);
    KEV_TRY(mlp(L, x, a, weights_.layers[il + 1].input_norm));
  }

  // Last layer: the mixer runs on every token (the snapshot keeps the state's conv, recurrent state
  // and K/V; later tokens of a row depend on earlier ones), but the MLP, the final norm and the head
  // only on the rows' readouts: the M option closes, then R decides. The rows' residual add stays a
  // plain add: its sum is gathered, not normed, on all their tokens.
  const LayerWeights& last = weights_.layers.back();
  KEV_ASSIGN_OR_RETURN(Tensor mix, arena_.alloc(DType::F32, {n, c.n_embd}));
  KEV_TRY(mixer(n_layers - 1, last, a, segs, true, mix));
  if (!pass) {
    KEV_TRY(backend_->synchronize());
    KEV_TRY(arena_.reset());
    return std::vector<float>{};
  }
  const Segment& rows = segs.back();
  const Tensor xr_all = rows.rows(x), mix_r = rows.rows(mix);
  KEV_TRY(run(OpKind::Add, {xr_all, mix_r, xr_all}, [&] { return backend_->add(xr_all, mix_r, xr_all); }));
  std::vector<int32_t> readout(pass->option_rows);
  readout.insert(readout.end(), pass->decide_rows.begin(), pass->decide_rows.end());
  const int64_t m = M + R;
  KEV_ASSIGN_OR_RETURN(Tensor idx, arena_.alloc(DType::I32, {m}));
  KEV_TRY(backend_->upload(idx, readout.data(), readout.size() * sizeof(int32_t)));
  KEV_ASSIGN_OR_RETURN(Tensor xr, arena_.alloc(DType::F32, {m, c.n_embd}));
  KEV_TRY(run(OpKind::GatherRows, {xr_all, idx, xr}, [&] { return backend_->gather_rows(xr_all, idx, xr); }));
  // h: N_post(xr) for the MLP, which leaves the final-normed hidden state N_final(xr) in it.
  KEV_ASSIGN_OR_RETURN(Tensor h, arena_.alloc(DType::F32, {m, c.n_embd}));
  KEV_TRY(run(OpKind::RmsNorm, {xr, last.post_norm, h}, [&] { return backend_->rms_norm(xr, last.post_norm, eps, h); }));
  KEV_TRY(mlp(last, xr, h, weights_.final_norm));

  // Pointer head: u = W_q h_D + b_q, κ_j = W_k h_j + b_k, z_j = (κ_j·u) / sqrt(P) / T.
  const HeadWeights& hw = weights_.head;
  const int64_t P = weights_.pointer_dim;
  const Tensor h_close = h.slice(0, 0, M);
  const Tensor h_decide = h.slice(0, M, R);
  KEV_ASSIGN_OR_RETURN(Tensor u, arena_.alloc(DType::F32, {R, P}));
  KEV_ASSIGN_OR_RETURN(Tensor kappa, arena_.alloc(DType::F32, {M, P}));
  KEV_TRY(run(OpKind::Matmul, {h_decide, hw.q_weight, hw.q_bias, u},
              [&] { return backend_->matmul(h_decide, hw.q_weight, hw.q_bias, u); }));
  KEV_TRY(run(OpKind::Matmul, {h_close, hw.k_weight, hw.k_bias, kappa},
              [&] { return backend_->matmul(h_close, hw.k_weight, hw.k_bias, kappa); }));
  KEV_ASSIGN_OR_RETURN(Tensor qidx, arena_.alloc(DType::I32, {M}));
  KEV_TRY(backend_->upload(qidx, pass->option_question.data(), pass->option_question.size() * sizeof(int32_t)));
  KEV_ASSIGN_OR_RETURN(Tensor logits, arena_.alloc(DType::F32, {M}));
  const float scale = static_cast<float>(logit_scale_);
  KEV_TRY(run(OpKind::PointerLogits, {u, kappa, qidx, logits},
              [&] { return backend_->pointer_logits(u, kappa, qidx, scale, logits); }));

  std::vector<float> out(static_cast<size_t>(M));
  KEV_TRY(backend_->download(logits, out.data(), out.size() * sizeof(float)));
  KEV_TRY(arena_.reset());
  return out;
}

}  // namespace kev
