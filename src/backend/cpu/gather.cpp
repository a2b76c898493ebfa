// Row gathers: embedding lookup and gather_rows.
//
//   embedding:   out[t,:] = table[ids[t],:]        table [V,d] F32|BF16, ids [n] I32, out [n,d] F32
//   gather_rows: out[i,:] = x[idx[i],:]            x [n,d] F32, idx [m] I32, out [m,d] F32
//
// Threading: FAST splits the output rows over the pool (each row is one memcpy or one BF16 widening
// loop); REFERENCE copies element by element on the calling thread.
// Dtypes: BF16 tables are widened exactly (bf16 is the top half of an f32). Outputs are F32.
// Preconditions (supports() mirrors them): ranks and shapes as above, innermost stride 1, outer
// strides free; the output may not overlap an input. Bound: every id in [0, V) (checked before any
// write, the error names the first bad id and its position).
#include <cstring>

#include "backend/cpu/ops.h"
#include "common/bf16.h"

namespace kev::cpu {

namespace {

Status check_ids(const char* op, const char* name, const Tensor& ids, int64_t limit) {
  const int32_t* p = i32(ids);
  for (int64_t i = 0; i < ids.shape[0]; ++i) {
    KEV_CHECK(p[i] >= 0 && p[i] < limit, ErrorCode::InvalidRequest, op, ": ", name, "[", i, "] = ", p[i],
              " is outside [0, ", limit, ")");
  }
  return Status::success();
}

// Copies row `src_row` of `src` (F32 or BF16) into row `dst_row` of F32 `dst`.
void copy_row(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t d, bool reference) {
  float* o = f32(dst) + dst_row * dst.stride[0];
  if (src.dtype == DType::BF16) {
    const uint16_t* s = data_ptr<const uint16_t>(src) + src_row * src.stride[0];
    for (int64_t j = 0; j < d; ++j) o[j] = bf16_to_f32(s[j]);
    return;
  }
  const float* s = f32(src) + src_row * src.stride[0];
  if (reference) {
    for (int64_t j = 0; j < d; ++j) o[j] = s[j];
  } else {
    std::memcpy(o, s, static_cast<size_t>(d) * sizeof(float));
  }
}

Status gather(const Exec& e, const char* op, const char* idx_name, const Tensor& src, const Tensor& idx,
              const Tensor& out) {
  KEV_TRY(check_ids(op, idx_name, idx, src.shape[0]));
  const int32_t* ids = i32(idx);
  const int64_t n = out.shape[0], d = out.shape[1];
  if (e.reference) {
    for (int64_t t = 0; t < n; ++t) copy_row(src, ids[t], out, t, d, true);
    return Status::success();
  }
  e.pool.parallel_for(n, grain_for(d), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) copy_row(src, ids[t], out, t, d, false);
  });
  return Status::success();
}

}  // namespace

Status check_embedding(const OpCheck& c, const Tensor& table, const Tensor& ids, const Tensor& out) {
  KEV_TRY(check_tensor(c, "table", table, {DType::F32, DType::BF16}, 2));
  KEV_TRY(check_tensor(c, "ids", ids, {DType::I32}, 1));
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "out", out, {ids.shape[0], table.shape[1]}, "[n,d]"));
  KEV_TRY(check_no_overlap(c, "out", out, "table", table));
  return check_no_overlap(c, "out", out, "ids", ids);
}

Status embedding(const Exec& e, const Tensor& table, const Tensor& ids, const Tensor& out) {
  KEV_TRY(check_embedding({"embedding", true}, table, ids, out));
  return gather(e, "embedding", "ids", table, ids, out);
}

Status check_gather_rows(const OpCheck& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  KEV_TRY(check_tensor(c, "x", x, {DType::F32}, 2));
  KEV_TRY(check_tensor(c, "idx", idx, {DType::I32}, 1));
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 2));
  KEV_TRY(check_shape(c, "out", out, {idx.shape[0], x.shape[1]}, "[m,d]"));
  KEV_TRY(check_no_overlap(c, "out", out, "x", x));
  return check_no_overlap(c, "out", out, "idx", idx);
}

Status gather_rows(const Exec& e, const Tensor& x, const Tensor& idx, const Tensor& out) {
  KEV_TRY(check_gather_rows({"gather_rows", true}, x, idx, out));
  return gather(e, "gather_rows", "idx", x, idx, out);
}

}  // namespace kev::cpu
