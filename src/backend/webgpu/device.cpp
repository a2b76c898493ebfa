// Device: the Dawn wrapper (see device.h).
#include "backend/webgpu/device.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "backend/op_time_table.h"
#include "backend/webgpu/shaders.h"
#include "common/check.h"

namespace kev::webgpu {

const char* find_wgsl(std::string_view name) {
  for (size_t i = 0; i < kWgslSourceCount; ++i) {
    if (name == kWgslSources[i].name) return kWgslSources[i].code;
  }
  return nullptr;
}

namespace {

// A pass on a CPU adapter (lavapipe) of the 0.8B model can take minutes; a GPU never comes close.
constexpr uint64_t kWaitTimeoutNs = uint64_t{900} * 1000 * 1000 * 1000;
constexpr uint64_t kRingChunkBytes = uint64_t{4} << 20;
constexpr uint64_t kMinScratchBytes = uint64_t{1} << 20;
// A pass's recorded work goes to the GPU in pieces while the host still records the rest, so the
// GPU idles only while the first kFirstSubmit dispatches are recorded (instead of all of a pass's
// several hundred, a few µs of host time each); after that, pieces of kSubmitEvery keep work queued
// ahead of the GPU (each submit costs the host tens of µs).
constexpr uint32_t kFirstSubmit = 8;
constexpr uint32_t kSubmitEvery = 64;

WGPUStringView sv(const char* s) { return WGPUStringView{s, WGPU_STRLEN}; }
WGPUStringView sv(const std::string& s) { return WGPUStringView{s.data(), s.size()}; }
std::string str(WGPUStringView v) {
  if (!v.data) return {};
  return v.length == WGPU_STRLEN ? std::string(v.data) : std::string(v.data, v.length);
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* backend_name(WGPUBackendType t) {
  switch (t) {
    case WGPUBackendType_Vulkan: return "Vulkan";
    case WGPUBackendType_Metal: return "Metal";
    case WGPUBackendType_D3D12: return "D3D12";
    case WGPUBackendType_D3D11: return "D3D11";
    case WGPUBackendType_OpenGL: return "OpenGL";
    case WGPUBackendType_OpenGLES: return "OpenGLES";
    case WGPUBackendType_Null: return "Null";
    default: return "unknown backend";
  }
}

const char* adapter_type_name(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return "discrete";
    case WGPUAdapterType_IntegratedGPU: return "integrated";
    case WGPUAdapterType_CPU: return "cpu";
    default: return "unknown";
  }
}

std::string mib(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0) return cat(bytes >> 30, " GiB");
  if (bytes >= (uint64_t{1} << 20)) return cat(bytes >> 20, " MiB");
  return cat(bytes, " B");
}

struct AdapterCandidate {
  WGPUAdapter adapter = nullptr;
  std::string name, vendor, description;
  WGPUAdapterType type = WGPUAdapterType_Unknown;
  WGPUBackendType backend = WGPUBackendType_Undefined;
  uint32_t subgroup_min = 0, subgroup_max = 0;
};

struct AdapterReply {
  WGPUAdapter adapter = nullptr;
  std::string message;
};

void on_adapter(WGPURequestAdapterStatus status, WGPUAdapter adapter, WGPUStringView message, void* out, void*) {
  auto* r = static_cast<AdapterReply*>(out);
  if (status == WGPURequestAdapterStatus_Success) r->adapter = adapter;
  r->message = str(message);
}

struct DeviceReply {
  WGPUDevice device = nullptr;
  std::string message;
};

void on_device(WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message, void* out, void*) {
  auto* r = static_cast<DeviceReply*>(out);
  if (status == WGPURequestDeviceStatus_Success) r->device = device;
  r->message = str(message);
}

struct ScopeReply {
  WGPUErrorType type = WGPUErrorType_NoError;
  std::string message;
};

void on_pop_scope(WGPUPopErrorScopeStatus status, WGPUErrorType type, WGPUStringView message, void* out, void*) {
  auto* r = static_cast<ScopeReply*>(out);
  r->type = status == WGPUPopErrorScopeStatus_Success ? type : WGPUErrorType_Unknown;
  r->message = status == WGPUPopErrorScopeStatus_Success ? str(message) : "error scope could not be popped";
}

struct MapReply {
  bool ok = false;
  std::string message;
};

void on_map(WGPUMapAsyncStatus status, WGPUStringView message, void* out, void*) {
  auto* r = static_cast<MapReply*>(out);
  r->ok = status == WGPUMapAsyncStatus_Success;
  r->message = str(message);
}

void on_work_done(WGPUQueueWorkDoneStatus status, WGPUStringView message, void* out, void*) {
  auto* r = static_cast<MapReply*>(out);
  r->ok = status == WGPUQueueWorkDoneStatus_Success;
  r->message = str(message);
}

Status wait_on(WGPUInstance instance, WGPUFuture future, const char* what) {
  WGPUFutureWaitInfo info{future, false};
  const WGPUWaitStatus s = wgpuInstanceWaitAny(instance, 1, &info, kWaitTimeoutNs);
  KEV_CHECK(s != WGPUWaitStatus_TimedOut, ErrorCode::Device, "webgpu: timed out after ", kWaitTimeoutNs / 1000000000,
            " s waiting for ", what);
  KEV_CHECK(s == WGPUWaitStatus_Success && info.completed, ErrorCode::Device, "webgpu: waiting for ", what,
            " failed (wgpuInstanceWaitAny status ", static_cast<int>(s), ")");
  return Status::success();
}

// Pops the error scope pushed before a creation call and waits for its verdict.
Result<ScopeReply> pop_error_scope(WGPUInstance instance, WGPUDevice device, const char* what) {
  ScopeReply scope;
  WGPUPopErrorScopeCallbackInfo cb = WGPU_POP_ERROR_SCOPE_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_WaitAnyOnly;
  cb.callback = on_pop_scope;
  cb.userdata1 = &scope;
  KEV_TRY(wait_on(instance, wgpuDevicePopErrorScope(device, cb), what));
  return scope;
}

Result<AdapterCandidate> request_adapter(WGPUInstance instance, WGPUPowerPreference power, bool fallback,
                                         bool null_backend_only) {
  WGPURequestAdapterOptions o = WGPU_REQUEST_ADAPTER_OPTIONS_INIT;
  o.powerPreference = power;
  o.forceFallbackAdapter = fallback;
  if (null_backend_only) o.backendType = WGPUBackendType_Null;
  AdapterReply reply;
  WGPURequestAdapterCallbackInfo cb = WGPU_REQUEST_ADAPTER_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_WaitAnyOnly;
  cb.callback = on_adapter;
  cb.userdata1 = &reply;
  KEV_TRY(wait_on(instance, wgpuInstanceRequestAdapter(instance, &o, cb), "an adapter"));
  AdapterCandidate c;
  c.adapter = reply.adapter;
  if (!c.adapter) return c;
  WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
  if (wgpuAdapterGetInfo(c.adapter, &info) == WGPUStatus_Success) {
    c.name = str(info.device);
    c.vendor = str(info.vendor);
    c.description = str(info.description);
    c.type = info.adapterType;
    c.backend = info.backendType;
    c.subgroup_min = info.subgroupMinSize;
    c.subgroup_max = info.subgroupMaxSize;
    wgpuAdapterInfoFreeMembers(info);
  }
  return c;
}

bool matches(const AdapterCandidate& c, const std::string& want) {
  const std::string w = lower(want);
  if (w == "discrete" || w == "integrated" || w == "cpu") return w == adapter_type_name(c.type);
  return lower(c.name).find(w) != std::string::npos || lower(c.vendor).find(w) != std::string::npos ||
         lower(c.description).find(w) != std::string::npos;
}

}  // namespace

DeviceLimits spec_default_limits() {
  DeviceLimits l;
  l.max_binding = uint64_t{128} << 20;
  l.max_buffer = uint64_t{256} << 20;
  l.workgroup_storage = 16384;
  l.invocations = 256;
  l.storage_buffers = 8;
  l.workgroups_per_dim = 65535;
  l.storage_align = 256;
  l.uniform_align = 256;
  return l;
}

void Device::on_uncaptured_error(WGPUDevice const*, WGPUErrorType type, WGPUStringView message, void* self, void*) {
  auto* d = static_cast<Device*>(self);
  std::lock_guard<std::mutex> lock(d->error_mutex_);
  if (d->error_.empty()) {
    const char* kind = type == WGPUErrorType_Validation    ? "validation error"
                       : type == WGPUErrorType_OutOfMemory ? "out of memory"
                                                           : "internal error";
    d->error_ = cat(kind, ": ", str(message));
  }
}

void Device::on_log(WGPULoggingType, WGPUStringView message, void* self, void*) {
  constexpr std::string_view kSpirv = "/* Dumped generated SPIRV disassembly */";
  auto* d = static_cast<Device*>(self);
  const std::string text = str(message);
  if (text.rfind(kSpirv, 0) != 0) return;  // the WGSL Dawn dumps too: the repository has it
  std::lock_guard<std::mutex> lock(d->error_mutex_);
  const std::string name = d->compiling_.empty() ? cat("unlabelled-", ++d->unlabelled_dumps_) : d->compiling_;
  const std::filesystem::path path = std::filesystem::path(d->dump_dir_) / (name + ".spvasm");
  std::FILE* f = std::fopen(path.c_str(), "w");
  const bool ok = f != nullptr && std::fwrite(text.data() + kSpirv.size(), 1, text.size() - kSpirv.size(), f) ==
                                      text.size() - kSpirv.size();
  if (f != nullptr) std::fclose(f);
  if (!ok && d->error_.empty()) d->error_ = cat("KEV_WEBGPU_DUMP_SPIRV: cannot write ", path.string());
}

void Device::on_device_lost(WGPUDevice const*, WGPUDeviceLostReason reason, WGPUStringView message, void* self,
                            void*) {
  auto* d = static_cast<Device*>(self);
  std::lock_guard<std::mutex> lock(d->error_mutex_);
  if (reason == WGPUDeviceLostReason_Destroyed || reason == WGPUDeviceLostReason_CallbackCancelled) return;
  d->lost_ = true;
  d->lost_message_ = str(message);
}

Result<std::unique_ptr<Device>> Device::open(const std::string& adapter_choice, uint64_t max_binding_override,
                                             bool use_subgroups, bool null_backend_only) {
  std::unique_ptr<Device> d(new Device());
  const WGPUInstanceFeatureName timed = WGPUInstanceFeatureName_TimedWaitAny;
  WGPUInstanceDescriptor idesc = WGPU_INSTANCE_DESCRIPTOR_INIT;
  idesc.requiredFeatureCount = 1;
  idesc.requiredFeatures = &timed;
  d->instance_ = wgpuCreateInstance(&idesc);
  KEV_CHECK(d->instance_ != nullptr, ErrorCode::Device, "webgpu: cannot create a Dawn instance with TimedWaitAny");

  // Dawn has no adapter enumeration in webgpu.h: ask under each preference and keep the distinct ones.
  std::vector<AdapterCandidate> found;
  const std::pair<WGPUPowerPreference, bool> asks[] = {{WGPUPowerPreference_HighPerformance, false},
                                                      {WGPUPowerPreference_LowPower, false},
                                                      {WGPUPowerPreference_Undefined, true}};
  // Dawn's Null backend answers when no other backend loads (e.g. no Vulkan loader) but executes
  // nothing: every buffer it "computes" is garbage, so it is never a candidate.
  bool saw_null = false;
  for (const auto& [power, fallback] : asks) {
    KEV_ASSIGN_OR_RETURN(AdapterCandidate c, request_adapter(d->instance_, power, fallback, null_backend_only));
    if (!c.adapter) continue;
    if (c.backend == WGPUBackendType_Null) {
      saw_null = true;
      wgpuAdapterRelease(c.adapter);
      continue;
    }
    const bool dup = std::any_of(found.begin(), found.end(), [&](const AdapterCandidate& f) {
      return f.name == c.name && f.backend == c.backend && f.description == c.description;
    });
    if (dup) {
      wgpuAdapterRelease(c.adapter);
    } else {
      found.push_back(c);
    }
  }
  KEV_CHECK(!found.empty(), ErrorCode::Device, "webgpu: no adapter found",
            saw_null ? " (Dawn offered only its Null backend, which runs no shaders: is a Vulkan loader and driver "
                        "installed?)"
                      : "",
            " (on a machine without a GPU install Mesa's lavapipe >= 25, see scripts/setup)");
  size_t pick = found.size();
  for (size_t i = 0; i < found.size() && pick == found.size(); ++i) {
    if (adapter_choice.empty() || matches(found[i], adapter_choice)) pick = i;
  }
  if (pick == found.size()) {
    std::string list;
    for (const AdapterCandidate& c : found)
      list += cat(list.empty() ? "" : "; ", c.name, " (", adapter_type_name(c.type), ", ", backend_name(c.backend), ")");
    for (const AdapterCandidate& c : found) wgpuAdapterRelease(c.adapter);
    return Status(ErrorCode::InvalidRequest,
                  cat("webgpu: no adapter matches '", adapter_choice, "'; found: ", list));
  }
  for (size_t i = 0; i < found.size(); ++i) {
    if (i != pick) wgpuAdapterRelease(found[i].adapter);
  }
  const AdapterCandidate chosen = found[pick];
  d->adapter_ = chosen.adapter;

  WGPULimits have = WGPU_LIMITS_INIT;
  KEV_CHECK(wgpuAdapterGetLimits(d->adapter_, &have) == WGPUStatus_Success, ErrorCode::Device,
            "webgpu: cannot read the limits of adapter ", chosen.name);
  KEV_CHECK(have.maxComputeWorkgroupStorageSize >= kNeedWorkgroupStorage, ErrorCode::Unsupported, "webgpu: adapter ",
            chosen.name, " offers maxComputeWorkgroupStorageSize ", have.maxComputeWorkgroupStorageSize,
            "; the kernels need ", kNeedWorkgroupStorage);
  KEV_CHECK(have.maxComputeInvocationsPerWorkgroup >= kNeedInvocations, ErrorCode::Unsupported, "webgpu: adapter ",
            chosen.name, " offers maxComputeInvocationsPerWorkgroup ", have.maxComputeInvocationsPerWorkgroup,
            "; the kernels need ", kNeedInvocations);
  KEV_CHECK(have.maxStorageBuffersPerShaderStage >= kNeedStorageBuffers, ErrorCode::Unsupported, "webgpu: adapter ",
            chosen.name, " offers maxStorageBuffersPerShaderStage ", have.maxStorageBuffersPerShaderStage,
            "; the kernels need ", kNeedStorageBuffers);
  // Ask for everything the adapter offers on the limits the model's sizes press on; the rest stay at
  // the defaults.
  WGPULimits want = WGPU_LIMITS_INIT;
  want.maxStorageBufferBindingSize = have.maxStorageBufferBindingSize;
  want.maxBufferSize = have.maxBufferSize;
  want.maxComputeWorkgroupStorageSize = have.maxComputeWorkgroupStorageSize;
  want.maxComputeInvocationsPerWorkgroup = have.maxComputeInvocationsPerWorkgroup;
  want.maxComputeWorkgroupSizeX = have.maxComputeWorkgroupSizeX;
  want.maxStorageBuffersPerShaderStage = have.maxStorageBuffersPerShaderStage;
  want.maxComputeWorkgroupsPerDimension = have.maxComputeWorkgroupsPerDimension;

  // Every standard feature the adapter lists (Dawn's own, 0x50000 and up, stay off). Not by name:
  // webgpu.h renumbered the features between Dawn releases, and the bundled libwebgpu_wrapper's Dawn
  // is older than the header it builds with (there Subgroups is 0x11 and 0x12 is
  // CoreFeaturesAndLimits; ShaderF16 is 0xA, 0xB is RG11B10UfloatRenderable). What the kernels can
  // use is then learnt by compiling the WGSL extensions below.
  WGPUSupportedFeatures offered = WGPU_SUPPORTED_FEATURES_INIT;
  wgpuAdapterGetFeatures(d->adapter_, &offered);
  std::vector<WGPUFeatureName> features;
  for (size_t i = 0; i < offered.featureCount; ++i) {
    if (static_cast<uint32_t>(offered.features[i]) < 0x50000) features.push_back(offered.features[i]);
  }
  wgpuSupportedFeaturesFreeMembers(offered);

  WGPUDeviceDescriptor ddesc = WGPU_DEVICE_DESCRIPTOR_INIT;
  ddesc.label = sv("kev");
  // Dawn rounds timestamps to ~65 µs unless told not to; only the trace reads them.
  const char* trace_env = std::getenv("KEV_WEBGPU_TRACE");
  const bool trace_ops = trace_env != nullptr && std::strcmp(trace_env, "ops") == 0;
  const char* const exact_timestamps[] = {"timestamp_quantization"};
  // Dawn logs the SPIR-V it generates for each pipeline under `dump_shaders`; on_log() files it.
  const char* dump_env = std::getenv("KEV_WEBGPU_DUMP_SPIRV");
  if (dump_env != nullptr && *dump_env != '\0') d->dump_dir_ = dump_env;
  const char* const dump_shaders[] = {"dump_shaders"};
  WGPUDawnTogglesDescriptor toggles = WGPU_DAWN_TOGGLES_DESCRIPTOR_INIT;
  if (trace_ops) {
    toggles.disabledToggleCount = 1;
    toggles.disabledToggles = exact_timestamps;
  }
  if (!d->dump_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(d->dump_dir_, ec);
    KEV_CHECK(!ec, ErrorCode::InvalidRequest, "webgpu: KEV_WEBGPU_DUMP_SPIRV=", d->dump_dir_,
              ": cannot create the directory: ", ec.message());
    toggles.enabledToggleCount = 1;
    toggles.enabledToggles = dump_shaders;
  }
  if (trace_ops || !d->dump_dir_.empty()) ddesc.nextInChain = &toggles.chain;
  ddesc.requiredFeatureCount = features.size();
  ddesc.requiredFeatures = features.data();
  ddesc.requiredLimits = &want;
  ddesc.uncapturedErrorCallbackInfo.callback = &Device::on_uncaptured_error;
  ddesc.uncapturedErrorCallbackInfo.userdata1 = d.get();
  ddesc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowSpontaneous;
  ddesc.deviceLostCallbackInfo.callback = &Device::on_device_lost;
  ddesc.deviceLostCallbackInfo.userdata1 = d.get();
  DeviceReply reply;
  WGPURequestDeviceCallbackInfo cb = WGPU_REQUEST_DEVICE_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_WaitAnyOnly;
  cb.callback = on_device;
  cb.userdata1 = &reply;
  KEV_TRY(wait_on(d->instance_, wgpuAdapterRequestDevice(d->adapter_, &ddesc, cb), "the device"));
  KEV_CHECK(reply.device != nullptr, ErrorCode::Device, "webgpu: adapter ", chosen.name,
            " refused a device: ", reply.message);
  d->device_ = reply.device;
  d->queue_ = wgpuDeviceGetQueue(d->device_);
  if (!d->dump_dir_.empty()) {
    WGPULoggingCallbackInfo log = WGPU_LOGGING_CALLBACK_INFO_INIT;
    log.callback = &Device::on_log;
    log.userdata1 = d.get();
    wgpuDeviceSetLoggingCallback(d->device_, log);
  }

  WGPULimits got = WGPU_LIMITS_INIT;
  KEV_CHECK(wgpuDeviceGetLimits(d->device_, &got) == WGPUStatus_Success, ErrorCode::Device,
            "webgpu: cannot read the device limits");
  DeviceLimits& l = d->limits_;
  l.max_binding = got.maxStorageBufferBindingSize;
  if (max_binding_override > 0) l.max_binding = std::min<uint64_t>(l.max_binding, max_binding_override);
  l.max_buffer = got.maxBufferSize;
  l.workgroup_storage = got.maxComputeWorkgroupStorageSize;
  l.invocations = got.maxComputeInvocationsPerWorkgroup;
  l.storage_buffers = got.maxStorageBuffersPerShaderStage;
  l.workgroups_per_dim = got.maxComputeWorkgroupsPerDimension;
  l.storage_align = got.minStorageBufferOffsetAlignment;
  l.uniform_align = got.minUniformBufferOffsetAlignment;
  KEV_ASSIGN_OR_RETURN(d->dummy_, d->create_buffer(kMaxStorageSlots * std::max<uint64_t>(l.storage_align, 16),
                                                   kStorageUsage, "kev dummy"));

  // Neither extension is required (the kernels are FP32 and have workgroup-memory reductions); where
  // one does not compile the description says so, with Dawn's reason.
  KEV_ASSIGN_OR_RETURN(const std::string f16_error,
                       d->compile_error("enable f16;\nfn f(h: f16) -> f16 { return h; }\n"));
  KEV_ASSIGN_OR_RETURN(const std::string subgroups_error,
                       d->compile_error("enable subgroups;\nfn f(v: f32) -> f32 { return subgroupAdd(v); }\n"));
  std::string subgroups;  // the description's entry
  if (!subgroups_error.empty()) {
    subgroups = cat(", no subgroups (", subgroups_error, ")");
  } else {
    const std::string sizes = chosen.subgroup_max == chosen.subgroup_min
                                  ? cat(chosen.subgroup_min)
                                  : cat(chosen.subgroup_min, "..", chosen.subgroup_max);
    std::string why_not = "turned off";
    if (use_subgroups) {
      KEV_ASSIGN_OR_RETURN(why_not, d->check_subgroups());
    }
    d->has_subgroups_ = why_not.empty();
    subgroups = cat(", subgroups of ", sizes, d->has_subgroups_ ? "" : cat(" (not used: ", why_not, ")"));
  }
  const std::string f16 = f16_error.empty() ? ", shader-f16" : cat(", no shader-f16 (", f16_error, ")");
  d->description_ = cat(chosen.name, " (", adapter_type_name(chosen.type), ", ", backend_name(chosen.backend),
                        chosen.description.empty() ? "" : ", driver: ", chosen.description, "); storage binding ",
                        mib(l.max_binding), ", buffer ", mib(l.max_buffer), ", workgroup storage ",
                        l.workgroup_storage, " B, ", l.invocations, " invocations/workgroup, ", l.storage_buffers,
                        " storage buffers/stage", f16, subgroups, "; FP32 kernels");
  if (trace_ops) KEV_TRY(d->open_trace());  // after the subgroup check: the trace shows the backend's passes
  return d;
}

Device::~Device() {
  if (pass_) {
    wgpuComputePassEncoderEnd(pass_);
    wgpuComputePassEncoderRelease(pass_);
  }
  if (encoder_) wgpuCommandEncoderRelease(encoder_);
  for (auto& [k, p] : pipelines_) wgpuComputePipelineRelease(p.pipeline);
  for (auto& [k, l] : layouts_) wgpuBindGroupLayoutRelease(l);
  for (Ring* ring : {&params_ring_, &data_ring_}) {
    for (RingChunk& c : ring->chunks) release_buffer(c.buffer);
  }
  for (WGPUBuffer b : retired_) release_buffer(b);
  if (scratch_) release_buffer(scratch_);
  if (readback_) release_buffer(readback_);
  if (dummy_) release_buffer(dummy_);
  if (trace_) {
    if (trace_->queries) {
      wgpuQuerySetDestroy(trace_->queries);
      wgpuQuerySetRelease(trace_->queries);
    }
    for (WGPUBuffer b : {trace_->resolved, trace_->host}) {
      if (b) release_buffer(b);
    }
  }
  if (queue_) wgpuQueueRelease(queue_);
  if (device_) {
    wgpuDeviceDestroy(device_);
    wgpuDeviceRelease(device_);
  }
  if (adapter_) wgpuAdapterRelease(adapter_);
  if (instance_) wgpuInstanceRelease(instance_);
}

Binding Device::dummy(size_t slot) const {
  return Binding{dummy_, slot * std::max<uint64_t>(limits_.storage_align, 16), 16};
}

Status Device::check_alive() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  KEV_CHECK(!lost_, ErrorCode::Device, "webgpu: the device was lost: ", lost_message_);
  return Status::success();
}

Status Device::take_error(const char* during) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  KEV_CHECK(!lost_, ErrorCode::Device, "webgpu: the device was lost: ", lost_message_);
  if (error_.empty()) return Status::success();
  Status s(ErrorCode::Device, cat("webgpu: ", during, ": ", error_));
  error_.clear();
  return s;
}

Status Device::wait(WGPUFuture future, const char* what) { return wait_on(instance_, future, what); }

Result<WGPUBuffer> Device::create_buffer(uint64_t size, WGPUBufferUsage usage, const char* label) {
  KEV_TRY(check_alive());
  KEV_CHECK(size <= limits_.max_buffer, ErrorCode::Unsupported, "webgpu: buffer '", label, "' of ", size,
            " bytes exceeds the device's maxBufferSize ", limits_.max_buffer);
  WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
  desc.label = sv(label);
  desc.usage = usage;
  desc.size = align_up(std::max<uint64_t>(size, 4), 4);
  wgpuDevicePushErrorScope(device_, WGPUErrorFilter_OutOfMemory);
  WGPUBuffer b = wgpuDeviceCreateBuffer(device_, &desc);
  KEV_ASSIGN_OR_RETURN(const ScopeReply scope, pop_error_scope(instance_, device_, "buffer creation"));
  if (scope.type != WGPUErrorType_NoError) {
    if (b) wgpuBufferRelease(b);
    return Status(ErrorCode::Device, cat("webgpu: cannot allocate buffer '", label, "' of ", size, " bytes: ",
                                         scope.message));
  }
  KEV_CHECK(b != nullptr, ErrorCode::Device, "webgpu: cannot allocate buffer '", label, "' of ", size, " bytes");
  ++counters_->created;
  counters_->live_bytes += static_cast<int64_t>(desc.size);
  return b;
}

void Device::release_buffer(WGPUBuffer b) {
  counters_->released(b);
  wgpuBufferRelease(b);
}

Result<WGPUBindGroupLayout> Device::layout_for(uint32_t n_storage) {
  auto it = layouts_.find(n_storage);
  if (it != layouts_.end()) return it->second;
  std::vector<WGPUBindGroupLayoutEntry> entries(n_storage + 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    WGPUBindGroupLayoutEntry& e = entries[i];
    e = WGPU_BIND_GROUP_LAYOUT_ENTRY_INIT;
    e.binding = static_cast<uint32_t>(i);
    e.visibility = WGPUShaderStage_Compute;
    e.buffer.type = i == 0 ? WGPUBufferBindingType_Uniform : WGPUBufferBindingType_Storage;
  }
  WGPUBindGroupLayoutDescriptor desc = WGPU_BIND_GROUP_LAYOUT_DESCRIPTOR_INIT;
  desc.entryCount = entries.size();
  desc.entries = entries.data();
  WGPUBindGroupLayout layout = wgpuDeviceCreateBindGroupLayout(device_, &desc);
  KEV_CHECK(layout != nullptr, ErrorCode::Device, "webgpu: cannot create a bind group layout with ", n_storage,
            " storage bindings");
  layouts_[n_storage] = layout;
  return layout;
}

Result<const Device::Pipeline*> Device::pipeline(const KernelSpec& k) {
  const std::string key = cat(k.file, ":", k.entry);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return &it->second;
  const char* body = find_wgsl(k.file);
  const char* prelude = find_wgsl("prelude");
  const char* reduce = find_wgsl(has_subgroups_ ? "reduce_subgroups" : "reduce_workgroup");
  KEV_CHECK(body != nullptr && prelude != nullptr && reduce != nullptr, ErrorCode::Internal,
            "webgpu: no embedded WGSL file '", k.file, ".wgsl' (or prelude.wgsl, reduce_*.wgsl)");
  const std::string code = cat(has_subgroups_ ? "enable subgroups;\n" : "", prelude, "\n", reduce, "\n", body);
  KEV_ASSIGN_OR_RETURN(WGPUBindGroupLayout layout, layout_for(k.n_storage));

  wgpuDevicePushErrorScope(device_, WGPUErrorFilter_Validation);
  WGPUShaderSourceWGSL wgsl = WGPU_SHADER_SOURCE_WGSL_INIT;
  wgsl.code = sv(code);
  WGPUShaderModuleDescriptor mdesc = WGPU_SHADER_MODULE_DESCRIPTOR_INIT;
  mdesc.nextInChain = &wgsl.chain;
  mdesc.label = sv(k.file);
  WGPUShaderModule module = wgpuDeviceCreateShaderModule(device_, &mdesc);
  WGPUPipelineLayoutDescriptor pldesc = WGPU_PIPELINE_LAYOUT_DESCRIPTOR_INIT;
  pldesc.bindGroupLayoutCount = 1;
  pldesc.bindGroupLayouts = &layout;
  WGPUPipelineLayout pl = wgpuDeviceCreatePipelineLayout(device_, &pldesc);
  WGPUComputePipelineDescriptor pdesc = WGPU_COMPUTE_PIPELINE_DESCRIPTOR_INIT;
  pdesc.label = sv(key);
  pdesc.layout = pl;
  pdesc.compute.module = module;
  pdesc.compute.entryPoint = sv(k.entry);
  compiling_ = cat(k.file, ".", k.entry);
  WGPUComputePipeline pipeline = wgpuDeviceCreateComputePipeline(device_, &pdesc);
  compiling_.clear();
  wgpuPipelineLayoutRelease(pl);
  if (module) wgpuShaderModuleRelease(module);
  KEV_ASSIGN_OR_RETURN(const ScopeReply scope, pop_error_scope(instance_, device_, "pipeline creation"));
  if (scope.type != WGPUErrorType_NoError || !pipeline) {
    if (pipeline) wgpuComputePipelineRelease(pipeline);
    return Status(ErrorCode::Device, cat("webgpu: pipeline ", key, " (", k.file, ".wgsl) failed: ", scope.message));
  }
  Pipeline& p = pipelines_[key];
  p.pipeline = pipeline;
  p.layout = layout;
  return &p;
}

Result<std::string> Device::compile_error(const std::string& code) {
  wgpuDevicePushErrorScope(device_, WGPUErrorFilter_Validation);
  WGPUShaderSourceWGSL wgsl = WGPU_SHADER_SOURCE_WGSL_INIT;
  wgsl.code = sv(code);
  WGPUShaderModuleDescriptor mdesc = WGPU_SHADER_MODULE_DESCRIPTOR_INIT;
  mdesc.nextInChain = &wgsl.chain;
  mdesc.label = sv("kev probe");
  WGPUShaderModule module = wgpuDeviceCreateShaderModule(device_, &mdesc);
  if (module) wgpuShaderModuleRelease(module);
  KEV_ASSIGN_OR_RETURN(const ScopeReply scope, pop_error_scope(instance_, device_, "a shader probe"));
  if (module != nullptr && scope.type == WGPUErrorType_NoError) return std::string();
  const std::string first_line = scope.message.substr(0, scope.message.find('\n'));
  return first_line.empty() ? std::string("no shader module") : first_line;
}

Result<std::string> Device::check_subgroups() {
  constexpr uint32_t kInvocations = 256;  // subgroup_check.wgsl's workgroup
  const KernelSpec check{"subgroup_check", "check", 1};
  has_subgroups_ = true;  // builds the check under `enable subgroups;`
  std::vector<uint32_t> ok(kInvocations, 0);
  const uint32_t params[4] = {};
  Result<WGPUBuffer> buf = create_buffer(kInvocations * sizeof(uint32_t), kStorageUsage, "kev subgroup check");
  Status s = buf.status();
  if (s.ok()) {
    const Binding b{*buf, 0, kInvocations * sizeof(uint32_t)};
    s = dispatch("subgroup check", check, params, sizeof params, {&b, 1}, 1);
    if (s.ok()) s = read(*buf, 0, b.size, ok.data());
    release_buffer(*buf);
  }
  has_subgroups_ = false;
  for (auto it = pipelines_.begin(); it != pipelines_.end();) {  // built with subgroups: not for later kernels
    wgpuComputePipelineRelease(it->second.pipeline);
    it = pipelines_.erase(it);
  }
  KEV_TRY(s);
  const auto bad = std::find(ok.begin(), ok.end(), 0u);
  if (bad == ok.end()) return std::string();
  return cat("invocation ", bad - ok.begin(), " of a ", kInvocations,
             "-invocation workgroup is not in a full subgroup of 8 to 64 consecutive indices");
}

Status Device::ensure_encoder() {
  KEV_TRY(check_alive());
  if (encoder_) return Status::success();
  WGPUCommandEncoderDescriptor desc = WGPU_COMMAND_ENCODER_DESCRIPTOR_INIT;
  desc.label = sv("kev pass");
  encoder_ = wgpuDeviceCreateCommandEncoder(device_, &desc);
  KEV_CHECK(encoder_ != nullptr, ErrorCode::Device, "webgpu: cannot create a command encoder");
  return Status::success();
}

void Device::end_pass() {
  if (!pass_) return;
  wgpuComputePassEncoderEnd(pass_);
  wgpuComputePassEncoderRelease(pass_);
  pass_ = nullptr;
}

void Device::begin_op() { scratch_used_ = 0; }

Result<Binding> Device::put(Ring& ring, WGPUBufferUsage usage, const void* data, size_t bytes) {
  KEV_TRY(check_alive());
  const uint64_t align = std::max<uint64_t>({limits_.storage_align, limits_.uniform_align, 16});
  const uint64_t need = align_up(std::max<uint64_t>(bytes, 16), 16);
  while (true) {
    if (ring.chunk < ring.chunks.size()) {
      RingChunk& c = ring.chunks[ring.chunk];
      const uint64_t off = align_up(ring.used, align);
      if (off + need <= c.size) {
        // Into the chunk's host copy; flush() writes each chunk's used range with one writeBuffer
        // before the submit (one call per pass instead of one per dispatch).
        std::memcpy(c.host.data() + off, data, bytes);
        c.dirty = off + bytes;
        ring.used = off + need;
        return Binding{c.buffer, off, need};
      }
      ++ring.chunk;
      ring.used = 0;
      continue;
    }
    const uint64_t size = std::max(kRingChunkBytes, align_up(need, align));
    KEV_ASSIGN_OR_RETURN(WGPUBuffer b, create_buffer(size, usage, "kev ring"));
    ring.chunks.push_back({b, size, std::vector<uint8_t>(size), 0});
  }
}

Result<Binding> Device::stage(const void* data, size_t bytes) { return put(data_ring_, kStorageUsage, data, bytes); }

Status Device::upload_ordered(WGPUBuffer dst, uint64_t offset, const void* data, size_t bytes) {
  KEV_ASSIGN_OR_RETURN(Binding staged, stage(data, bytes));
  staged.size = bytes;
  return copy(staged, dst, offset);
}

Status Device::write_now(WGPUBuffer dst, uint64_t offset, const void* data, size_t bytes) {
  if (recorded_) KEV_TRY(flush());
  KEV_TRY(check_alive());
  wgpuQueueWriteBuffer(queue_, dst, offset, data, bytes);
  return Status::success();
}

Result<Binding> Device::scratch(uint64_t bytes) {
  const uint64_t align = std::max<uint64_t>(limits_.storage_align, 16);
  const uint64_t need = align_up(std::max<uint64_t>(bytes, 16), 16);
  uint64_t off = align_up(scratch_used_, align);
  if (!scratch_ || off + need > scratch_size_) {
    // Regions handed out earlier in this op stay in the old buffer, kept alive until the next flush.
    const uint64_t size = std::max({kMinScratchBytes, 2 * scratch_size_, align_up(need, align)});
    KEV_CHECK(need <= limits_.max_binding, ErrorCode::Unsupported, "webgpu: an op needs ", need,
              " bytes of scratch in one binding; the device's storage binding limit is ", limits_.max_binding);
    KEV_ASSIGN_OR_RETURN(WGPUBuffer b, create_buffer(std::min(size, limits_.max_binding), kStorageUsage, "kev scratch"));
    if (scratch_) retired_.push_back(scratch_);
    scratch_ = b;
    scratch_size_ = std::min(size, limits_.max_binding);
    off = 0;
  }
  scratch_used_ = off + need;
  return Binding{scratch_, off, need};
}

Status Device::dispatch(const char* op, const KernelSpec& kernel, const void* params, size_t params_bytes,
                        std::span<const Binding> storage, uint64_t workgroups) {
  if (workgroups == 0) return Status::success();
  KEV_CHECK(storage.size() == kernel.n_storage, ErrorCode::Internal, "webgpu: ", kernel.file, ":", kernel.entry,
            " takes ", kernel.n_storage, " storage bindings, got ", storage.size());
  KEV_CHECK(kernel.n_storage <= limits_.storage_buffers, ErrorCode::Unsupported, "webgpu: ", kernel.file, ":",
            kernel.entry, " needs ", kernel.n_storage, " storage buffers; the device allows ", limits_.storage_buffers);
  KEV_ASSIGN_OR_RETURN(const Pipeline* p, pipeline(kernel));
  const uint64_t per_dim = limits_.workgroups_per_dim;
  const uint64_t gx = std::min(workgroups, per_dim);
  const uint64_t gy = (workgroups + gx - 1) / gx;
  KEV_CHECK(gy <= per_dim, ErrorCode::Unsupported, "webgpu: ", op, " needs ", workgroups,
            " workgroups; the device allows ", per_dim, " per dimension (", per_dim * per_dim, " folded)");
  KEV_ASSIGN_OR_RETURN(Binding uniform,
                       put(params_ring_, WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst, params, params_bytes));
  KEV_TRY(ensure_encoder());
  std::vector<WGPUBindGroupEntry> entries(storage.size() + 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Binding& b = i == 0 ? uniform : storage[i - 1];
    entries[i] = WGPU_BIND_GROUP_ENTRY_INIT;
    entries[i].binding = static_cast<uint32_t>(i);
    entries[i].buffer = b.buffer;
    entries[i].offset = b.offset;
    entries[i].size = b.size;
  }
  WGPUBindGroupDescriptor desc = WGPU_BIND_GROUP_DESCRIPTOR_INIT;
  desc.label = sv(op);
  desc.layout = p->layout;
  desc.entryCount = entries.size();
  desc.entries = entries.data();
  WGPUBindGroup group = wgpuDeviceCreateBindGroup(device_, &desc);
  KEV_CHECK(group != nullptr, ErrorCode::Device, "webgpu: ", op, ": cannot create a bind group");
  // One compute pass holds every dispatch up to the next copy or clear (each dispatch is its own
  // usage scope, so Dawn still orders them); the bind group's label names the op in errors. A timed
  // dispatch (KEV_WEBGPU_TRACE=ops) has a pass of its own, timestamped at its start and end.
  const bool timed = trace_ && trace_->labels.size() < kTraceDispatches;
  if (trace_ && !timed) ++trace_->untimed;
  if (timed) end_pass();
  if (!pass_) {
    WGPUComputePassDescriptor pdesc = WGPU_COMPUTE_PASS_DESCRIPTOR_INIT;
    pdesc.label = sv("kev");
    WGPUPassTimestampWrites stamps = WGPU_PASS_TIMESTAMP_WRITES_INIT;
    if (timed) {
      stamps.querySet = trace_->queries;
      stamps.beginningOfPassWriteIndex = static_cast<uint32_t>(2 * trace_->labels.size());
      stamps.endOfPassWriteIndex = stamps.beginningOfPassWriteIndex + 1;
      pdesc.timestampWrites = &stamps;
    }
    pass_ = wgpuCommandEncoderBeginComputePass(encoder_, &pdesc);
  }
  wgpuComputePassEncoderSetPipeline(pass_, p->pipeline);
  wgpuComputePassEncoderSetBindGroup(pass_, 0, group, 0, nullptr);
  wgpuComputePassEncoderDispatchWorkgroups(pass_, static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1);
  wgpuBindGroupRelease(group);
  recorded_ = true;
  if (timed) {
    end_pass();
    trace_->labels.push_back(cat(op, " ", kernel.entry, " x", workgroups));
  }
  if (++unsubmitted_ >= (submits_ == 0 ? kFirstSubmit : kSubmitEvery)) return submit();
  return Status::success();
}

Status Device::copy(const Binding& src, WGPUBuffer dst, uint64_t dst_offset) {
  if (src.size == 0) return Status::success();
  KEV_CHECK(src.offset % 4 == 0 && dst_offset % 4 == 0 && src.size % 4 == 0, ErrorCode::Unsupported,
            "webgpu: buffer copies need 4-byte aligned offsets and sizes (src offset ", src.offset, ", dst offset ",
            dst_offset, ", ", src.size, " bytes)");
  KEV_TRY(ensure_encoder());
  end_pass();
  wgpuCommandEncoderCopyBufferToBuffer(encoder_, src.buffer, src.offset, dst, dst_offset, src.size);
  recorded_ = true;
  return Status::success();
}

Status Device::clear(WGPUBuffer dst, uint64_t offset, uint64_t size) {
  if (size == 0) return Status::success();
  KEV_CHECK(offset % 4 == 0 && size % 4 == 0, ErrorCode::Unsupported,
            "webgpu: clearing needs a 4-byte aligned offset and size (offset ", offset, ", ", size, " bytes)");
  KEV_TRY(ensure_encoder());
  end_pass();
  wgpuCommandEncoderClearBuffer(encoder_, dst, offset, size);
  recorded_ = true;
  return Status::success();
}

Status Device::submit() {
  KEV_TRY(check_alive());
  // The rings' new bytes first: a queue write lands before the commands submitted after it, and the
  // ranges written earlier in the pass are never rewritten (offsets only grow until flush()).
  for (Ring* ring : {&params_ring_, &data_ring_}) {
    for (RingChunk& c : ring->chunks) {
      const uint64_t end = align_up(c.dirty, 4);
      if (end > c.written) {
        wgpuQueueWriteBuffer(queue_, c.buffer, c.written, c.host.data() + c.written, end - c.written);
      }
      c.written = std::max(c.written, end);
    }
  }
  if (encoder_) {
    end_pass();
    WGPUCommandBufferDescriptor cdesc = WGPU_COMMAND_BUFFER_DESCRIPTOR_INIT;
    WGPUCommandBuffer commands = wgpuCommandEncoderFinish(encoder_, &cdesc);
    wgpuCommandEncoderRelease(encoder_);
    encoder_ = nullptr;
    if (commands) {
      wgpuQueueSubmit(queue_, 1, &commands);
      wgpuCommandBufferRelease(commands);
    }
    ++submits_;
  }
  unsubmitted_ = 0;
  return Status::success();
}

Status Device::flush() {
  const bool traced = trace_ && !trace_->labels.empty();
  if (traced) {
    KEV_TRY(ensure_encoder());
    end_pass();
    const auto stamps = static_cast<uint32_t>(2 * trace_->labels.size());
    wgpuCommandEncoderResolveQuerySet(encoder_, trace_->queries, 0, stamps, trace_->resolved, 0);
    wgpuCommandEncoderCopyBufferToBuffer(encoder_, trace_->resolved, 0, trace_->host, 0, 8 * uint64_t{stamps});
    recorded_ = true;
  }
  KEV_TRY(submit());
  MapReply done;
  WGPUQueueWorkDoneCallbackInfo cb = WGPU_QUEUE_WORK_DONE_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_WaitAnyOnly;
  cb.callback = on_work_done;
  cb.userdata1 = &done;
  KEV_TRY(wait(wgpuQueueOnSubmittedWorkDone(queue_, cb), "the queue"));
  recorded_ = false;
  submits_ = 0;
  ++flushes_;
  for (Ring* ring : {&params_ring_, &data_ring_}) {
    ring->chunk = 0;
    ring->used = 0;
    for (RingChunk& c : ring->chunks) c.dirty = c.written = 0;
  }
  for (WGPUBuffer b : retired_) release_buffer(b);
  retired_.clear();
  KEV_TRY(take_error("while recording or running the pass"));
  KEV_CHECK(done.ok, ErrorCode::Device, "webgpu: the queue reported a failure: ", done.message);
  return traced ? report_trace() : Status::success();
}

Status Device::open_trace() {
  auto t = std::make_unique<DispatchTrace>();
  WGPUQuerySetDescriptor qdesc = WGPU_QUERY_SET_DESCRIPTOR_INIT;
  qdesc.label = sv("kev trace");
  qdesc.type = WGPUQueryType_Timestamp;
  qdesc.count = 2 * kTraceDispatches;
  wgpuDevicePushErrorScope(device_, WGPUErrorFilter_Validation);
  t->queries = wgpuDeviceCreateQuerySet(device_, &qdesc);
  KEV_ASSIGN_OR_RETURN(const ScopeReply scope, pop_error_scope(instance_, device_, "the trace's query set"));
  if (scope.type != WGPUErrorType_NoError || t->queries == nullptr) {
    if (t->queries) wgpuQuerySetRelease(t->queries);
    std::fprintf(stderr, "kev-webgpu-trace: no timestamp queries on %s (%s); nothing is traced\n",
                 description_.c_str(), scope.message.c_str());
    return Status::success();
  }
  const uint64_t bytes = 8 * uint64_t{qdesc.count};
  KEV_ASSIGN_OR_RETURN(t->resolved, create_buffer(bytes, WGPUBufferUsage_QueryResolve | WGPUBufferUsage_CopySrc,
                                                  "kev trace resolve"));
  KEV_ASSIGN_OR_RETURN(t->host, create_buffer(bytes, WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst,
                                              "kev trace readback"));
  trace_ = std::move(t);
  return Status::success();
}

Status Device::report_trace() {
  DispatchTrace& t = *trace_;
  const uint64_t bytes = 16 * uint64_t{t.labels.size()};
  std::vector<uint64_t> ns(2 * t.labels.size());
  KEV_TRY(copy_mapped(t.host, bytes, 0, bytes, ns.data(), "the trace's timestamps"));
  OpTimeTable table;
  for (size_t i = 0; i < t.labels.size(); ++i) {
    // An end below its start (a clock the driver does not keep monotonic) counts as 0.
    table.add(t.labels[i], ns[2 * i + 1] > ns[2 * i] ? 1e-6 * static_cast<double>(ns[2 * i + 1] - ns[2 * i]) : 0.0);
  }
  table.print(stderr,
              cat("kev-webgpu-trace pass ", ++t.passes, " ops: ", t.labels.size(), " dispatches",
                  t.untimed > 0 ? cat(" (", t.untimed, " more untimed)") : std::string()),
              "in the timed dispatches");
  t.labels.clear();
  t.untimed = 0;
  return Status::success();
}

Status Device::read(WGPUBuffer src, uint64_t offset, uint64_t bytes, void* dst) {
  if (bytes == 0) return Status::success();
  const uint64_t begin = offset / 4 * 4, end = align_up(offset + bytes, 4);
  if (!readback_ || readback_size_ < end - begin) {
    if (readback_) release_buffer(readback_);
    readback_ = nullptr;
    const uint64_t size = std::max<uint64_t>(end - begin, 4096);
    KEV_ASSIGN_OR_RETURN(readback_,
                         create_buffer(size, WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst, "kev readback"));
    readback_size_ = size;
  }
  KEV_TRY(copy(Binding{src, begin, end - begin}, readback_, 0));
  KEV_TRY(flush());
  KEV_TRY(copy_mapped(readback_, end - begin, offset - begin, bytes, dst, "the readback buffer"));
  return take_error("reading back a buffer");
}

Status Device::copy_mapped(WGPUBuffer b, uint64_t mapped_bytes, uint64_t from, uint64_t bytes, void* dst,
                           const char* what) {
  MapReply mapped;
  WGPUBufferMapCallbackInfo cb = WGPU_BUFFER_MAP_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_WaitAnyOnly;
  cb.callback = on_map;
  cb.userdata1 = &mapped;
  KEV_TRY(wait(wgpuBufferMapAsync(b, WGPUMapMode_Read, 0, mapped_bytes, cb), what));
  KEV_CHECK(mapped.ok, ErrorCode::Device, "webgpu: mapping ", what, " failed: ", mapped.message);
  const void* p = wgpuBufferGetConstMappedRange(b, 0, mapped_bytes);
  if (p != nullptr) std::memcpy(dst, static_cast<const char*>(p) + from, bytes);
  wgpuBufferUnmap(b);
  KEV_CHECK(p != nullptr, ErrorCode::Device, "webgpu: the mapped range of ", what, " is null");
  return Status::success();
}

}  // namespace kev::webgpu
