// The Dawn runtime in one small wrapper: instance (TimedWaitAny), adapter choice, a device opened
// with the limits the kernels need, compute pipelines built from the embedded WGSL, and the
// recording model of one pass (recorded in order, submitted in pieces, waited for once).
//
//   KEV_ASSIGN_OR_RETURN(std::unique_ptr<Device> dev, Device::open("cpu", 0));
//   KEV_ASSIGN_OR_RETURN(WGPUBuffer b, dev->create_buffer(1024, kStorageUsage, "x"));
//   KEV_TRY(dev->dispatch("add", kAddKernel, &params, sizeof params, bindings, n_workgroups));
//   KEV_TRY(dev->read(b, 0, 1024, host));   // submits what is left, waits, maps
//
// Contracts:
// - Recording is in order. Dispatches go into one open compute pass of the current encoder (each
//   dispatch is its own usage scope, so Dawn orders them); copies and clears end it and are recorded
//   between passes, so the GPU sees exactly the op order. Recorded work is submitted in pieces as the
//   pass grows (after the first 8 dispatches, then every 64; queue order keeps the op order), so the
//   GPU starts while the host records; flush() (or read(), which flushes) submits the rest and waits.
// - stage() writes host data into a per-pass storage ring (each call at a fresh offset; the ring's new
//   bytes reach the GPU by one queue.writeBuffer per chunk just before the next submit) and returns a
//   binding to it (dispatch() puts params into a uniform ring alike); upload_ordered() stages and
//   records a copy into the destination, so the data lands where the upload sits in the op order. The
//   ring is reused only after flush() has waited for the pass.
// - scratch() hands out transient GPU-only storage for the op being recorded; begin_op() recycles it
//   (later commands run after earlier ones, so reuse across ops is safe).
// - Errors: pipeline creation runs inside error scopes (the Status names the kernel); validation and
//   out-of-memory errors raised while recording or running arrive through the uncaptured-error callback
//   and are returned, with the labels Dawn quotes (compute passes are labelled with the op), by the
//   next flush(); a lost device makes every later call fail. Every wait has a timeout.
// - KEV_WEBGPU_TRACE=ops: each dispatch runs in its own compute pass with timestamps at its start and
//   end (Dawn's timestamp quantization turned off), the first kTraceDispatches of a flush; the flush
//   resolves them with its last commands and, after its wait, prints their GPU times per op (kernel
//   entry and workgroup count) to stderr. The GPU then also waits between dispatches that one pass
//   would have let overlap, so a traced pass is slower than an untraced one.
// - KEV_WEBGPU_DUMP_SPIRV=<dir>: Dawn's `dump_shaders` toggle on; the SPIR-V it generates for each
//   pipeline is written to <dir>/<file>.<entry>.spvasm (kev_pipeline_stats reads them); what Dawn
//   generates for its own internal pipelines (e.g. the trace's timestamp conversion) to unlabelled-N.spvasm.
// - One Device is used from one thread at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <webgpu/webgpu.h>

#include "kev/result.h"

namespace kev::webgpu {

// What the kernels and the backend read from the device's limits.
struct DeviceLimits {
  uint64_t max_binding = 0;        // maxStorageBufferBindingSize
  uint64_t max_buffer = 0;         // maxBufferSize
  uint32_t workgroup_storage = 0;  // maxComputeWorkgroupStorageSize
  uint32_t invocations = 0;        // maxComputeInvocationsPerWorkgroup
  uint32_t storage_buffers = 0;    // maxStorageBuffersPerShaderStage
  uint32_t workgroups_per_dim = 0; // maxComputeWorkgroupsPerDimension
  uint32_t storage_align = 0;      // minStorageBufferOffsetAlignment
  uint32_t uniform_align = 0;      // minUniformBufferOffsetAlignment
};

// The WebGPU specification's default limits: what every adapter offers (audit_only answers with them).
DeviceLimits spec_default_limits();

// The smallest limits the kernels are written for; open() refuses an adapter below them.
constexpr uint32_t kNeedWorkgroupStorage = 16384;
constexpr uint32_t kNeedInvocations = 256;
constexpr uint32_t kNeedStorageBuffers = 8;

// Storage bindings of the widest kernel; dummy() has one distinct range per slot.
constexpr size_t kMaxStorageSlots = 8;

// A kernel: an entry point of an embedded WGSL file (prelude.wgsl and one of the reduction helpers
// are prepended to every file: reduce_subgroups.wgsl, under `enable subgroups;`, on a device whose
// subgroups passed the layout check, else reduce_workgroup.wgsl). Binding 0 is the params uniform;
// bindings 1..n_storage are storage buffers, all declared read_write: WebGPU forbids a buffer used
// both read-only and writable in one dispatch, and the activation arena is one buffer, so inputs and
// outputs of an op are disjoint ranges of the same buffer (Dawn checks writable bindings for overlap
// by range).
struct KernelSpec {
  const char* file;     // WGSL file stem, e.g. "norms"
  const char* entry;    // entry point
  uint32_t n_storage;   // storage bindings 1..n_storage
};

// A storage binding: a byte range of one GPU buffer.
struct Binding {
  WGPUBuffer buffer = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
};

constexpr WGPUBufferUsage kStorageUsage =
    WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst;

class Device {
 public:
  // Opens the adapter chosen by `adapter` (empty: the default high-performance adapter; "discrete",
  // "integrated", "cpu": the first of that type; anything else: a case-insensitive substring of the
  // adapter's name, vendor or driver description). `max_binding_override` > 0 lowers the storage
  // binding limit the backend plans with (tests use it to exercise split weights); `use_subgroups`
  // false keeps the kernels on their workgroup-memory reductions even where subgroups work (tests
  // run both variants); `null_backend_only` asks Dawn for its Null backend alone, which open() refuses
  // (tests check that refusal, which a machine without a Vulkan loader meets).
  static Result<std::unique_ptr<Device>> open(const std::string& adapter, uint64_t max_binding_override,
                                               bool use_subgroups = true, bool null_backend_only = false);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceLimits& limits() const { return limits_; }
  // "llvmpipe (LLVM 19.1.7, 256 bits), Vulkan, Mesa 25.0.7 (driver: ...), binding 128 MiB, ..."
  const std::string& description() const { return description_; }
  // Whether the kernels are built with subgroup reductions (see open() and check_subgroups()).
  bool has_subgroups() const { return has_subgroups_; }

  Result<WGPUBuffer> create_buffer(uint64_t size, WGPUBufferUsage usage, const char* label);
  // Releases a buffer made by create_buffer and takes its bytes off the counters.
  void release_buffer(WGPUBuffer b);
  // Buffers created so far and the bytes of those not yet released; shared with the buffers the
  // backend hands out, whose release may come after the backend's.
  struct BufferCounters {
    std::atomic<uint64_t> created{0};
    std::atomic<int64_t> live_bytes{0};
    void released(WGPUBuffer b) { live_bytes -= static_cast<int64_t>(wgpuBufferGetSize(b)); }
  };
  const std::shared_ptr<BufferCounters>& counters() const { return counters_; }
  // A small range bound for an absent operand in storage slot `slot` (distinct per slot, so two
  // absent writable operands never alias).
  Binding dummy(size_t slot) const;

  // ---- recording ----------------------------------------------------------------------------------
  void begin_op();
  // Records one dispatch of `kernel` with `params` (a 16-byte multiple) over `workgroups` workgroups,
  // folded into a 2-D grid when above the per-dimension limit; kernels recover the linear index as
  // wid.x + wid.y * nwg.x and ignore indices >= their count.
  Status dispatch(const char* op, const KernelSpec& kernel, const void* params, size_t params_bytes,
                  std::span<const Binding> storage, uint64_t workgroups);
  Status copy(const Binding& src, WGPUBuffer dst, uint64_t dst_offset);
  Status clear(WGPUBuffer dst, uint64_t offset, uint64_t size);
  Result<Binding> stage(const void* data, size_t bytes);
  Status upload_ordered(WGPUBuffer dst, uint64_t offset, const void* data, size_t bytes);
  // Submits what is recorded, then writes straight into `dst` (bulk weight uploads).
  Status write_now(WGPUBuffer dst, uint64_t offset, const void* data, size_t bytes);
  Result<Binding> scratch(uint64_t bytes);

  // Finishes the encoder, submits once and waits for the queue; returns errors raised meanwhile.
  Status flush();
  // Flushes so far: a stage() binding stays valid while this count is unchanged.
  uint64_t flushes() const { return flushes_; }
  // Copies [offset, offset+bytes) of `src` to the host (flushes first).
  Status read(WGPUBuffer src, uint64_t offset, uint64_t bytes, void* dst);
  Status check_alive() const;

 private:
  Device() = default;
  struct Pipeline {
    WGPUComputePipeline pipeline = nullptr;
    WGPUBindGroupLayout layout = nullptr;
  };
  struct RingChunk {
    WGPUBuffer buffer = nullptr;
    uint64_t size = 0;
    std::vector<uint8_t> host;  // what this pass put, written to `buffer` by submit()
    uint64_t dirty = 0;         // bytes of `host` put so far in this pass
    uint64_t written = 0;       // ... of which submit() has written to `buffer`
  };
  Result<const Pipeline*> pipeline(const KernelSpec& kernel);
  // "" when `code` compiles as a shader module on this device (the WGSL extensions it enables), else
  // the first line of Dawn's message, which the description quotes.
  Result<std::string> compile_error(const std::string& code);
  // Runs subgroup_check.wgsl: "" when every subgroup of a 256-invocation workgroup is full and holds
  // 8 to 64 consecutive invocation indices (what reduce_subgroups.wgsl assumes; WGSL leaves the mapping
  // to the implementation), else why not.
  Result<std::string> check_subgroups();
  Result<WGPUBindGroupLayout> layout_for(uint32_t n_storage);
  Status ensure_encoder();
  // Writes the rings' new bytes and submits what is recorded, without waiting.
  Status submit();
  void end_pass();
  Status wait(WGPUFuture future, const char* what);
  // KEV_WEBGPU_TRACE=ops (contracts above): the query set and buffers, or why there are none.
  Status open_trace();
  // Prints the timed dispatches of the flush that has just waited, and forgets them.
  Status report_trace();
  // Maps [0, mapped_bytes) of a MapRead buffer (`what` names it in errors), copies `bytes` from byte
  // `from` to dst, and unmaps it.
  Status copy_mapped(WGPUBuffer b, uint64_t mapped_bytes, uint64_t from, uint64_t bytes, void* dst,
                     const char* what);
  Status take_error(const char* during);

  static void on_uncaptured_error(WGPUDevice const* device, WGPUErrorType type, WGPUStringView message, void* self,
                                  void*);
  // KEV_WEBGPU_DUMP_SPIRV: files each SPIR-V disassembly Dawn logs as <dir>/<file>.<entry>.spvasm,
  // named by the pipeline being created (the log arrives inside its creation call).
  static void on_log(WGPULoggingType type, WGPUStringView message, void* self, void*);
  static void on_device_lost(WGPUDevice const* device, WGPUDeviceLostReason reason, WGPUStringView message,
                             void* self, void*);

  WGPUInstance instance_ = nullptr;
  WGPUAdapter adapter_ = nullptr;
  WGPUDevice device_ = nullptr;
  WGPUQueue queue_ = nullptr;
  DeviceLimits limits_;
  std::string description_;
  bool has_subgroups_ = false;
  WGPUBuffer dummy_ = nullptr;

  std::map<std::string, Pipeline> pipelines_;
  std::string dump_dir_;        // KEV_WEBGPU_DUMP_SPIRV, or empty
  std::string compiling_;       // "<file>.<entry>" while its pipeline is being created
  int unlabelled_dumps_ = 0;    // dumps that arrived outside a pipeline creation
  std::map<uint32_t, WGPUBindGroupLayout> layouts_;

  WGPUCommandEncoder encoder_ = nullptr;
  WGPUComputePassEncoder pass_ = nullptr;
  bool recorded_ = false;
  uint64_t flushes_ = 0;
  uint32_t submits_ = 0;      // submits since the last flush
  uint32_t unsubmitted_ = 0;  // dispatches recorded since the last submit

  // Two rings: uniforms for params, storage for staged data (a buffer may not be a uniform and a
  // writable storage binding of one dispatch).
  struct Ring {
    std::vector<RingChunk> chunks;
    size_t chunk = 0;
    uint64_t used = 0;
  };
  Result<Binding> put(Ring& ring, WGPUBufferUsage usage, const void* data, size_t bytes);
  Ring params_ring_, data_ring_;

  WGPUBuffer scratch_ = nullptr;
  uint64_t scratch_size_ = 0;
  uint64_t scratch_used_ = 0;
  std::shared_ptr<BufferCounters> counters_ = std::make_shared<BufferCounters>();
  std::vector<WGPUBuffer> retired_;  // replaced scratch buffers, released after the next flush

  WGPUBuffer readback_ = nullptr;
  uint64_t readback_size_ = 0;

  static constexpr uint32_t kTraceDispatches = 2048;  // a query set holds at most 4,096 timestamps
  struct DispatchTrace {
    WGPUQuerySet queries = nullptr;
    WGPUBuffer resolved = nullptr;    // QueryResolve | CopySrc
    WGPUBuffer host = nullptr;        // MapRead | CopyDst
    std::vector<std::string> labels;  // of the timed dispatches since the last flush
    uint64_t untimed = 0;             // dispatches past kTraceDispatches since the last flush
    uint64_t passes = 0;              // flushes reported
  };
  std::unique_ptr<DispatchTrace> trace_;

  mutable std::mutex error_mutex_;
  std::string error_;  // first uncaptured error since the last flush
  bool lost_ = false;
  std::string lost_message_;
};

}  // namespace kev::webgpu
