// Element-wise ops over same-shaped views (rank 1..4, innermost contiguous, outer strides free):
//
//   gdn_gates:   beta = σ(b);  g = −exp(A_log) · softplus(a + dt_bias)     b, a, beta, g [n,Hv]; A_log, dt_bias [Hv]
//   sigmoid_mul: out = x · σ(gate)
//   swiglu:      out = SiLU(gate) · up
//   add:         out = a + b
//   copy:        out = x, F32 or BF16 on either side (BF16 rounds to nearest even, NaN kept)
//
// σ and softplus are the overflow-free forms of vec.h (softplus(u) = max(u,0) + log1p(e^−|u|)).
// Threading: FAST splits innermost rows over the pool in FP32; REFERENCE loops serially in double.
// Preconditions (supports() mirrors them): F32 operands (copy: F32|BF16), equal shapes; an output may
// be the identical view of an input (each element is read before it is written) but may not
// otherwise overlap one.
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"
#include "common/bf16.h"

namespace kev::cpu {

namespace {

// Calls fn(row) for every innermost row of `shape_of`.
template <class Fn>
void for_rows(const Exec& e, const Tensor& shape_of, int64_t cost_per_element, Fn&& fn) {
  const int64_t rows = n_rows(shape_of), d = shape_of.shape[shape_of.rank - 1];
  if (e.reference) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  e.pool.parallel_for(rows, grain_for(cost_per_element * d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

// out = f(x, y) element-wise; f is evaluated in double (REFERENCE) or float (FAST).
template <class Fn>
Status binary(const Exec& e, const char* op, const Tensor& x, const Tensor& y, const Tensor& out, int64_t cost,
              Fn&& f) {
  KEV_TRY(check_binary({op, true}, x, y, out));
  const int64_t d = x.dim(-1);
  for_rows(e, x, cost, [&](int64_t r) {
    const float* xr = f32(x) + row_offset(x, r);
    const float* yr = f32(y) + row_offset(y, r);
    float* o = f32(out) + row_offset(out, r);
    if (e.reference) {
      for (int64_t j = 0; j < d; ++j)
        o[j] = static_cast<float>(f(static_cast<double>(xr[j]), static_cast<double>(yr[j])));
    } else {
      for (int64_t j = 0; j < d; ++j) o[j] = f(xr[j], yr[j]);
    }
  });
  return Status::success();
}

}  // namespace

Status check_binary(const OpCheck& c, const Tensor& x, const Tensor& y, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "x", x, {DType::F32}));
  KEV_TRY(check_tensor_any_rank(c, "y", y, {DType::F32}));
  KEV_TRY(check_same_shape(c, "y", y, "x", x));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32}));
  KEV_TRY(check_same_shape(c, "out", out, "x", x));
  KEV_TRY(check_same_or_disjoint(c, "out", out, "x", x));
  return check_same_or_disjoint(c, "out", out, "y", y);
}

Status sigmoid_mul(const Exec& e, const Tensor& x, const Tensor& gate, const Tensor& out) {
  return binary(e, "sigmoid_mul", x, gate, out, 20, [](auto a, auto b) { return a * sigmoid(b); });
}

Status swiglu(const Exec& e, const Tensor& gate, const Tensor& up, const Tensor& out) {
  return binary(e, "swiglu", gate, up, out, 20, [](auto a, auto b) { return silu(a) * b; });
}

Status add(const Exec& e, const Tensor& a, const Tensor& b, const Tensor& out) {
  return binary(e, "add", a, b, out, 1, [](auto x, auto y) { return x + y; });
}

Status check_gdn_gates(const OpCheck& c, const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                       const Tensor& beta, const Tensor& g) {
  KEV_TRY(check_tensor(c, "b", b, {DType::F32}, 2));
  const int64_t n = b.shape[0], Hv = b.shape[1];
  KEV_TRY(check_tensor(c, "a", a, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "a", a, {n, Hv}, "[n,Hv]"));
  KEV_TRY(check_tensor(c, "a_log", a_log, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "a_log", a_log, {Hv}, "[Hv]"));
  KEV_TRY(check_tensor(c, "dt_bias", dt_bias, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "dt_bias", dt_bias, {Hv}, "[Hv]"));
  KEV_TRY(check_tensor(c, "beta", beta, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "beta", beta, {n, Hv}, "[n,Hv]"));
  KEV_TRY(check_tensor(c, "g", g, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "g", g, {n, Hv}, "[n,Hv]"));
  KEV_TRY(check_no_overlap(c, "g", g, "beta", beta));
  const Tensor* outs[] = {&beta, &g};
  const char* out_names[] = {"beta", "g"};
  for (int i = 0; i < 2; ++i) {
    KEV_TRY(check_same_or_disjoint(c, out_names[i], *outs[i], "b", b));
    KEV_TRY(check_same_or_disjoint(c, out_names[i], *outs[i], "a", a));
    KEV_TRY(check_no_overlap(c, out_names[i], *outs[i], "a_log", a_log));
    KEV_TRY(check_no_overlap(c, out_names[i], *outs[i], "dt_bias", dt_bias));
  }
  return Status::success();
}

Status gdn_gates(const Exec& e, const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                 const Tensor& beta, const Tensor& g) {
  KEV_TRY(check_gdn_gates({"gdn_gates", true}, b, a, a_log, dt_bias, beta, g));
  const int64_t Hv = b.shape[1];
  const float* al = f32(a_log);
  const float* dt = f32(dt_bias);
  for_rows(e, b, 40, [&](int64_t t) {
    const float* br = f32(b) + t * b.stride[0];
    const float* ar = f32(a) + t * a.stride[0];
    float* betar = f32(beta) + t * beta.stride[0];
    float* gr = f32(g) + t * g.stride[0];
    for (int64_t h = 0; h < Hv; ++h) {
      float bv, gv;
      if (e.reference) {
        bv = static_cast<float>(sigmoid(static_cast<double>(br[h])));
        gv = static_cast<float>(-std::exp(static_cast<double>(al[h])) *
                                softplus(static_cast<double>(ar[h]) + static_cast<double>(dt[h])));
      } else {
        bv = sigmoid(br[h]);
        gv = -std::exp(al[h]) * softplus(ar[h] + dt[h]);
      }
      betar[h] = bv;
      gr[h] = gv;
    }
  });
  return Status::success();
}

Status check_copy(const OpCheck& c, const Tensor& x, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "x", x, {DType::F32, DType::BF16}));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32, DType::BF16}));
  KEV_TRY(check_same_shape(c, "out", out, "x", x));
  return check_same_or_disjoint(c, "out", out, "x", x);
}

Status copy(const Exec& e, const Tensor& x, const Tensor& out) {
  KEV_TRY(check_copy({"copy", true}, x, out));
  const int64_t d = x.dim(-1);
  for_rows(e, x, 1, [&](int64_t r) {
    const int64_t xi = row_offset(x, r), oi = row_offset(out, r);
    if (x.dtype == out.dtype) {
      const size_t es = dtype_size(x.dtype);
      std::memmove(static_cast<char*>(out.buffer->handle()) + out.offset + oi * es,
                   static_cast<const char*>(x.buffer->handle()) + x.offset + xi * es, static_cast<size_t>(d) * es);
    } else if (x.dtype == DType::F32) {
      const float* s = f32(x) + xi;
      uint16_t* o = data_ptr<uint16_t>(out) + oi;
      for (int64_t j = 0; j < d; ++j) o[j] = f32_to_bf16(s[j]);
    } else {
      const uint16_t* s = data_ptr<const uint16_t>(x) + xi;
      float* o = f32(out) + oi;
      for (int64_t j = 0; j < d; ++j) o[j] = bf16_to_f32(s[j]);
    }
  });
  return Status::success();
}

}  // namespace kev::cpu
