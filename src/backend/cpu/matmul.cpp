// Dense projection: out = x · Wᵀ (+ bias).
//
//   x [n,k] F32 (row stride free: x may be a column slice), w [m,k] F32 contiguous ([out,in]),
//   bias [m] F32 or empty, out [n,m] F32 (row stride free).
//
// FAST, row-invariant (the default): gemm_row_invariant (matmul_row_invariant.cpp) over the backend's
// pool. Each output element goes through the same floating-point operations whatever else is in the
// pass, so a row's result does not depend on the rows packed with it or on the thread count (the
// engine's "questions together == questions alone" holds bit for bit).
// FAST, OpenBLAS (BackendOptions::row_invariant_matmul = false): one cblas_sgemm (RowMajor, NoTrans ×
// Trans) on the calling thread, parallelised by OpenBLAS with the backend's thread count. A bias is
// broadcast into out first and the GEMM accumulates (beta = 1). OpenBLAS's blocking depends on the
// row count, so a row's bits change with what it is batched with (by a few ulp; ~1e-6 in answer
// probabilities).
// REFERENCE: the textbook triple loop with a double accumulator.
// Dtypes: F32 only (the engine widens BF16 weights at load on CPU). Preconditions (supports() mirrors
// them): shapes as above, w contiguous, every size and leading dimension below 2^31, out disjoint
// from x, w and bias.
#include <algorithm>
#include <cstring>

#include "backend/cpu/blas.h"
#include "backend/cpu/matmul_row_invariant.h"
#include "backend/cpu/ops.h"

namespace kev::cpu {

Status check_matmul(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  KEV_TRY(check_tensor(c, "x", x, {DType::F32}, 2));
  KEV_TRY(check_tensor(c, "w", w, {DType::F32}, 2));
  KEV_TRY(check_contiguous(c, "w", w));
  KEV_TRY(check_shape(c, "w", w, {w.shape[0], x.shape[1]}, "[m,k]"));
  if (present(c, bias)) {
    KEV_TRY(check_tensor(c, "bias", bias, {DType::F32}, 1));
    KEV_TRY(check_shape(c, "bias", bias, {w.shape[0]}, "[m]"));
    KEV_TRY(check_no_overlap(c, "out", out, "bias", bias));
  }
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "out", out, {x.shape[0], w.shape[0]}, "[n,m]"));
  const int64_t sizes[] = {x.shape[0], x.shape[1], w.shape[0], x.stride[0], out.stride[0]};
  for (int64_t s : sizes) {
    KEV_CHECK(fits_blas_int(s), ErrorCode::Unsupported, c.op, ": size ", s, " of x ", x.describe(), " / w ",
              w.describe(), " exceeds the BLAS integer range");
  }
  // BLAS needs rows that do not overlap (leading dimension >= row length).
  KEV_CHECK(x.shape[0] <= 1 || x.stride[0] >= x.shape[1], ErrorCode::InvalidRequest, c.op, ": x ", x.describe(),
            " has overlapping rows");
  KEV_CHECK(out.shape[0] <= 1 || out.stride[0] >= out.shape[1], ErrorCode::InvalidRequest, c.op, ": out ",
            out.describe(), " has overlapping rows");
  KEV_TRY(check_no_overlap(c, "out", out, "x", x));
  return check_no_overlap(c, "out", out, "w", w);
}

namespace {

void matmul_openblas(int64_t n, int64_t k, int64_t m, const float* xp, int64_t ldx, const float* wp, const float* bp,
                     float* op, int64_t ldo) {
  if (bp || k == 0) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = op + i * ldo;
      if (bp) {
        std::memcpy(row, bp, static_cast<size_t>(m) * sizeof(float));
      } else {
        std::fill(row, row + m, 0.0f);
      }
    }
  }
  if (k == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
              1.0f, xp, static_cast<int>(ldx), wp, static_cast<int>(k), bp ? 1.0f : 0.0f, op, static_cast<int>(ldo));
}

}  // namespace

Status matmul(const Exec& e, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  KEV_TRY(check_matmul({"matmul", true}, x, w, bias, out));
  const int64_t n = x.shape[0], k = x.shape[1], m = w.shape[0];
  const float* xp = f32(x);
  const float* wp = f32(w);
  const float* bp = bias.empty() ? nullptr : f32(bias);
  float* op = f32(out);
  // A single row's stride is never stepped over; BLAS still wants it >= the row length.
  const int64_t ldx = n > 1 ? x.stride[0] : std::max<int64_t>(k, 1);
  const int64_t ldo = n > 1 ? out.stride[0] : std::max<int64_t>(m, 1);
  if (e.reference) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double acc = bp ? bp[j] : 0.0;
        for (int64_t l = 0; l < k; ++l) acc += static_cast<double>(xp[i * ldx + l]) * wp[j * k + l];
        op[i * ldo + j] = static_cast<float>(acc);
      }
    }
    return Status::success();
  }
  if (n == 0 || m == 0) return Status::success();
  if (e.row_invariant_matmul) {
    gemm_row_invariant(e.pool, GemmProblem{n, k, m, xp, ldx, wp, bp, op, ldo});
  } else {
    matmul_openblas(n, k, m, xp, ldx, wp, bp, op, ldo);
  }
  return Status::success();
}

}  // namespace kev::cpu
