// Row normalisations over the innermost dimension d (rows = all outer indices):
//
//   rms_norm:       out = x / sqrt(mean(x^2) + eps) * (1 + w)          (zero-centred gain)
//   add_rms_norm:   x = x + y (in place), then out = rms_norm(x)        (the residual add fused in)
//   l2_norm:        out = x / sqrt(sum(x^2) + eps) * scale
//   rms_norm_gated: out = w * o / sqrt(mean(o^2) + eps) * SiLU(z)       (plain gain)
//
// Layouts: x, y, o, z, out [..., d] of rank 1..4 with free outer strides (q/k/v head views of the conv
// output, z a slice of a projection); w [d] contiguous.
// Threading: FAST splits rows over the pool, FP32 with 8-way partial sums for the statistics;
// REFERENCE loops rows serially with double statistics and double products. add_rms_norm does per
// row exactly what add then rms_norm do (the sum rounded to FP32 before the statistics), so fusing
// it changes no bit of either mode.
// Dtypes: F32 only. Preconditions (supports() mirrors them): same shapes, w of length d; out may be
// the identical view of x / o (in place) but may not otherwise overlap an input. add_rms_norm writes
// both x and out, so out, y and w must each be disjoint from x, and out from y and w.
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

namespace kev::cpu {

namespace {

// Runs fn(row) for every row of `shape_of`, serially (reference) or over the pool.
template <class Fn>
void for_rows(const Exec& e, const Tensor& shape_of, Fn&& fn) {
  const int64_t rows = n_rows(shape_of), d = shape_of.shape[shape_of.rank - 1];
  if (e.reference) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  e.pool.parallel_for(rows, grain_for(4 * d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

// rms_norm of one row (o may be xr): shared by rms_norm and add_rms_norm, so the fused op's output is
// rms_norm's by construction.
void rms_norm_row(bool reference, const float* xr, const float* wp, int64_t d, float eps, float* o) {
  if (reference) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j) o[j] = static_cast<float>(xr[j] * inv * (1.0 + wp[j]));
    return;
  }
  const float inv = 1.0f / std::sqrt(sum_squares(xr, d) / static_cast<float>(d) + eps);
  for (int64_t j = 0; j < d; ++j) o[j] = xr[j] * inv * (1.0f + wp[j]);
}

}  // namespace

Status check_rms_norm(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "x", x, {DType::F32}));
  KEV_TRY(check_tensor(c, "w", w, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "w", w, {x.dim(-1)}, "[d]"));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32}));
  KEV_TRY(check_same_shape(c, "out", out, "x", x));
  KEV_TRY(check_same_or_disjoint(c, "out", out, "x", x));
  return check_no_overlap(c, "out", out, "w", w);
}

Status rms_norm(const Exec& e, const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  KEV_TRY(check_rms_norm({"rms_norm", true}, x, w, out));
  const int64_t d = x.dim(-1);
  const float* wp = f32(w);
  for_rows(e, x, [&](int64_t r) {
    rms_norm_row(e.reference, f32(x) + row_offset(x, r), wp, d, eps, f32(out) + row_offset(out, r));
  });
  return Status::success();
}

Status check_add_rms_norm(const OpCheck& c, const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "x", x, {DType::F32}));
  KEV_TRY(check_tensor_any_rank(c, "y", y, {DType::F32}));
  KEV_TRY(check_same_shape(c, "y", y, "x", x));
  KEV_TRY(check_tensor(c, "w", w, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "w", w, {x.dim(-1)}, "[d]"));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32}));
  KEV_TRY(check_same_shape(c, "out", out, "x", x));
  KEV_TRY(check_no_overlap(c, "x", x, "y", y));
  KEV_TRY(check_no_overlap(c, "x", x, "w", w));
  KEV_TRY(check_no_overlap(c, "out", out, "x", x));
  KEV_TRY(check_no_overlap(c, "out", out, "y", y));
  return check_no_overlap(c, "out", out, "w", w);
}

Status add_rms_norm(const Exec& e, const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) {
  KEV_TRY(check_add_rms_norm({"add_rms_norm", true}, x, y, w, out));
  const int64_t d = x.dim(-1);
  const float* wp = f32(w);
  for_rows(e, x, [&](int64_t r) {
    float* xr = f32(x) + row_offset(x, r);
    const float* yr = f32(y) + row_offset(y, r);
    if (e.reference) {
      for (int64_t j = 0; j < d; ++j) {
        xr[j] = static_cast<float>(static_cast<double>(xr[j]) + static_cast<double>(yr[j]));
      }
    } else {
      for (int64_t j = 0; j < d; ++j) xr[j] += yr[j];
    }
    rms_norm_row(e.reference, xr, wp, d, eps, f32(out) + row_offset(out, r));
  });
  return Status::success();
}

Status check_l2_norm(const OpCheck& c, const Tensor& x, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "x", x, {DType::F32}));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32}));
  KEV_TRY(check_same_shape(c, "out", out, "x", x));
  return check_same_or_disjoint(c, "out", out, "x", x);
}

Status l2_norm(const Exec& e, const Tensor& x, float eps, float scale, const Tensor& out) {
  KEV_TRY(check_l2_norm({"l2_norm", true}, x, out));
  const int64_t d = x.dim(-1);
  for_rows(e, x, [&](int64_t r) {
    const float* xr = f32(x) + row_offset(x, r);
    float* o = f32(out) + row_offset(out, r);
    if (e.reference) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
      const double f = scale / std::sqrt(ss + eps);
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<float>(xr[j] * f);
      return;
    }
    const float f = scale / std::sqrt(sum_squares(xr, d) + eps);
    for (int64_t j = 0; j < d; ++j) o[j] = xr[j] * f;
  });
  return Status::success();
}

Status check_rms_norm_gated(const OpCheck& c, const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out) {
  KEV_TRY(check_tensor_any_rank(c, "o", o, {DType::F32}));
  KEV_TRY(check_tensor_any_rank(c, "z", z, {DType::F32}));
  KEV_TRY(check_same_shape(c, "z", z, "o", o));
  KEV_TRY(check_tensor(c, "w", w, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "w", w, {o.dim(-1)}, "[dv]"));
  KEV_TRY(check_tensor_any_rank(c, "out", out, {DType::F32}));
  KEV_TRY(check_same_shape(c, "out", out, "o", o));
  KEV_TRY(check_same_or_disjoint(c, "out", out, "o", o));
  KEV_TRY(check_same_or_disjoint(c, "out", out, "z", z));
  return check_no_overlap(c, "out", out, "w", w);
}

Status rms_norm_gated(const Exec& e, const Tensor& o, const Tensor& z, const Tensor& w, float eps, const Tensor& out) {
  KEV_TRY(check_rms_norm_gated({"rms_norm_gated", true}, o, z, w, out));
  const int64_t d = o.dim(-1);
  const float* wp = f32(w);
  for_rows(e, o, [&](int64_t r) {
    const float* orow = f32(o) + row_offset(o, r);
    const float* zr = f32(z) + row_offset(z, r);
    float* dst = f32(out) + row_offset(out, r);
    if (e.reference) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(orow[j]) * orow[j];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (int64_t j = 0; j < d; ++j) {
        dst[j] = static_cast<float>(wp[j] * (orow[j] * inv) * silu(static_cast<double>(zr[j])));
      }
      return;
    }
    const float inv = 1.0f / std::sqrt(sum_squares(orow, d) / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) dst[j] = wp[j] * (orow[j] * inv) * silu(zr[j]);
  });
  return Status::success();
}

}  // namespace kev::cpu
