// Tensors as the backend interface sees them: a strided view into a backend-owned buffer.
//
// Convention (docs/architecture.md): shapes are listed outermost first, as in PyTorch, e.g. [n_tokens,
// n_embd]. `stride` is in elements per dimension. The innermost dimension is always contiguous
// (stride 1); outer strides may skip (a column slice of a wider matrix is a view, not a copy).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace kev {

enum class DType : uint8_t { F32, BF16, F16, I32 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);

// Backend memory. What `handle` points to is the backend's business (host pointer, CUDA pointer,
// WGPUBuffer); only that backend interprets it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t size() const = 0;
  virtual void* handle() const = 0;
};

constexpr int kMaxDims = 4;

struct Tensor {
  Buffer* buffer = nullptr;
  size_t offset = 0;  // bytes from the buffer's start
  DType dtype = DType::F32;
  int rank = 0;
  std::array<int64_t, kMaxDims> shape{};   // outermost first
  std::array<int64_t, kMaxDims> stride{};  // elements; stride[rank-1] == 1

  bool empty() const { return buffer == nullptr; }
  // The identical view: the same bytes seen with the same dtype, shape and strides.
  bool same_view(const Tensor& o) const {
    return buffer == o.buffer && offset == o.offset && dtype == o.dtype && rank == o.rank && shape == o.shape &&
           stride == o.stride;
  }
  int64_t dim(int i) const { return shape[i < 0 ? rank + i : i]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Bytes spanned from the first to one past the last element (what must fit in the buffer).
  size_t span_bytes() const;

  // A contiguous tensor over `buffer` at `offset`.
  static Tensor contiguous(Buffer* buffer, size_t offset, DType dtype, std::initializer_list<int64_t> shape);
  // Same elements, new contiguous shape (requires is_contiguous()).
  Tensor reshaped(std::initializer_list<int64_t> shape) const;
  // Elements [begin, begin+count) along dimension `d` (a view).
  Tensor slice(int d, int64_t begin, int64_t count) const;
  // Splits the innermost dimension into [n_outer, inner/n_outer] (a view; works on slices too).
  Tensor split_last(int64_t n_outer) const;
  // "f32[12,8,256]" (strides shown when not contiguous).
  std::string describe() const;
};

}  // namespace kev
