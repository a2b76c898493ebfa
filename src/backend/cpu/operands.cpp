// Operand checks and strided-access helpers (see operands.h). Dtypes the CPU kernels lack are
// Unsupported; everything else that is wrong with an operand is an InvalidRequest.
#include "backend/cpu/operands.h"

#include <cstdlib>
#include <cstring>

namespace kev::cpu {

namespace {

std::string dims_of(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : shape) {
    s += (first ? "" : ",") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : "|") + std::string(dtype_name(d));
  return s;
}

Status check_common(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<DType> dtypes) {
  KEV_CHECK(present(c, t), ErrorCode::InvalidRequest, c.op, ": operand '", name, "' is missing");
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  KEV_CHECK(dtype_ok, ErrorCode::Unsupported, c.op, ": ", name, " is ", t.describe(), "; the ", c.backend, " kernel takes ",
            dtype_list(dtypes));
  for (int i = 0; i < t.rank; ++i) {
    KEV_CHECK(t.shape[i] >= 0 && t.stride[i] >= 0, ErrorCode::InvalidRequest, c.op, ": ", name, " ", t.describe(),
              " has a negative extent or stride in dim ", i);
  }
  KEV_CHECK(t.rank == 0 || t.stride[t.rank - 1] == 1 || t.shape[t.rank - 1] <= 1, ErrorCode::InvalidRequest, c.op, ": ",
            name, " ", t.describe(), " has innermost stride ", t.stride[t.rank - 1], "; it must be 1");
  if (!c.bound) return Status::success();
  KEV_CHECK(t.buffer != nullptr, ErrorCode::InvalidRequest, c.op, ": ", name, " has no buffer");
  const bool owned = c.owns ? c.owns(t.buffer) : dynamic_cast<const HostBuffer*>(t.buffer) != nullptr;
  KEV_CHECK(owned, ErrorCode::InvalidRequest, c.op, ": ", name, " lives in a buffer the ", c.backend,
            " backend did not allocate");
  KEV_CHECK(t.offset % dtype_size(t.dtype) == 0, ErrorCode::InvalidRequest, c.op, ": ", name, " offset ", t.offset,
            " is not a multiple of its element size ", dtype_size(t.dtype));
  const size_t size = t.buffer->size();
  const size_t span = t.span_bytes();
  KEV_CHECK(t.offset <= size && span <= size - t.offset, ErrorCode::InvalidRequest, c.op, ": ", name, " ", t.describe(),
            " at offset ", t.offset, " spans ", span, " bytes; its buffer has ", size);
  return Status::success();
}

}  // namespace

std::unique_ptr<HostBuffer> HostBuffer::create(size_t bytes) {
  constexpr size_t kAlign = 64;
  // aligned_alloc wants a multiple of the alignment; zero-byte buffers still get a distinct pointer.
  const size_t rounded = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded < bytes) return nullptr;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) return nullptr;
  return std::unique_ptr<HostBuffer>(new HostBuffer(p, bytes));
}

HostBuffer::~HostBuffer() { std::free(data_); }

bool present(const OpCheck& c, const Tensor& t) { return c.bound ? !t.empty() : (!t.empty() || t.rank > 0); }

Status check_tensor(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<DType> dtypes,
                    int rank) {
  KEV_TRY(check_common(c, name, t, dtypes));
  KEV_CHECK(t.rank == rank, ErrorCode::InvalidRequest, c.op, ": ", name, " is ", t.describe(), "; expected rank ",
            rank);
  return Status::success();
}

Status check_tensor_any_rank(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<DType> dtypes) {
  KEV_TRY(check_common(c, name, t, dtypes));
  KEV_CHECK(t.rank >= 1 && t.rank <= kMaxDims, ErrorCode::InvalidRequest, c.op, ": ", name, " is ", t.describe(),
            "; expected rank 1..", kMaxDims);
  return Status::success();
}

Status check_shape(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<int64_t> shape,
                   const char* dims) {
  bool same = t.rank == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) same = same && t.shape[i++] == d;
  KEV_CHECK(same, ErrorCode::InvalidRequest, c.op, ": ", name, " is ", t.describe(), ", expected ", dims_of(shape),
            " (", dims, ")");
  return Status::success();
}

Status check_same_shape(const OpCheck& c, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  bool same = t.rank == ref.rank;
  for (int i = 0; same && i < t.rank; ++i) same = t.shape[i] == ref.shape[i];
  KEV_CHECK(same, ErrorCode::InvalidRequest, c.op, ": ", name, " is ", t.describe(), " but ", ref_name, " is ",
            ref.describe(), "; shapes must match");
  return Status::success();
}

Status check_contiguous(const OpCheck& c, const char* name, const Tensor& t) {
  KEV_CHECK(t.is_contiguous(), ErrorCode::InvalidRequest, c.op, ": ", name, " ", t.describe(), " must be contiguous");
  return Status::success();
}

Status check_no_overlap(const OpCheck& c, const char* out_name, const Tensor& out, const char* in_name,
                        const Tensor& in) {
  if (!c.bound || out.empty() || in.empty() || out.buffer != in.buffer) return Status::success();
  const size_t a0 = out.offset, a1 = out.offset + out.span_bytes();
  const size_t b0 = in.offset, b1 = in.offset + in.span_bytes();
  KEV_CHECK(a1 <= b0 || b1 <= a0, ErrorCode::InvalidRequest, c.op, ": output ", out_name, " (bytes [", a0, ",", a1,
            ")) overlaps input ", in_name, " (bytes [", b0, ",", b1, ")); this op does not run in place");
  return Status::success();
}

Status check_same_or_disjoint(const OpCheck& c, const char* out_name, const Tensor& out, const char* in_name,
                              const Tensor& in) {
  if (out.same_view(in)) return Status::success();
  return check_no_overlap(c, out_name, out, in_name, in);
}

Status check_layout(const char* op, const SeqLayout& layout, int64_t n_tokens) {
  KEV_CHECK(!layout.offsets.empty() && layout.offsets.front() == 0, ErrorCode::InvalidRequest, op,
            ": SeqLayout offsets must start with 0");
  for (size_t r = 1; r < layout.offsets.size(); ++r) {
    KEV_CHECK(layout.offsets[r] >= layout.offsets[r - 1], ErrorCode::InvalidRequest, op,
              ": SeqLayout offsets decrease at sequence ", r - 1, " (", layout.offsets[r - 1], " -> ",
              layout.offsets[r], ")");
  }
  KEV_CHECK(layout.offsets.back() == n_tokens, ErrorCode::InvalidRequest, op, ": SeqLayout covers ",
            layout.offsets.back(), " tokens but the operands have ", n_tokens);
  KEV_CHECK(layout.pos0 >= 0, ErrorCode::InvalidRequest, op, ": SeqLayout pos0 is ", layout.pos0, "; it must be >= 0");
  return Status::success();
}

int64_t n_rows(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.rank; ++i) n *= t.shape[i];
  return n;
}

int64_t row_offset(const Tensor& t, int64_t r) {
  int64_t off = 0;
  for (int i = t.rank - 2; i >= 0; --i) {
    const int64_t idx = r % t.shape[i];
    r /= t.shape[i];
    off += idx * t.stride[i];
  }
  return off;
}

}  // namespace kev::cpu
