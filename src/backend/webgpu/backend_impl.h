// WebGpuBackend's declaration, shared by webgpu_backend.cpp (memory, transfers, supports(), operand
// binding) and ops.cpp (the op entry points: validation, params, dispatch).
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/webgpu/device.h"
#include "backend/webgpu/webgpu_backend.h"

namespace kev::webgpu {

// Backend memory: one GPU buffer, or for a Weights tensor above the binding limit several, each
// holding whole rows of the tensor (chosen at upload, when the shape is known).
class GpuBuffer final : public Buffer {
 public:
  struct Piece {
    WGPUBuffer buffer = nullptr;
    uint64_t begin = 0;  // byte range [begin, begin + size) of the logical buffer
    uint64_t size = 0;
    uint64_t row_bytes = 0;  // split weights: bytes per row (pieces start on row boundaries); 0 otherwise
  };
  GpuBuffer(size_t size, BufferUsage usage, std::shared_ptr<Device::BufferCounters> counters)
      : size_(size), usage_(usage), counters_(std::move(counters)) {}
  ~GpuBuffer() override;
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  size_t size() const override { return size_; }
  void* handle() const override { return pieces_.empty() ? nullptr : pieces_.front().buffer; }

  BufferUsage usage() const { return usage_; }
  std::vector<Piece>& pieces() { return pieces_; }
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  size_t size_;
  BufferUsage usage_;
  std::vector<Piece> pieces_;  // empty: a split weight not uploaded yet
  std::shared_ptr<Device::BufferCounters> counters_;
};

// A tensor bound for a kernel: the binding (a range starting at a storage-aligned offset) and the
// tensor's first element counted from the binding start, in elements of its dtype.
struct Bound {
  Binding b;
  uint32_t off = 0;
};

class WebGpuBackend final : public Backend {
 public:
  // device null: audit-only (supports() under `limits`).
  WebGpuBackend(std::unique_ptr<Device> device, DeviceLimits limits) : device_(std::move(device)), limits_(limits) {}

  BackendInfo info() const override;
  bool supports(const OpDesc& desc) const override;

  Result<std::shared_ptr<Buffer>> alloc(size_t bytes, BufferUsage usage) override;
  Status upload(const Tensor& dst, const void* src, size_t bytes) override;
  Status download(const Tensor& src, void* dst, size_t bytes) override;
  Status fill_zero(const Tensor& dst) override;
  Status synchronize() override;
  std::optional<DeviceMemory> memory() const override;

  Status embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  Status add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) override;
  Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;
  Status causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in, const SeqLayout& layout,
                            const Tensor& out, const Tensor& state_out) override;
  Status gdn_gates(const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias, const Tensor& beta,
                   const Tensor& g) override;
  Status l2_norm(const Tensor& x, float eps, float scale, const Tensor& out) override;
  Status gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state_in, const SeqLayout& layout, const Tensor& out,
                          const Tensor& state_out) override;
  Status rms_norm_gated(const Tensor& o, const Tensor& z, const Tensor& w, float eps, const Tensor& out) override;
  Status rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) override;
  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k, const Tensor& prefix_v,
                   const SeqLayout& layout, float scale, const Tensor& out) override;
  Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override;
  Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  Status add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  Status gather_rows(const Tensor& x, const Tensor& idx, const Tensor& out) override;
  Status pointer_logits(const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                        const Tensor& out) override;
  Status copy(const Tensor& x, const Tensor& out) override;

 private:
  // supports() beyond the CPU operand rules: dtypes, binding sizes, kernel size bounds.
  Status check_kernel_limits(const OpDesc& desc) const;
  // Both checks for an op about to run (shapes only; buffers are checked by bind()).
  Status check_op(OpKind op, std::initializer_list<Tensor> operands) const;
  Status require_device(const char* what) const;

  // Binds a present tensor of one of our buffers (one piece; the whole span within one binding), or
  // the dummy of `slot` for an absent or empty one.
  Result<Bound> bind(const char* op, const char* name, const Tensor& t, size_t slot) const;
  // Inputs whose binding overlaps an output's are copied into scratch first (WebGPU rejects a
  // writable binding that aliases another binding of the dispatch); outputs must not overlap.
  Status separate(const char* op, std::initializer_list<Bound*> inputs, std::initializer_list<const Bound*> outputs);
  // Stages the sequence starts of `layout` (R+1 I32) for kernels that look tokens up.
  Result<Binding> stage_offsets(const SeqLayout& layout);
  // sigmoid_mul / swiglu / add: out = f(x, y) element-wise.
  Status binary(const char* op, const KernelSpec& k, const Tensor& x, const Tensor& y, const Tensor& out);
  Status dispatch(const char* op, const KernelSpec& k, const void* params, size_t bytes,
                  std::initializer_list<Binding> storage, uint64_t workgroups);

  std::unique_ptr<Device> device_;
  DeviceLimits limits_;
  // The last rope cos/sin table: its values, kept across passes (computing them in double costs
  // ~0.6 ms at 2,187 positions, with the GPU waiting for the pass), and where it was staged, reused by
  // the pass's other rope calls (every attention layer's q and k share the layout) while
  // device_->flushes() equals `flushes`.
  struct RopeTable {
    int64_t pos0 = 0, max_len = 0, n_rot = 0;
    double theta = 0;
    std::vector<float> values;
    uint64_t flushes = 0;
    Binding binding;
  };
  std::optional<RopeTable> rope_table_;
};

}  // namespace kev::webgpu
