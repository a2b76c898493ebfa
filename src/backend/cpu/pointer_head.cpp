// Pointer-head logits: out[j] = (kappa[j] · u[question[j]]) · scale.
//
// Layouts: u [Q,P] (one query vector per question), kappa [M,P] (one key per option), question [M] I32
// (the question each option belongs to), out [M] F32; outer strides free.
// FAST: options split over the pool, FP32 dot products with 8-way partial sums. REFERENCE: serial,
// double accumulation. Dtypes: F32 (+ I32 indices).
// Preconditions (supports() mirrors them): shapes as above, out disjoint from the inputs. Bound:
// every question[j] in [0, Q), checked before anything is written.
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

namespace kev::cpu {

Status check_pointer_logits(const OpCheck& c, const Tensor& u, const Tensor& kappa, const Tensor& question,
                            const Tensor& out) {
  KEV_TRY(check_tensor(c, "u", u, {DType::F32}, 2));
  KEV_TRY(check_tensor(c, "kappa", kappa, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "kappa", kappa, {kappa.shape[0], u.shape[1]}, "[M,P]"));
  KEV_TRY(check_tensor(c, "question", question, {DType::I32}, 1));
  KEV_TRY(check_shape(c, "question", question, {kappa.shape[0]}, "[M]"));
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 1));
  KEV_TRY(check_shape(c, "out", out, {kappa.shape[0]}, "[M]"));
  KEV_TRY(check_no_overlap(c, "out", out, "u", u));
  KEV_TRY(check_no_overlap(c, "out", out, "kappa", kappa));
  return check_no_overlap(c, "out", out, "question", question);
}

Status pointer_logits(const Exec& e, const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                      const Tensor& out) {
  constexpr const char* kOp = "pointer_logits";
  KEV_TRY(check_pointer_logits({kOp, true}, u, kappa, question, out));
  const int64_t M = kappa.shape[0], P = u.shape[1], Q = u.shape[0];
  const int32_t* qi = i32(question);
  for (int64_t j = 0; j < M; ++j) {
    KEV_CHECK(qi[j] >= 0 && qi[j] < Q, ErrorCode::InvalidRequest, kOp, ": question[", j, "] = ", qi[j],
              " is outside [0, ", Q, ")");
  }
  float* o = f32(out);
  auto row = [&](const Tensor& t, int64_t r) { return f32(t) + r * t.stride[0]; };
  if (e.reference) {
    for (int64_t j = 0; j < M; ++j) {
      const float* kr = row(kappa, j);
      const float* ur = row(u, qi[j]);
      double acc = 0;
      for (int64_t p = 0; p < P; ++p) acc += static_cast<double>(kr[p]) * ur[p];
      o[j] = static_cast<float>(acc * scale);
    }
    return Status::success();
  }
  e.pool.parallel_for(M, grain_for(2 * P), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) o[j] = dot(row(kappa, j), row(u, qi[j]), P) * scale;
  });
  return Status::success();
}

}  // namespace kev::cpu
