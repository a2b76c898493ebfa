// Tensor views: element counts, contiguity, spans and the view constructors declared in tensor.h.
//
// The view helpers (contiguous, reshaped, slice, split_last) take sizes the caller computed from
// shapes it already checked; a violated precondition is a programming error, caught by assert in
// debug builds. Ops never trust a view: they validate every operand against its buffer.
#include "backend/tensor.h"

#include <cassert>
#include <sstream>

namespace kev {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
  }
  return "?";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    // A dimension of extent 1 is never stepped over, so its stride is irrelevant.
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

size_t Tensor::span_bytes() const {
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 0) return 0;
    last += (shape[i] - 1) * stride[i];
  }
  return static_cast<size_t>(last + 1) * dtype_size(dtype);
}

Tensor Tensor::contiguous(Buffer* buffer, size_t offset, DType dtype, std::initializer_list<int64_t> shape) {
  assert(shape.size() <= static_cast<size_t>(kMaxDims));
  Tensor t;
  t.buffer = buffer;
  t.offset = offset;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t step = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = step;
    step *= t.shape[d];
  }
  return t;
}

Tensor Tensor::reshaped(std::initializer_list<int64_t> new_shape) const {
  assert(is_contiguous());
  Tensor t = contiguous(buffer, offset, dtype, new_shape);
  assert(t.numel() == numel());
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t count) const {
  assert(d >= 0 && d < rank && begin >= 0 && count >= 0 && begin + count <= shape[d]);
  Tensor t = *this;
  t.offset += static_cast<size_t>(begin * stride[d]) * dtype_size(dtype);
  t.shape[d] = count;
  return t;
}

Tensor Tensor::split_last(int64_t n_outer) const {
  assert(rank >= 1 && rank < kMaxDims && n_outer > 0 && shape[rank - 1] % n_outer == 0);
  Tensor t = *this;
  const int64_t inner = shape[rank - 1] / n_outer;
  t.shape[rank - 1] = n_outer;
  t.stride[rank - 1] = inner;
  t.shape[rank] = inner;
  t.stride[rank] = 1;
  t.rank = rank + 1;
  return t;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < rank; ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  if (!is_contiguous()) {
    os << " strides [";
    for (int i = 0; i < rank; ++i) os << (i ? "," : "") << stride[i];
    os << "]";
  }
  return os.str();
}

}  // namespace kev
