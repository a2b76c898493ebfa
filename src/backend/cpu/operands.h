// Operand validation shared by CpuBackend::supports() and the ops themselves, plus the small
// strided-access helpers every kernel uses.
//
// One check function per op (declared in ops.h) is written against an OpCheck. For supports()
// (bound = false) tensors may not have buffers yet, so only dtypes, ranks, shapes and strides are
// checked; when the op is about to run (bound = true) every present operand must also live in a
// HostBuffer (not another backend's memory) that holds its whole span. Messages name the op, the
// operand and the mismatch, e.g. "gated_delta_rule: k is f32[12,16,64], expected [12,16,128] ([n,Hk,dk])".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "common/check.h"

namespace kev::cpu {

// Memory the CPU backend allocates: 64-byte aligned host memory; handle() is the host pointer.
class HostBuffer : public Buffer {
 public:
  // Null when the allocation fails.
  static std::unique_ptr<HostBuffer> create(size_t bytes);
  ~HostBuffer() override;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  size_t size() const override { return size_; }
  void* handle() const override { return data_; }

 private:
  HostBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

struct OpCheck {
  const char* op;
  bool bound;  // buffers attached: check presence and bounds too
  // Other backends reuse these checks for their shape rules: `backend` names the kernel in dtype
  // messages and `owns` (null: "is a HostBuffer") says whether a bound operand's buffer is theirs.
  const char* backend = "CPU";
  bool (*owns)(const Buffer* buffer) = nullptr;
};

// Whether an optional operand was given: a buffer when bound, else a buffer or a shape.
bool present(const OpCheck& c, const Tensor& t);

// Present, one of `dtypes`, rank `rank`, non-negative shape and strides, innermost stride 1, aligned
// and (when bound) inside its buffer.
Status check_tensor(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<DType> dtypes, int rank);
// Like check_tensor with any rank in [1, kMaxDims].
Status check_tensor_any_rank(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<DType> dtypes);
// Exact shape; `dims` names the dimensions for the message, e.g. "[n,Hk,dk]".
Status check_shape(const OpCheck& c, const char* name, const Tensor& t, std::initializer_list<int64_t> shape,
                   const char* dims);
Status check_same_shape(const OpCheck& c, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref);
Status check_contiguous(const OpCheck& c, const char* name, const Tensor& t);
// Outputs that the kernel cannot compute in place must not share bytes with an input (bound only).
Status check_no_overlap(const OpCheck& c, const char* out_name, const Tensor& out, const char* in_name,
                        const Tensor& in);
// Same as check_no_overlap unless `out` and `in` are the identical view (element-wise in place).
Status check_same_or_disjoint(const OpCheck& c, const char* out_name, const Tensor& out, const char* in_name,
                              const Tensor& in);
// offsets[0] == 0, non-decreasing, offsets.back() == n_tokens, pos0 >= 0.
Status check_layout(const char* op, const SeqLayout& layout, int64_t n_tokens);

// ---- strided access (bound tensors only) --------------------------------------------------------
template <class T>
T* data_ptr(const Tensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.buffer->handle()) + t.offset);
}
inline float* f32(const Tensor& t) { return data_ptr<float>(t); }
inline const int32_t* i32(const Tensor& t) { return data_ptr<const int32_t>(t); }

// Rows are all innermost vectors of a tensor, enumerated in row-major order of the outer dims.
int64_t n_rows(const Tensor& t);
// Element offset of row `r`.
int64_t row_offset(const Tensor& t, int64_t r);

}  // namespace kev::cpu
