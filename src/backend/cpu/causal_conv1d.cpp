// Depthwise causal convolution over each packed sequence, then SiLU (the GDN pre-mixer).
//
//   out[t,c] = SiLU( Σ_{j=0..K-1} w[c,j] · in(τ-(K-1)+j, c) ),  τ = t - offsets[r] for t in sequence r,
//   in(i, c) = x[offsets[r]+i, c] for i >= 0; for i < 0 it is state_in[c, K+i] when layout.from_prefix
//   (column K-1 is the input just before the sequence; column 0 is never read) and 0 otherwise.
//   state_out[c, j] = in(L-K+j, c), j = 0..K-1, for the single sequence of length L: the last K inputs,
//   continuing into state_in (from_prefix) or zeros (fresh) when L < K.
//
// Layouts: x [n,C] (row stride free: x is the pre-conv stream, possibly a slice), w [C,K] contiguous,
// state_in / state_out [C,K] contiguous, out [n,C] (row stride free).
// Threading: FAST transposes w (and the prefix columns) to [K,C] once so each token is K contiguous
// multiply-adds across channels, and splits tokens over the pool; state_out is filled afterwards.
// REFERENCE loops sequence, token, channel and tap serially in double.
// Dtypes: F32. Preconditions (supports() mirrors the static ones): shapes as above, K >= 1, out
// disjoint from every input; state_out disjoint from the inputs except that it may be the identical view
// of state_in (updated in place: column j reads column L+j >= j first). Bound: state_in present when
// layout.from_prefix; state_out only for a single-sequence pass.
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

namespace kev::cpu {

Status check_causal_conv1d_silu(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& state_in,
                                const Tensor& out, const Tensor& state_out) {
  KEV_TRY(check_tensor(c, "x", x, {DType::F32}, 2));
  KEV_TRY(check_tensor(c, "w", w, {DType::F32}, 2));
  KEV_TRY(check_contiguous(c, "w", w));
  const int64_t C = x.shape[1], K = w.shape[1];
  KEV_TRY(check_shape(c, "w", w, {C, K}, "[C,K]"));
  KEV_CHECK(K >= 1, ErrorCode::InvalidRequest, c.op, ": kernel width K is 0 (w ", w.describe(), ")");
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "out", out, {x.shape[0], C}, "[n,C]"));
  KEV_TRY(check_no_overlap(c, "out", out, "x", x));
  KEV_TRY(check_no_overlap(c, "out", out, "w", w));
  if (present(c, state_in)) {
    KEV_TRY(check_tensor(c, "state_in", state_in, {DType::F32}, 2));
    KEV_TRY(check_contiguous(c, "state_in", state_in));
    KEV_TRY(check_shape(c, "state_in", state_in, {C, K}, "[C,K]"));
    KEV_TRY(check_no_overlap(c, "out", out, "state_in", state_in));
  }
  if (present(c, state_out)) {
    KEV_TRY(check_tensor(c, "state_out", state_out, {DType::F32}, 2));
    KEV_TRY(check_contiguous(c, "state_out", state_out));
    KEV_TRY(check_shape(c, "state_out", state_out, {C, K}, "[C,K]"));
    KEV_TRY(check_no_overlap(c, "state_out", state_out, "x", x));
    KEV_TRY(check_no_overlap(c, "state_out", state_out, "w", w));
    KEV_TRY(check_no_overlap(c, "state_out", state_out, "out", out));
    if (present(c, state_in)) KEV_TRY(check_same_or_disjoint(c, "state_out", state_out, "state_in", state_in));
  }
  return Status::success();
}

namespace {

void reference_conv(const Tensor& x, const Tensor& w, const float* prefix, const SeqLayout& layout, const Tensor& out) {
  const int64_t C = x.shape[1], K = w.shape[1];
  const float* wp = f32(w);
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    const int64_t begin = layout.offsets[r], len = layout.offsets[r + 1] - begin;
    for (int64_t tau = 0; tau < len; ++tau) {
      float* o = f32(out) + (begin + tau) * out.stride[0];
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t i = tau - (K - 1) + j;
          double in = 0;
          if (i >= 0) {
            in = f32(x)[(begin + i) * x.stride[0] + c];
          } else if (prefix) {
            in = prefix[c * K + K + i];
          }
          acc += static_cast<double>(wp[c * K + j]) * in;
        }
        o[c] = static_cast<float>(silu(acc));
      }
    }
  }
}

void fast_conv(const Exec& e, const Tensor& x, const Tensor& w, const float* prefix, const SeqLayout& layout,
               const Tensor& out) {
  const int64_t n = x.shape[0], C = x.shape[1], K = w.shape[1];
  // wt[j][c] = w[c][j]; pre[K-1+i][c] = in(i, c) for i in [-(K-1), 0).
  std::vector<float> wt(K * C), pre((K - 1) * C, 0.0f);
  const float* wp = f32(w);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = wp[c * K + j];
    if (prefix) {
      for (int64_t j = 0; j + 1 < K; ++j) pre[j * C + c] = prefix[c * K + j + 1];
    }
  }
  std::vector<int64_t> seq_begin(n);
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    for (int64_t t = layout.offsets[r]; t < layout.offsets[r + 1]; ++t) seq_begin[t] = layout.offsets[r];
  }
  e.pool.parallel_for(n, grain_for(2 * K * C), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      float* o = f32(out) + t * out.stride[0];
      const int64_t tau = t - seq_begin[t];
      for (int64_t j = 0; j < K; ++j) {
        const int64_t i = tau - (K - 1) + j;
        const float* in = i >= 0 ? f32(x) + (seq_begin[t] + i) * x.stride[0] : pre.data() + (K - 1 + i) * C;
        const float* wj = wt.data() + j * C;
        if (j == 0) {
          for (int64_t c = 0; c < C; ++c) o[c] = wj[c] * in[c];
        } else {
          for (int64_t c = 0; c < C; ++c) o[c] += wj[c] * in[c];
        }
      }
      for (int64_t c = 0; c < C; ++c) o[c] = silu(o[c]);
    }
  });
}

// state_out[c][j] = in(L-K+j, c); column L+j of state_in feeds column j, so ascending j is in-place safe.
void write_state(const Tensor& x, const float* prefix, int64_t begin, int64_t len, const Tensor& state_out) {
  const int64_t C = x.shape[1], K = state_out.shape[1];
  float* so = f32(state_out);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = len - K + j;
      float v = 0.0f;
      if (i >= 0) {
        v = f32(x)[(begin + i) * x.stride[0] + c];
      } else if (prefix) {
        v = prefix[c * K + K + i];
      }
      so[c * K + j] = v;
    }
  }
}

}  // namespace

Status causal_conv1d_silu(const Exec& e, const Tensor& x, const Tensor& w, const Tensor& state_in,
                          const SeqLayout& layout, const Tensor& out, const Tensor& state_out) {
  constexpr const char* kOp = "causal_conv1d_silu";
  KEV_TRY(check_causal_conv1d_silu({kOp, true}, x, w, state_in, out, state_out));
  KEV_TRY(check_layout(kOp, layout, x.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  const float* prefix = layout.from_prefix ? f32(state_in) : nullptr;
  if (e.reference) {
    reference_conv(x, w, prefix, layout, out);
  } else {
    fast_conv(e, x, w, prefix, layout, out);
  }
  if (!state_out.empty()) write_state(x, prefix, 0, layout.n_tokens(), state_out);
  return Status::success();
}

}  // namespace kev::cpu
