// Rotary position embedding, rotate-half form, in place on the first n_rot dims of every head.
//
//   pos = layout.pos0 + (t − offsets[r]) for token t of sequence r;
//   φ_i = pos · θ^(−2i/n_rot), i < n_rot/2 (computed in double, cos/sin in double, then cast);
//   (x_i, x_{i+n_rot/2}) ← (x_i cos φ_i − x_{i+n_rot/2} sin φ_i, x_{i+n_rot/2} cos φ_i + x_i sin φ_i);
//   dims >= n_rot are untouched.
//
// Layout: x [n,H,hd] with free outer strides (q is the query half of a [n,H,2·hd] projection).
// FAST: a cos/sin table over the pass's distinct relative positions [0, max_len), built in parallel,
// then rows (token, head) split over the pool. REFERENCE: per element, angle and cos/sin in double.
// Dtypes: F32. Preconditions: rank 3 (supports() checks it); n_rot even, 0 <= n_rot <= hd and
// theta > 0 are checked when the op runs (supports() cannot see them).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace kev::cpu {

namespace {

double rope_angle(int64_t pos, int64_t i, int64_t n_rot, double theta) {
  return static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
}

void rotate(float* x, const float* cs, const float* sn, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cs[i] - b * sn[i];
    x[i + half] = b * cs[i] + a * sn[i];
  }
}

}  // namespace

Status check_rope(const OpCheck& c, const Tensor& x) { return check_tensor(c, "x", x, {DType::F32}, 3); }

Status rope(const Exec& e, const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) {
  constexpr const char* kOp = "rope";
  KEV_TRY(check_rope({kOp, true}, x));
  KEV_TRY(check_layout(kOp, layout, x.shape[0]));
  const int64_t H = x.shape[1], hd = x.shape[2], half = n_rot / 2;
  KEV_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= hd, ErrorCode::InvalidRequest, kOp, ": n_rot = ", n_rot,
            " must be even and within [0, head size ", hd, "]");
  KEV_CHECK(theta > 0 && std::isfinite(theta), ErrorCode::InvalidRequest, kOp, ": theta = ", theta,
            " must be positive and finite");
  if (half == 0) return Status::success();
  auto row = [&](int64_t t, int64_t h) { return f32(x) + t * x.stride[0] + h * x.stride[1]; };
  if (e.reference) {
    for (int64_t r = 0; r < layout.n_seqs(); ++r) {
      for (int64_t t = layout.offsets[r]; t < layout.offsets[r + 1]; ++t) {
        const int64_t pos = layout.pos0 + (t - layout.offsets[r]);
        for (int64_t h = 0; h < H; ++h) {
          float* p = row(t, h);
          for (int64_t i = 0; i < half; ++i) {
            const double phi = rope_angle(pos, i, n_rot, theta);
            const double a = p[i], b = p[i + half];
            p[i] = static_cast<float>(a * std::cos(phi) - b * std::sin(phi));
            p[i + half] = static_cast<float>(b * std::cos(phi) + a * std::sin(phi));
          }
        }
      }
    }
    return Status::success();
  }
  int64_t max_len = 0;
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    max_len = std::max<int64_t>(max_len, layout.offsets[r + 1] - layout.offsets[r]);
  }
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_angle(1, i, n_rot, theta);
  // table[p] = [cos φ_0..cos φ_{half-1}, sin φ_0..sin φ_{half-1}] for position pos0 + p.
  std::vector<float> table(max_len * 2 * half);
  e.pool.parallel_for(max_len, grain_for(40 * half), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const double pos = static_cast<double>(layout.pos0 + p);
      for (int64_t i = 0; i < half; ++i) {
        const double phi = pos * inv_freq[i];
        table[p * 2 * half + i] = static_cast<float>(std::cos(phi));
        table[p * 2 * half + half + i] = static_cast<float>(std::sin(phi));
      }
    }
  });
  std::vector<int64_t> rel(x.shape[0]);
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    for (int64_t t = layout.offsets[r]; t < layout.offsets[r + 1]; ++t) rel[t] = t - layout.offsets[r];
  }
  e.pool.parallel_for(x.shape[0] * H, grain_for(4 * half), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / H, h = i % H;
      const float* cs = table.data() + rel[t] * 2 * half;
      rotate(row(t, h), cs, cs + half, half);
    }
  });
  return Status::success();
}

}  // namespace kev::cpu
