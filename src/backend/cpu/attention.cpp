// Causal grouped-query attention over a read-only prefix K/V plus each sequence's own K/V.
//
//   out[t,j,:] = Σ_s softmax_s(scale · q[t,j]·key_s) value_s, query head j reading KV head
//   j / (H/Hkv); the keys of token t (relative index τ in its sequence) are the Ls prefix keys
//   (layout.from_prefix) followed by its sequence's own keys at relative index <= τ.
//
// Layouts: q, out [n,H,hd]; k, v [n,Hkv,hd]; prefix_k, prefix_v [Ls,Hkv,hd] or empty. All views may
// have free outer strides (q is the query half of a [n,H,2·hd] projection) but rows must not overlap.
// FAST: one task per (sequence, KV head, query tile), dynamically scheduled over the pool. A task
// stacks the queries of the H/Hkv heads sharing its KV head (at most 64 rows), computes their scores
// [rows, Ls + τ_end] with two cblas_sgemm (prefix keys, own keys), masks the causal part, takes an FP32
// softmax with max subtraction, multiplies by the values with two more sgemm and scatters the rows to
// out. Stacking the group reads each K/V row once per group and makes the GEMMs taller, which is what
// matters for many short rows over a long prefix. BLAS is single-threaded inside (BlasSingleThreaded).
// REFERENCE: per (token, head) the textbook softmax in double.
// Dtypes: F32. Preconditions (supports() mirrors the static ones): Hkv >= 1 divides H, prefix_k and
// prefix_v both given or both empty with equal shapes, out disjoint from every input, sizes within the
// BLAS integer range. Bound: prefix K/V present when layout.from_prefix.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/blas.h"
#include "backend/cpu/ops.h"

namespace kev::cpu {

namespace {

constexpr int64_t kQueryRows = 64;

// A [rows, hd] head slice of a [rows, heads, hd] view: its base pointer and BLAS leading dimension.
struct HeadView {
  const float* p;
  int64_t ld;
};

HeadView head_view(const Tensor& t, int64_t row0, int64_t head) {
  const int64_t ld = t.shape[0] > 1 ? t.stride[0] : std::max<int64_t>(t.shape[2], 1);
  return {f32(t) + row0 * t.stride[0] + head * t.stride[1], ld};
}

struct AttnArgs {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const Tensor* pk;  // null when the pass has no prefix
  const Tensor* pv;
  const Tensor& out;
  float scale;
  int64_t H, Hkv, hd, Ls;
};

void reference_attention(const AttnArgs& a, const SeqLayout& layout) {
  const int64_t group = a.H / a.Hkv, hd = a.hd;
  std::vector<double> scores;
  std::vector<double> acc(hd);
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    const int64_t begin = layout.offsets[r], len = layout.offsets[r + 1] - begin;
    for (int64_t tau = 0; tau < len; ++tau) {
      for (int64_t h = 0; h < a.H; ++h) {
        const int64_t kvh = h / group;
        const float* q = f32(a.q) + (begin + tau) * a.q.stride[0] + h * a.q.stride[1];
        // Keys s < Ls are the prefix's, s >= Ls the sequence's own (relative index s - Ls).
        auto key = [&](int64_t s, bool value) {
          if (s < a.Ls) {
            const Tensor& t = value ? *a.pv : *a.pk;
            return f32(t) + s * t.stride[0] + kvh * t.stride[1];
          }
          const Tensor& t = value ? a.v : a.k;
          return f32(t) + (begin + s - a.Ls) * t.stride[0] + kvh * t.stride[1];
        };
        const int64_t n_keys = a.Ls + tau + 1;
        scores.assign(n_keys, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < n_keys; ++s) {
          const float* kr = key(s, false);
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(q[i]) * kr[i];
          scores[s] = dot * a.scale;
          mx = std::max(mx, scores[s]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s < n_keys; ++s) {
          const double w = std::exp(scores[s] - mx);
          sum += w;
          const float* vr = key(s, true);
          for (int64_t i = 0; i < hd; ++i) acc[i] += w * vr[i];
        }
        float* o = f32(a.out) + (begin + tau) * a.out.stride[0] + h * a.out.stride[1];
        for (int64_t i = 0; i < hd; ++i) o[i] = static_cast<float>(acc[i] / sum);
      }
    }
  }
}

struct Task {
  int64_t seq_begin, kvh, i0, i1;  // KV head kvh; queries [i0, i1) relative to the sequence start
};

// The G = H/Hkv query heads sharing KV head kvh are stacked into one [G·rows, hd] matrix (row g·rows + r
// is head kvh·G + g at query i0 + r), so each key and value row is read once per group and the GEMMs
// are G times taller.
void fast_task(const AttnArgs& a, const Task& task, std::vector<float>& scratch) {
  const int64_t G = a.H / a.Hkv, rows = task.i1 - task.i0, m = G * rows, own = task.i1, ld = a.Ls + own;
  const int64_t hd = a.hd;
  const int im = static_cast<int>(m), ihd = static_cast<int>(hd), ild = static_cast<int>(ld);
  scratch.resize(m * (2 * hd + ld));
  float* Q = scratch.data();
  float* O = Q + m * hd;
  float* sc = O + m * hd;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = f32(a.q) + (task.seq_begin + task.i0 + r) * a.q.stride[0] + (task.kvh * G + g) * a.q.stride[1];
      std::copy(src, src + hd, Q + (g * rows + r) * hd);
    }
  }
  const HeadView k = head_view(a.k, task.seq_begin, task.kvh);
  const HeadView v = head_view(a.v, task.seq_begin, task.kvh);
  if (a.Ls > 0) {
    const HeadView pk = head_view(*a.pk, 0, task.kvh);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, static_cast<int>(a.Ls), ihd, a.scale, Q, ihd, pk.p,
                static_cast<int>(pk.ld), 0.0f, sc, ild);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, static_cast<int>(own), ihd, a.scale, Q, ihd, k.p,
              static_cast<int>(k.ld), 0.0f, sc + a.Ls, ild);
  for (int64_t row = 0; row < m; ++row) {
    float* s = sc + row * ld;
    const int64_t valid = a.Ls + task.i0 + row % rows + 1;  // causal: own keys up to this query
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < valid; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
    std::fill(s + valid, s + ld, 0.0f);
  }
  float beta = 0.0f;
  if (a.Ls > 0) {
    const HeadView pv = head_view(*a.pv, 0, task.kvh);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, ihd, static_cast<int>(a.Ls), 1.0f, sc, ild, pv.p,
                static_cast<int>(pv.ld), 0.0f, O, ihd);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, ihd, static_cast<int>(own), 1.0f, sc + a.Ls, ild, v.p,
              static_cast<int>(v.ld), beta, O, ihd);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = f32(a.out) + (task.seq_begin + task.i0 + r) * a.out.stride[0] + (task.kvh * G + g) * a.out.stride[1];
      std::copy(O + (g * rows + r) * hd, O + (g * rows + r + 1) * hd, dst);
    }
  }
}

Status check_rows(const OpCheck& c, const char* name, const Tensor& t) {
  KEV_CHECK(t.shape[0] <= 1 || t.stride[0] >= t.shape[2], ErrorCode::InvalidRequest, c.op, ": ", name, " ",
            t.describe(), " has overlapping rows");
  KEV_CHECK(fits_blas_int(t.stride[0]) && fits_blas_int(t.shape[0]), ErrorCode::Unsupported, c.op, ": ", name, " ",
            t.describe(), " exceeds the BLAS integer range");
  return Status::success();
}

}  // namespace

Status check_attention(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                       const Tensor& prefix_v, const Tensor& out) {
  KEV_TRY(check_tensor(c, "q", q, {DType::F32}, 3));
  const int64_t n = q.shape[0], H = q.shape[1], hd = q.shape[2];
  KEV_TRY(check_tensor(c, "k", k, {DType::F32}, 3));
  const int64_t Hkv = k.shape[1];
  KEV_TRY(check_shape(c, "k", k, {n, Hkv, hd}, "[n,Hkv,hd]"));
  KEV_TRY(check_tensor(c, "v", v, {DType::F32}, 3));
  KEV_TRY(check_shape(c, "v", v, {n, Hkv, hd}, "[n,Hkv,hd]"));
  KEV_CHECK(Hkv >= 1 && H % Hkv == 0, ErrorCode::InvalidRequest, c.op, ": query heads H = ", H,
            " must be a multiple of KV heads Hkv = ", Hkv);
  KEV_CHECK(hd >= 1, ErrorCode::InvalidRequest, c.op, ": head size is 0 (q ", q.describe(), ")");
  KEV_TRY(check_tensor(c, "out", out, {DType::F32}, 3));
  KEV_TRY(check_shape(c, "out", out, {n, H, hd}, "[n,H,hd]"));
  KEV_CHECK(present(c, prefix_k) == present(c, prefix_v), ErrorCode::InvalidRequest, c.op,
            ": prefix_k and prefix_v must both be given or both be empty");
  const Tensor* inputs[] = {&q, &k, &v, &prefix_k, &prefix_v};
  const char* names[] = {"q", "k", "v", "prefix_k", "prefix_v"};
  if (present(c, prefix_k)) {
    KEV_TRY(check_tensor(c, "prefix_k", prefix_k, {DType::F32}, 3));
    KEV_TRY(check_shape(c, "prefix_k", prefix_k, {prefix_k.shape[0], Hkv, hd}, "[Ls,Hkv,hd]"));
    KEV_TRY(check_tensor(c, "prefix_v", prefix_v, {DType::F32}, 3));
    KEV_TRY(check_same_shape(c, "prefix_v", prefix_v, "prefix_k", prefix_k));
    KEV_TRY(check_rows(c, "prefix_k", prefix_k));
    KEV_TRY(check_rows(c, "prefix_v", prefix_v));
  }
  for (int i = 0; i < 3; ++i) KEV_TRY(check_rows(c, names[i], *inputs[i]));
  KEV_TRY(check_rows(c, "out", out));
  for (int i = 0; i < 5; ++i) KEV_TRY(check_no_overlap(c, "out", out, names[i], *inputs[i]));
  return Status::success();
}

Status attention(const Exec& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                 const Tensor& prefix_v, const SeqLayout& layout, float scale, const Tensor& out) {
  constexpr const char* kOp = "attention";
  KEV_TRY(check_attention({kOp, true}, q, k, v, prefix_k, prefix_v, out));
  KEV_TRY(check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !prefix_k.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but prefix_k / prefix_v are empty");
  const bool use_prefix = layout.from_prefix && prefix_k.shape[0] > 0;
  const AttnArgs a{q,
                   k,
                   v,
                   use_prefix ? &prefix_k : nullptr,
                   use_prefix ? &prefix_v : nullptr,
                   out,
                   scale,
                   q.shape[1],
                   k.shape[1],
                   q.shape[2],
                   use_prefix ? prefix_k.shape[0] : 0};
  KEV_CHECK(fits_blas_int(a.Ls + q.shape[0]), ErrorCode::Unsupported, kOp, ": ", a.Ls, " prefix keys + ", q.shape[0],
            " tokens exceed the BLAS integer range");
  if (e.reference) {
    reference_attention(a, layout);
    return Status::success();
  }
  // Query tiles of kQueryRows stacked rows (all heads of a KV group) bound the score scratch per task.
  const int64_t tile = std::max<int64_t>(1, kQueryRows / (a.H / a.Hkv));
  std::vector<Task> tasks;
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    const int64_t len = layout.offsets[r + 1] - layout.offsets[r];
    for (int64_t kvh = 0; kvh < a.Hkv; ++kvh) {
      for (int64_t i0 = 0; i0 < len; i0 += tile) {
        tasks.push_back({layout.offsets[r], kvh, i0, std::min(i0 + tile, len)});
      }
    }
  }
  BlasSingleThreaded single;
  e.pool.parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i) fast_task(a, tasks[i], scratch);
  });
  return Status::success();
}

}  // namespace kev::cpu
