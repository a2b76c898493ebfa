// WebGpuBackend: creation, memory and transfers, supports(), and operand binding (see
// webgpu_backend.h for the contracts; the op entry points are in ops.cpp).
#include "backend/webgpu/webgpu_backend.h"

#include <algorithm>

#include "backend/cpu/ops.h"
#include "backend/webgpu/backend_impl.h"
#include "common/check.h"

namespace kev {

namespace webgpu {

namespace {

// Activation uploads up to this size go through the ordered ring; larger ones submit what is
// recorded and write straight to the queue (same order, one extra submit).
constexpr size_t kRingUploadLimit = size_t{4} << 20;

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

GpuBuffer* gpu_buffer(const Tensor& t) { return dynamic_cast<GpuBuffer*>(t.buffer); }

// Operands a split weight may be passed as (dispatched per piece): embedding's table, matmul's w.
bool splittable(OpKind op, size_t index) {
  return (op == OpKind::Embedding && index == 0) || (op == OpKind::Matmul && index == 1);
}

// A contiguous tensor in one of our buffers, `bytes` long (what upload / download / fill_zero take).
Status check_transfer(const char* what, const Tensor& t, size_t bytes, bool check_bytes) {
  const cpu::OpCheck c{what, false};
  KEV_TRY(cpu::check_tensor_any_rank(c, "tensor", t, {DType::F32, DType::BF16, DType::F16, DType::I32}));
  KEV_TRY(cpu::check_contiguous(c, "tensor", t));
  KEV_CHECK(gpu_buffer(t) != nullptr, ErrorCode::InvalidRequest, what,
            ": the tensor lives in a buffer the webgpu backend did not allocate");
  const size_t want = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
  KEV_CHECK(!check_bytes || bytes == want, ErrorCode::InvalidRequest, what, ": tensor ", t.describe(), " holds ", want,
            " bytes but ", bytes, " were given");
  KEV_CHECK(t.offset <= t.buffer->size() && want <= t.buffer->size() - t.offset, ErrorCode::InvalidRequest, what,
            ": tensor ", t.describe(), " at offset ", t.offset, " runs past its buffer of ", t.buffer->size(),
            " bytes");
  KEV_CHECK(t.offset % 4 == 0 && want % 4 == 0, ErrorCode::Unsupported, what, ": WebGPU transfers move whole 4-byte words; tensor ",
            t.describe(), " at byte offset ", t.offset, " (", want, " bytes) is not word-aligned");
  return Status::success();
}

// Calls fn(piece, offset in piece, offset in the range, length) for each piece overlapping
// [offset, offset + bytes) of `buf`.
template <class Fn>
Status for_each_piece(const GpuBuffer& buf, uint64_t offset, uint64_t bytes, Fn&& fn) {
  KEV_CHECK(!buf.pieces().empty(), ErrorCode::InvalidRequest,
            "webgpu: a split weight buffer is used before its upload chose the split");
  for (const GpuBuffer::Piece& p : buf.pieces()) {
    const uint64_t lo = std::max(offset, p.begin), hi = std::min(offset + bytes, p.begin + p.size);
    if (lo >= hi) continue;
    KEV_TRY(fn(p, lo - p.begin, lo - offset, hi - lo));
  }
  return Status::success();
}

}  // namespace

GpuBuffer::~GpuBuffer() {
  for (Piece& p : pieces_) {
    counters_->released(p.buffer);
    wgpuBufferRelease(p.buffer);
  }
}

// No cache: every buffer the backend holds is in use; allocations count the buffers created.
std::optional<DeviceMemory> WebGpuBackend::memory() const {
  if (!device_) return std::nullopt;
  const Device::BufferCounters& c = *device_->counters();
  return DeviceMemory{static_cast<size_t>(std::max<int64_t>(c.live_bytes.load(), 0)), 0, c.created.load()};
}

BackendInfo WebGpuBackend::info() const {
  BackendInfo bi;
  bi.name = "webgpu";
  bi.device = device_ ? device_->description() : "audit only (no adapter opened; WebGPU default limits)";
  bi.activation_dtype = DType::F32;
  bi.max_buffer_bytes = limits_.max_buffer;
  return bi;
}

Status WebGpuBackend::require_device(const char* what) const {
  KEV_CHECK(device_ != nullptr, ErrorCode::Unsupported, "webgpu: ", what,
            " needs a device; this backend was created with audit_only (supports() only)");
  return device_->check_alive();
}

Status WebGpuBackend::check_kernel_limits(const OpDesc& d) const {
  const char* op = op_name(d.op);
  for (size_t i = 0; i < d.operands.size(); ++i) {
    const Tensor& t = d.operands[i];
    if (t.empty() && t.rank == 0) continue;
    KEV_CHECK(t.dtype != DType::F16, ErrorCode::Unsupported, op, ": operand ", i, " is ", t.describe(),
              "; the WebGPU kernels take FP32 (F16 is not implemented)");
    const uint64_t es = dtype_size(t.dtype);
    if (splittable(d.op, i) && t.rank >= 2) {
      const uint64_t row = static_cast<uint64_t>(t.numel() / std::max<int64_t>(t.shape[0], 1)) * es;
      KEV_CHECK(row <= limits_.max_binding, ErrorCode::Unsupported, op, ": one row of ", t.describe(), " is ", row,
                " bytes; the storage binding limit is ", limits_.max_binding);
      continue;
    }
    KEV_CHECK(t.span_bytes() <= limits_.max_binding, ErrorCode::Unsupported, op, ": operand ", i, " ",
              t.describe(), " spans ", t.span_bytes(), " bytes; the storage binding limit is ", limits_.max_binding);
  }
  const std::vector<Tensor>& t = d.operands;
  switch (d.op) {
    case OpKind::GatedDeltaRule:
      KEV_CHECK(t.size() == 8 && t[0].rank == 3 && t[0].shape[2] <= 128, ErrorCode::Unsupported, op,
                ": the WebGPU kernel keeps a 128-row state slice in workgroup memory; key head size ",
                t.size() == 8 && t[0].rank == 3 ? t[0].shape[2] : -1, " > 128");
      break;
    case OpKind::Attention:
      KEV_CHECK(t.size() == 6 && t[0].rank == 3 && t[0].shape[2] <= 256, ErrorCode::Unsupported, op,
                ": the WebGPU kernel supports head sizes up to 256");
      break;
    case OpKind::Copy:
      KEV_CHECK(t.size() == 2 && (t[1].dtype != DType::BF16 || t[1].is_contiguous()), ErrorCode::Unsupported, op,
                ": a BF16 output must be contiguous on WebGPU (BF16 pairs share a 32-bit word)");
      break;
    default: break;
  }
  return Status::success();
}

bool WebGpuBackend::supports(const OpDesc& desc) const {
  return cpu::check_op_desc(cpu::OpCheck{op_name(desc.op), false}, desc) && check_kernel_limits(desc).ok();
}

Status WebGpuBackend::check_op(OpKind op, std::initializer_list<Tensor> operands) const {
  KEV_TRY(require_device(op_name(op)));
  return check_kernel_limits(OpDesc{op, std::vector<Tensor>(operands)});
}

// ---- memory -------------------------------------------------------------------------------------

Result<std::shared_ptr<Buffer>> WebGpuBackend::alloc(size_t bytes, BufferUsage usage) {
  KEV_TRY(require_device("alloc"));
  auto buf = std::make_shared<GpuBuffer>(bytes, usage, device_->counters());
  const uint64_t one_piece = std::min(limits_.max_binding, limits_.max_buffer);
  if (usage == BufferUsage::Weights && bytes > one_piece) return std::shared_ptr<Buffer>(buf);  // split at upload
  KEV_CHECK(bytes <= limits_.max_buffer, ErrorCode::Unsupported, "webgpu: a buffer of ", bytes,
            " bytes exceeds the device's maxBufferSize ", limits_.max_buffer);
  KEV_ASSIGN_OR_RETURN(WGPUBuffer b, device_->create_buffer(bytes, kStorageUsage, "kev tensor"));
  buf->pieces().push_back({b, 0, align_up(std::max<uint64_t>(bytes, 4), 4), 0});
  return std::shared_ptr<Buffer>(buf);
}

Status WebGpuBackend::upload(const Tensor& dst, const void* src, size_t bytes) {
  KEV_TRY(require_device("upload"));
  KEV_TRY(check_transfer("upload", dst, bytes, true));
  KEV_CHECK(src != nullptr || bytes == 0, ErrorCode::InvalidRequest, "upload: source pointer is null");
  if (bytes == 0) return Status::success();
  GpuBuffer& buf = *gpu_buffer(dst);
  if (buf.pieces().empty()) {
    // A weight above the binding limit: split on rows of this (whole-buffer) tensor.
    KEV_CHECK(dst.offset == 0 && bytes == buf.size() && dst.rank >= 2, ErrorCode::Unsupported,
              "webgpu: a weight of ", buf.size(), " bytes exceeds the storage binding limit ", limits_.max_binding,
              " and is split on rows at upload, which needs one upload of the whole tensor as [rows, ...] (got ",
              dst.describe(), " at offset ", dst.offset, ")");
    const uint64_t row = bytes / static_cast<uint64_t>(dst.shape[0]);
    const uint64_t cap = std::min(limits_.max_binding, limits_.max_buffer);
    KEV_CHECK(row > 0 && row <= cap && row % 4 == 0, ErrorCode::Unsupported, "webgpu: weight ", dst.describe(),
              " has rows of ", row, " bytes; a piece must hold whole 4-byte-aligned rows within ", cap, " bytes");
    const uint64_t rows_per_piece = cap / row;
    for (uint64_t begin = 0; begin < bytes; begin += rows_per_piece * row) {
      const uint64_t size = std::min<uint64_t>(rows_per_piece * row, bytes - begin);
      KEV_ASSIGN_OR_RETURN(WGPUBuffer b, device_->create_buffer(size, kStorageUsage, "kev weight piece"));
      buf.pieces().push_back({b, begin, size, row});
    }
  }
  const bool direct = buf.usage() == BufferUsage::Weights || bytes > kRingUploadLimit;
  return for_each_piece(buf, dst.offset, bytes, [&](const GpuBuffer::Piece& p, uint64_t at, uint64_t from, uint64_t n) {
    const char* data = static_cast<const char*>(src) + from;
    return direct ? device_->write_now(p.buffer, at, data, n) : device_->upload_ordered(p.buffer, at, data, n);
  });
}

Status WebGpuBackend::download(const Tensor& src, void* dst, size_t bytes) {
  KEV_TRY(require_device("download"));
  KEV_TRY(check_transfer("download", src, bytes, true));
  KEV_CHECK(dst != nullptr || bytes == 0, ErrorCode::InvalidRequest, "download: destination pointer is null");
  if (bytes == 0) return Status::success();
  return for_each_piece(*gpu_buffer(src), src.offset, bytes,
                        [&](const GpuBuffer::Piece& p, uint64_t at, uint64_t to, uint64_t n) {
                          return device_->read(p.buffer, at, n, static_cast<char*>(dst) + to);
                        });
}

Status WebGpuBackend::fill_zero(const Tensor& dst) {
  KEV_TRY(require_device("fill_zero"));
  KEV_TRY(check_transfer("fill_zero", dst, 0, false));
  return for_each_piece(*gpu_buffer(dst), dst.offset, dst.span_bytes(),
                        [&](const GpuBuffer::Piece& p, uint64_t at, uint64_t, uint64_t n) {
                          return device_->clear(p.buffer, at, n);
                        });
}

Status WebGpuBackend::synchronize() {
  KEV_TRY(require_device("synchronize"));
  return device_->flush();
}

// ---- binding ------------------------------------------------------------------------------------

Result<Bound> WebGpuBackend::bind(const char* op, const char* name, const Tensor& t, size_t slot) const {
  if (t.empty() || t.numel() == 0) return Bound{device_->dummy(slot), 0};
  const GpuBuffer* buf = gpu_buffer(t);
  KEV_CHECK(buf != nullptr, ErrorCode::InvalidRequest, op, ": ", name,
            " lives in a buffer the webgpu backend did not allocate");
  const uint64_t es = dtype_size(t.dtype), span = t.span_bytes();
  KEV_CHECK(t.offset % es == 0, ErrorCode::InvalidRequest, op, ": ", name, " offset ", t.offset,
            " is not a multiple of its element size ", es);
  KEV_CHECK(t.offset <= buf->size() && span <= buf->size() - t.offset, ErrorCode::InvalidRequest, op, ": ", name, " ",
            t.describe(), " at offset ", t.offset, " spans ", span, " bytes; its buffer has ", buf->size());
  KEV_CHECK(!buf->pieces().empty(), ErrorCode::InvalidRequest, op, ": ", name,
            " is a split weight buffer that was never uploaded");
  const GpuBuffer::Piece* piece = nullptr;
  for (const GpuBuffer::Piece& p : buf->pieces()) {
    if (t.offset >= p.begin && t.offset + span <= p.begin + p.size) piece = &p;
  }
  KEV_CHECK(piece != nullptr, ErrorCode::Unsupported, op, ": ", name, " ", t.describe(),
            " crosses the pieces of a weight split at the binding limit ", limits_.max_binding,
            "; only embedding tables and matmul weights are dispatched per piece");
  const uint64_t local = t.offset - piece->begin;
  const uint64_t base = align_down(local, std::max<uint64_t>(limits_.storage_align, 4));
  const uint64_t size = std::min(align_up(local + span - base, 4), piece->size - base);
  KEV_CHECK(size <= limits_.max_binding, ErrorCode::Unsupported, op, ": ", name, " ", t.describe(), " needs a ",
            size, "-byte binding; the storage binding limit is ", limits_.max_binding);
  return Bound{Binding{piece->buffer, base, size}, static_cast<uint32_t>((local - base) / es)};
}

Status WebGpuBackend::separate(const char* op, std::initializer_list<Bound*> inputs,
                               std::initializer_list<const Bound*> outputs) {
  auto overlap = [](const Binding& a, const Binding& b) {
    return a.buffer == b.buffer && a.offset < b.offset + b.size && b.offset < a.offset + a.size;
  };
  for (auto o1 = outputs.begin(); o1 != outputs.end(); ++o1) {
    for (auto o2 = o1 + 1; o2 != outputs.end(); ++o2) {
      KEV_CHECK(!overlap((*o1)->b, (*o2)->b), ErrorCode::InvalidRequest, op,
                ": two outputs share memory (bytes [", (*o1)->b.offset, ", +", (*o1)->b.size, ") and [",
                (*o2)->b.offset, ", +", (*o2)->b.size, "))");
    }
  }
  // Every binding is writable (see KernelSpec), so an input is copied aside when its range meets an
  // output's or an earlier input's.
  for (auto in = inputs.begin(); in != inputs.end(); ++in) {
    bool aliased = false;
    for (const Bound* o : outputs) aliased = aliased || overlap((*in)->b, o->b);
    for (auto earlier = inputs.begin(); earlier != in; ++earlier) aliased = aliased || overlap((*in)->b, (*earlier)->b);
    if (!aliased) continue;
    KEV_ASSIGN_OR_RETURN(Binding copy, device_->scratch((*in)->b.size));
    KEV_TRY(device_->copy((*in)->b, copy.buffer, copy.offset));
    copy.size = (*in)->b.size;
    (*in)->b = copy;
  }
  return Status::success();
}

Result<Binding> WebGpuBackend::stage_offsets(const SeqLayout& layout) {
  return device_->stage(layout.offsets.data(), layout.offsets.size() * sizeof(int32_t));
}

Status WebGpuBackend::dispatch(const char* op, const KernelSpec& k, const void* params, size_t bytes,
                               std::initializer_list<Binding> storage, uint64_t workgroups) {
  return device_->dispatch(op, k, params, bytes, std::span<const Binding>(storage.begin(), storage.size()),
                           workgroups);
}

}  // namespace webgpu

Result<std::shared_ptr<Backend>> create_webgpu_backend_for_test(const BackendOptions& options,
                                                                const WebGpuTestHooks& hooks) {
  if (options.audit_only) {
    webgpu::DeviceLimits limits = webgpu::spec_default_limits();
    if (hooks.max_binding_bytes > 0) limits.max_binding = std::min(limits.max_binding, hooks.max_binding_bytes);
    return std::shared_ptr<Backend>(std::make_shared<webgpu::WebGpuBackend>(nullptr, limits));
  }
  KEV_ASSIGN_OR_RETURN(std::unique_ptr<webgpu::Device> device,
                       webgpu::Device::open(options.adapter, hooks.max_binding_bytes, hooks.subgroups,
                                                            hooks.null_backend_only));
  const webgpu::DeviceLimits limits = device->limits();
  return std::shared_ptr<Backend>(std::make_shared<webgpu::WebGpuBackend>(std::move(device), limits));
}

Result<std::shared_ptr<Backend>> create_webgpu_backend_with_binding_limit(const BackendOptions& options,
                                                                          uint64_t max_binding_bytes) {
  return create_webgpu_backend_for_test(options, WebGpuTestHooks{max_binding_bytes, true});
}

Result<std::shared_ptr<Backend>> create_webgpu_backend(const BackendOptions& options) {
  return create_webgpu_backend_for_test(options, WebGpuTestHooks{});
}

}  // namespace kev
