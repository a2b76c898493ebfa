// Gated delta rule (the Gated DeltaNet recurrence, KEV_SPEC.md §5.4) over packed sequences.
//
// Per sequence and value head h (key head kh = h / (Hv/Hk)), with S ∈ R^{dk×dv} starting from
// state_in[h] (layout.from_prefix) or 0, and α_t = e^{g_t}:
//   S̄ = α_t S;  S = S̄ + β_t k_t (v_t − S̄ᵀk_t)ᵀ;  o_t = Sᵀq_t.
// FAST evaluates the equivalent chunked (WY) form, chunks of C = 64 tokens, all FP32:
//   Γ_i = Σ_{t<=i} g_t (in double, so Γ_i − Γ_j stays accurate after a strongly decaying token),
//   γ_i = e^{Γ_i}, D_ij = e^{Γ_i−Γ_j} (j <= i, never overflows: exponent <= 0);
//   (I − A)[U | W] = [diag(β)V | diag(β⊙γ)K] with A_ij = −β_i (k_i·k_j) D_ij (j < i) solved by
//   forward substitution (one cblas_strsm, unit lower triangular: N = (I−A)⁻¹ is never formed);
//   Δ = U − W S₀;  o_i = γ_i S₀ᵀq_i + Σ_{j<=i} D_ij (q_i·k_j) Δ_j;  S₀ ← γ_C S₀ + Σ_j D_Cj k_j Δ_jᵀ.
// A ragged last chunk simply has fewer rows, which is exactly the spec's padding with k = v = 0,
// β = 0, g = 0 (padded rows add nothing to U, W, Δ or the state, and leave Γ_C unchanged).
// Per chunk: [Q;K]·Kᵀ, the solve, U −= W·S₀, O = diag(γ)Q·S₀, O += tril(D⊙QKᵀ)·Δ and the state
// update are 6 BLAS calls; the S₀ products are skipped while S₀ is exactly zero (a fresh pass's first
// chunk) and the last state update when no state_out is wanted (question rows).
// REFERENCE runs the token-by-token recurrence above in double.
//
// Layouts: q, k [n,Hk,dk] (l2-normalised; q pre-scaled by 1/sqrt(dk) by the caller), v [n,Hv,dv],
// g (log decay, <= 0) and beta [n,Hv], all with free outer strides; state_in / state_out [Hv,dk,dv]
// contiguous, key-major (S[h][i][j], i over dk, j over dv); out [n,Hv,dv] (outer strides free).
// Threading: FAST runs one task per (sequence, value head) over the pool, dynamically scheduled so
// sequences of different lengths balance; BLAS is single-threaded inside (BlasSingleThreaded).
// Dtypes: F32 only, FP32 state and accumulation (TF32-free by construction).
// Preconditions (supports() mirrors the static ones): shapes as above, Hk >= 1 divides Hv, state
// tensors contiguous, out disjoint from inputs, state_out disjoint from everything except that it
// may be the identical view of state_in (each task reads its head's state before writing it).
// Bound: state_in present when layout.from_prefix; state_out only for a single-sequence pass.
// state_in is never written (every sequence of the pass starts from it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/blas.h"
#include "backend/cpu/ops.h"

namespace kev::cpu {

namespace {

constexpr int64_t kChunk = 64;

struct GdnArgs {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const Tensor& g;
  const Tensor& beta;
  const float* state_in;  // null: zero initial state
  const Tensor& out;
  float* state_out;  // null: not requested
  int64_t Hk, Hv, dk, dv;

  const float* q_row(int64_t t, int64_t kh) const { return f32(q) + t * q.stride[0] + kh * q.stride[1]; }
  const float* k_row(int64_t t, int64_t kh) const { return f32(k) + t * k.stride[0] + kh * k.stride[1]; }
  const float* v_row(int64_t t, int64_t h) const { return f32(v) + t * v.stride[0] + h * v.stride[1]; }
  float* out_row(int64_t t, int64_t h) const { return f32(out) + t * out.stride[0] + h * out.stride[1]; }
  float g_at(int64_t t, int64_t h) const { return f32(g)[t * g.stride[0] + h]; }
  float beta_at(int64_t t, int64_t h) const { return f32(beta)[t * beta.stride[0] + h]; }
};

void reference_head(const GdnArgs& a, int64_t begin, int64_t end, int64_t h) {
  const int64_t dk = a.dk, dv = a.dv, kh = h / (a.Hv / a.Hk);
  std::vector<double> S(dk * dv, 0.0), u(dv);
  if (a.state_in) {
    for (int64_t i = 0; i < dk * dv; ++i) S[i] = a.state_in[h * dk * dv + i];
  }
  for (int64_t t = begin; t < end; ++t) {
    const float* q = a.q_row(t, kh);
    const float* k = a.k_row(t, kh);
    const float* v = a.v_row(t, h);
    const double alpha = std::exp(static_cast<double>(a.g_at(t, h)));
    const double beta = a.beta_at(t, h);
    for (double& s : S) s *= alpha;
    for (int64_t j = 0; j < dv; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * k[i];
      u[j] = v[j] - acc;
    }
    for (int64_t i = 0; i < dk; ++i) {
      for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += beta * k[i] * u[j];
    }
    float* o = a.out_row(t, h);
    for (int64_t j = 0; j < dv; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * q[i];
      o[j] = static_cast<float>(acc);
    }
  }
  if (a.state_out) {
    for (int64_t i = 0; i < dk * dv; ++i) a.state_out[h * dk * dv + i] = static_cast<float>(S[i]);
  }
}

// Scratch for one (sequence, head) task.
struct ChunkScratch {
  std::vector<float> S, QK, G, D, M, RHS, O;
  std::vector<double> Gamma;  // double: differences of large cumulative decays stay exact
  std::vector<float> gamma;
  bool state_is_zero = true;  // S == 0 exactly: the S₀ products vanish and are skipped
  ChunkScratch(int64_t dk, int64_t dv)
      : S(dk * dv),
        QK(2 * kChunk * dk),
        G(2 * kChunk * kChunk),
        D(kChunk * kChunk),
        M(kChunk * kChunk),
        RHS(kChunk * (dv + dk)),
        O(kChunk * dv),
        Gamma(kChunk),
        gamma(kChunk) {}
};

// One chunk of tokens [t0, t0+cn) for value head h: outputs, then (if update_state) the next state.
void fast_chunk(const GdnArgs& a, ChunkScratch& s, int64_t t0, int64_t cn, int64_t h, bool update_state) {
  const int64_t dk = a.dk, dv = a.dv, kh = h / (a.Hv / a.Hk), ldr = dv + dk;
  const int icn = static_cast<int>(cn), idk = static_cast<int>(dk), idv = static_cast<int>(dv);
  const int ildr = static_cast<int>(ldr), ic = static_cast<int>(kChunk);
  float* Q = s.QK.data();            // [cn, dk]
  float* K = s.QK.data() + cn * dk;  // [cn, dk], directly below Q so [Q;K] is one matrix
  double cum = 0;
  for (int64_t i = 0; i < cn; ++i) {
    std::memcpy(Q + i * dk, a.q_row(t0 + i, kh), dk * sizeof(float));
    std::memcpy(K + i * dk, a.k_row(t0 + i, kh), dk * sizeof(float));
    cum += a.g_at(t0 + i, h);
    s.Gamma[i] = cum;
    s.gamma[i] = static_cast<float>(std::exp(cum));
  }
  for (int64_t i = 0; i < cn; ++i) {
    for (int64_t j = 0; j <= i; ++j) s.D[i * kChunk + j] = std::exp(static_cast<float>(s.Gamma[i] - s.Gamma[j]));
  }
  // G = [Q;K]·Kᵀ: rows [0,cn) are QKᵀ, rows [cn,2cn) are KKᵀ.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2 * icn, icn, idk, 1.0f, Q, idk, K, idk, 0.0f, s.G.data(), ic);
  const float* QKt = s.G.data();
  const float* KKt = s.G.data() + cn * kChunk;
  // M = I − A (strict lower part; the unit diagonal is implied by CblasUnit).
  for (int64_t i = 0; i < cn; ++i) {
    const float b = a.beta_at(t0 + i, h);
    for (int64_t j = 0; j < i; ++j) s.M[i * kChunk + j] = b * KKt[i * kChunk + j] * s.D[i * kChunk + j];
  }
  // RHS = [diag(β)V | diag(β⊙γ)K] -> solved in place to [U | W].
  for (int64_t i = 0; i < cn; ++i) {
    const float b = a.beta_at(t0 + i, h), bg = b * s.gamma[i];
    const float* v = a.v_row(t0 + i, h);
    float* r = s.RHS.data() + i * ldr;
    for (int64_t j = 0; j < dv; ++j) r[j] = b * v[j];
    for (int64_t j = 0; j < dk; ++j) r[dv + j] = bg * K[i * dk + j];
  }
  cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, icn, ildr, 1.0f, s.M.data(), ic,
              s.RHS.data(), ildr);
  float* U = s.RHS.data();             // becomes Δ = U − W·S₀ (columns [0,dv))
  const float* W = s.RHS.data() + dv;  // columns [dv, dv+dk); disjoint from U's elements
  if (!s.state_is_zero) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, icn, idv, idk, -1.0f, W, ildr, s.S.data(), idv, 1.0f, U,
                ildr);
  }
  // O = diag(γ)Q·S₀ + tril(D ⊙ QKᵀ)·Δ. QKᵀ is read before Q is scaled in place.
  for (int64_t i = 0; i < cn; ++i) {
    float* p = s.G.data() + i * kChunk;
    for (int64_t j = 0; j <= i; ++j) p[j] = QKt[i * kChunk + j] * s.D[i * kChunk + j];
    for (int64_t j = i + 1; j < cn; ++j) p[j] = 0.0f;
    for (int64_t j = 0; j < dk; ++j) Q[i * dk + j] *= s.gamma[i];
  }
  if (!s.state_is_zero) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, icn, idv, idk, 1.0f, Q, idk, s.S.data(), idv, 0.0f,
                s.O.data(), idv);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, icn, idv, icn, 1.0f, s.G.data(), ic, U, ildr,
              s.state_is_zero ? 0.0f : 1.0f, s.O.data(), idv);
  if (update_state) {
    // S₀ ← γ_C S₀ + (diag(D_C·) K)ᵀ Δ.
    for (int64_t j = 0; j < cn; ++j) {
      const float f = s.D[(cn - 1) * kChunk + j];
      for (int64_t i = 0; i < dk; ++i) K[j * dk + i] *= f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, idk, idv, icn, 1.0f, K, idk, U, ildr,
                s.state_is_zero ? 0.0f : s.gamma[cn - 1], s.S.data(), idv);
    s.state_is_zero = false;
  }
  for (int64_t i = 0; i < cn; ++i) std::memcpy(a.out_row(t0 + i, h), s.O.data() + i * dv, dv * sizeof(float));
}

void fast_head(const GdnArgs& a, int64_t begin, int64_t end, int64_t h) {
  const int64_t dk = a.dk, dv = a.dv;
  ChunkScratch s(dk, dv);
  if (a.state_in) {
    std::memcpy(s.S.data(), a.state_in + h * dk * dv, dk * dv * sizeof(float));
    s.state_is_zero = false;
  }
  for (int64_t t0 = begin; t0 < end; t0 += kChunk) {
    const int64_t cn = std::min(kChunk, end - t0);
    // The last chunk's state update is only needed when the caller wants the final state.
    fast_chunk(a, s, t0, cn, h, t0 + cn < end || a.state_out != nullptr);
  }
  if (a.state_out) std::memcpy(a.state_out + h * dk * dv, s.S.data(), dk * dv * sizeof(float));
}

}  // namespace

Status check_gated_delta_rule(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, const Tensor& state_in, const Tensor& out, const Tensor& state_out) {
  KEV_TRY(check_tensor(c, "q", q, {DType::F32}, 3));
  const int64_t n = q.shape[0], Hk = q.shape[1], dk = q.shape[2];
  KEV_TRY(check_tensor(c, "k", k, {DType::F32}, 3));
  KEV_TRY(check_shape(c, "k", k, {n, Hk, dk}, "[n,Hk,dk]"));
  KEV_TRY(check_tensor(c, "v", v, {DType::F32}, 3));
  const int64_t Hv = v.shape[1], dv = v.shape[2];
  KEV_TRY(check_shape(c, "v", v, {n, Hv, dv}, "[n,Hv,dv]"));
  KEV_CHECK(Hk >= 1 && Hv % Hk == 0, ErrorCode::InvalidRequest, c.op, ": value heads Hv = ", Hv,
            " must be a multiple of key heads Hk = ", Hk);
  KEV_TRY(check_tensor(c, "g", g, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "g", g, {n, Hv}, "[n,Hv]"));
  KEV_TRY(check_tensor(c, "beta", beta, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "beta", beta, {n, Hv}, "[n,Hv]"));
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 3));
  KEV_TRY(check_shape(c, "out", out, {n, Hv, dv}, "[n,Hv,dv]"));
  KEV_CHECK(dk >= 1 && dv >= 1, ErrorCode::InvalidRequest, c.op, ": head sizes dk = ", dk, ", dv = ", dv,
            " must be >= 1");
  for (int64_t s : {dk, dv, dk + dv}) {
    KEV_CHECK(fits_blas_int(s), ErrorCode::Unsupported, c.op, ": head size ", s, " exceeds the BLAS integer range");
  }
  const Tensor* inputs[] = {&q, &k, &v, &g, &beta, &state_in};
  const char* names[] = {"q", "k", "v", "g", "beta", "state_in"};
  for (int i = 0; i < 6; ++i) KEV_TRY(check_no_overlap(c, "out", out, names[i], *inputs[i]));
  if (present(c, state_in)) {
    KEV_TRY(check_tensor(c, "state_in", state_in, {DType::F32}, 3));
    KEV_TRY(check_contiguous(c, "state_in", state_in));
    KEV_TRY(check_shape(c, "state_in", state_in, {Hv, dk, dv}, "[Hv,dk,dv]"));
  }
  if (present(c, state_out)) {
    KEV_TRY(check_tensor(c, "state_out", state_out, {DType::F32}, 3));
    KEV_TRY(check_contiguous(c, "state_out", state_out));
    KEV_TRY(check_shape(c, "state_out", state_out, {Hv, dk, dv}, "[Hv,dk,dv]"));
    for (int i = 0; i < 5; ++i) KEV_TRY(check_no_overlap(c, "state_out", state_out, names[i], *inputs[i]));
    KEV_TRY(check_no_overlap(c, "state_out", state_out, "out", out));
    KEV_TRY(check_same_or_disjoint(c, "state_out", state_out, "state_in", state_in));
  }
  return Status::success();
}

Status gated_delta_rule(const Exec& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const Tensor& state_in, const SeqLayout& layout, const Tensor& out,
                        const Tensor& state_out) {
  constexpr const char* kOp = "gated_delta_rule";
  KEV_TRY(check_gated_delta_rule({kOp, true}, q, k, v, g, beta, state_in, out, state_out));
  KEV_TRY(check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  const GdnArgs a{q,          k,
                  v,          g,
                  beta,       layout.from_prefix ? f32(state_in) : nullptr,
                  out,        state_out.empty() ? nullptr : f32(state_out),
                  q.shape[1], v.shape[1],
                  q.shape[2], v.shape[2]};
  const int64_t n_tasks = layout.n_seqs() * a.Hv;
  auto task = [&](int64_t i, bool reference) {
    const int64_t r = i / a.Hv, h = i % a.Hv;
    if (reference) {
      reference_head(a, layout.offsets[r], layout.offsets[r + 1], h);
    } else {
      fast_head(a, layout.offsets[r], layout.offsets[r + 1], h);
    }
  };
  if (e.reference) {
    for (int64_t i = 0; i < n_tasks; ++i) task(i, true);
    return Status::success();
  }
  BlasSingleThreaded single;
  e.pool.parallel_for(n_tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) task(i, false);
  });
  return Status::success();
}

}  // namespace kev::cpu
