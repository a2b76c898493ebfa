// CudaBackend: device selection, memory, transfers, supports() and the op entry points. Each op
// validates its operands now (the CPU backend's shape rules through cpu::check_*, the GPU kernels'
// own limits here, and buffer bounds), then records a command (a closure enqueuing its kernels) and
// its signature into the PassRecorder; kernels run at the next flush (see pass_recorder.h).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_pool.h"
#include "backend/cuda/gated_delta_rule.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/pass_recorder.h"

namespace kev {

namespace {

using cpu::OpCheck;
using cpu::present;
using cuda::CommandSig;
using cuda::CudaBuffer;

constexpr size_t kGemmWorkspace = size_t{32} << 20;
constexpr size_t kSyncUploadBytes = size_t{1} << 20;
constexpr int64_t kMaxGrid = INT_MAX;  // grid.x limit, and the int fields of the GDN / attention args
constexpr int kMinComputeMajor = 8;    // BF16 GEMMs and the kernels' builds start at Ampere

bool owns_cuda(const Buffer* b) { return dynamic_cast<const CudaBuffer*>(b) != nullptr; }
OpCheck shapes(const char* op) { return OpCheck{op, false, "CUDA", &owns_cuda}; }
OpCheck bound(const char* op) { return OpCheck{op, true, "CUDA", &owns_cuda}; }

template <class T>
T* dptr(const Tensor& t) {
  return t.empty() ? nullptr : reinterpret_cast<T*>(static_cast<char*>(t.buffer->handle()) + t.offset);
}
float* f32p(const Tensor& t) { return dptr<float>(t); }

cuda::Rows rows_of(const Tensor& t) {
  cuda::Rows r;
  r.n_outer = t.rank - 1;
  for (int i = 0; i + 1 < t.rank; ++i) {
    r.shape[i] = t.shape[i];
    r.stride[i] = t.stride[i];
  }
  return r;
}

void sig_tensor(CommandSig& s, const Tensor& t) {
  if (t.empty()) {
    s.word(uint64_t{0xffff});
    return;
  }
  s.ptr(dptr<char>(t));
  s.word(t.dtype, t.rank);
  for (int i = 0; i < t.rank; ++i) s.word(t.shape[i], t.stride[i]);
}

Status launched(cudaError_t err, const char* what) {
  return cuda::cuda_status(err, what, __FILE__, __LINE__);
}

Status check_grid(const OpCheck& c, const char* what, int64_t count) {
  KEV_CHECK(count <= kMaxGrid, ErrorCode::Unsupported, c.op, ": ", what, " = ", count,
            " exceeds the CUDA kernels' limit of ", kMaxGrid);
  return Status::success();
}

// No byte in common (conservatively, by each view's first-to-last-element span).
bool disjoint(const Tensor& a, const Tensor& b) {
  return a.empty() || b.empty() || a.buffer != b.buffer || a.offset + a.span_bytes() <= b.offset ||
         b.offset + b.span_bytes() <= a.offset;
}

// The trace label of a joined conv command (cuda::ConvJoin with the prep ops joined in).
const char* conv_label(int segs, int norms, bool gates) {
  static const char* const kLabels[2][3][2] = {
      {{"causal_conv1d_silu", "causal_conv1d_silu + gdn_gates"},
       {"causal_conv1d_silu + l2_norm", "causal_conv1d_silu + l2_norm + gdn_gates"},
       {"causal_conv1d_silu + l2_norm x2", "causal_conv1d_silu + l2_norm x2 + gdn_gates"}},
      {{"causal_conv1d_silu x2", "causal_conv1d_silu x2 + gdn_gates"},
       {"causal_conv1d_silu x2 + l2_norm", "causal_conv1d_silu x2 + l2_norm + gdn_gates"},
       {"causal_conv1d_silu x2 + l2_norm x2", "causal_conv1d_silu x2 + l2_norm x2 + gdn_gates"}},
  };
  return kLabels[segs - 1][norms][gates ? 1 : 0];
}

// Strides of a dim matter only when it has more than one element.
bool same_stride(const Tensor& a, const Tensor& b, int d) {
  return a.shape[d] <= 1 || a.stride[d] == b.stride[d];
}

// ---- the GPU kernels' own preconditions (beyond the shared shape rules) ---------------------------

// F16 weights only in the f16 GEMM mode (the engine then converts bf16 exports to them at load).
Status check_cuda_matmul(const OpCheck& c, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                         CudaGemm gemm) {
  KEV_TRY(cpu::check_tensor(c, "x", x, {DType::F32}, 2));
  if (gemm == CudaGemm::F16) {
    KEV_TRY(cpu::check_tensor(c, "w", w, {DType::F32, DType::BF16, DType::F16}, 2));
  } else {
    KEV_TRY(cpu::check_tensor(c, "w", w, {DType::F32, DType::BF16}, 2));
  }
  KEV_TRY(cpu::check_contiguous(c, "w", w));
  KEV_TRY(cpu::check_shape(c, "w", w, {w.shape[0], x.shape[1]}, "[m,k]"));
  if (present(c, bias)) {
    KEV_TRY(cpu::check_tensor(c, "bias", bias, {DType::F32}, 1));
    KEV_TRY(cpu::check_shape(c, "bias", bias, {w.shape[0]}, "[m]"));
    KEV_TRY(cpu::check_no_overlap(c, "out", out, "bias", bias));
  }
  KEV_TRY(cpu::check_tensor(c, "out", out, {DType::F32}, 2));
  KEV_TRY(cpu::check_shape(c, "out", out, {x.shape[0], w.shape[0]}, "[n,m]"));
  const int64_t sizes[] = {x.shape[0], x.shape[1], w.shape[0], x.stride[0], out.stride[0]};
  for (int64_t s : sizes) KEV_TRY(check_grid(c, "a matmul size or leading dimension", s));
  KEV_CHECK(x.shape[0] <= 1 || x.stride[0] >= x.shape[1], ErrorCode::InvalidRequest, c.op, ": x ", x.describe(),
            " has overlapping rows");
  KEV_CHECK(out.shape[0] <= 1 || out.stride[0] >= out.shape[1], ErrorCode::InvalidRequest, c.op, ": out ",
            out.describe(), " has overlapping rows");
  KEV_TRY(cpu::check_no_overlap(c, "out", out, "x", x));
  return cpu::check_no_overlap(c, "out", out, "w", w);
}

Status check_gdn(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                 const Tensor& beta, const Tensor& state_in, const Tensor& out, const Tensor& state_out) {
  KEV_TRY(cpu::check_gated_delta_rule(c, q, k, v, g, beta, state_in, out, state_out));
  const int64_t Hk = q.shape[1], dk = q.shape[2], Hv = v.shape[1], dv = v.shape[2];
  KEV_TRY(check_grid(c, "n_tokens", q.shape[0]));
  KEV_CHECK(cuda::gated_delta_rule_supported(static_cast<int>(Hk), static_cast<int>(Hv), static_cast<int>(dk),
                                             static_cast<int>(dv)),
            ErrorCode::Unsupported, c.op, ": the GPU kernel does not handle Hk=", Hk, " Hv=", Hv, " dk=", dk,
            " dv=", dv);
  return Status::success();
}

Status check_attn(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                  const Tensor& prefix_v, const Tensor& out) {
  KEV_TRY(cpu::check_attention(c, q, k, v, prefix_k, prefix_v, out));
  const int64_t H = q.shape[1], hd = q.shape[2], Hkv = k.shape[1];
  if (present(c, prefix_k)) KEV_TRY(check_grid(c, "prefix length", prefix_k.shape[0]));
  KEV_TRY(check_grid(c, "n_tokens", q.shape[0]));
  KEV_CHECK(cuda::attention_supported(static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(hd)),
            ErrorCode::Unsupported, c.op, ": the GPU kernel does not handle H=", H, " Hkv=", Hkv, " hd=", hd);
  return Status::success();
}

// The same shape with contiguous strides (where a staged copy of `t` goes).
cuda::Rows contiguous_rows(const Tensor& t) {
  cuda::Rows r = rows_of(t);
  int64_t stride = t.dim(-1);
  for (int i = r.n_outer - 1; i >= 0; --i) {
    r.stride[i] = stride;
    stride *= r.shape[i];
  }
  return r;
}

// Operands in a layout a launcher cannot take are copied to contiguous scratch (inputs before the
// kernel, outputs after it); the copies are part of the op's command.
struct Restage {
  struct Job {
    const float* src;
    cuda::Rows src_rows;
    float* dst;
    cuda::Rows dst_rows;
    int64_t d;
  };
  std::vector<Job> before, after;

  static Status run(const std::vector<Job>& jobs, cudaStream_t s) {
    for (const Job& j : jobs) {
      KEV_TRY(launched(cuda::launch_copy(j.src, false, j.src_rows, j.dst, false, j.dst_rows, j.d, s),
                       "restaging copy"));
    }
    return Status::success();
  }
};

// Rows of every operand of a row-wise op fit the grid.
Status check_rows(const OpCheck& c, const Tensor& t) { return check_grid(c, "rows", cpu::n_rows(t)); }

Status check_elementwise(const OpCheck& c, const Tensor& t) {
  KEV_CHECK(t.numel() < cuda::kMaxElementwise, ErrorCode::Unsupported, c.op, ": ", t.describe(), " has ", t.numel(),
            " elements; the CUDA element-wise kernels take fewer than ", cuda::kMaxElementwise);
  return Status::success();
}

// A command whose kernel can also write its output's FP16 copy for the F16-weight matmul recorded
// right after it (see CudaBackend::producer_writes_matmul_input).
struct Producer {
  // The command's closure writing also (xs, scales), `group` rows of out per GEMM row, and out itself
  // only where `store_out` (or where its kernel needs out to make the copy); empty when its kernel
  // cannot write the copy.
  using WithHalf =
      std::function<cuda::PassRecorder::Enqueue(uint16_t* xs, float* scales, int group, bool store_out)>;
  const char* op = nullptr;
  CommandSig sig;
  Tensor out;
  uint64_t pass = 0, recorded = 0;
  WithHalf with_half;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : options_(options) {}

  Status open() {
    if (options_.audit_only) {
      device_text_ = "audit only (no device opened)";
      return Status::success();
    }
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::Unsupported,
                    cat("cuda backend: no usable CUDA device: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                        ")",
                        err == cudaErrorInsufficientDriver
                            ? "; the NVIDIA driver is missing or older than this build's CUDA runtime"
                            : ""));
    }
    KEV_CHECK(count > 0, ErrorCode::Unsupported, "cuda backend: no CUDA device found");
    KEV_CHECK(options_.device >= 0 && options_.device < count, ErrorCode::InvalidRequest, "cuda backend: device ",
              options_.device, " does not exist; this machine has ", count, " CUDA device(s) (0..", count - 1, ")");
    device_ = options_.device;
    KEV_CUDA_TRY(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    KEV_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
    KEV_CHECK(prop.major >= kMinComputeMajor, ErrorCode::Unsupported, "cuda backend: ", prop.name, " is sm_",
              prop.major, prop.minor, "; the CUDA backend needs sm_80 (Ampere) or newer");
    const cudaError_t image = cuda::probe_kernel_image();
    if (image != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::Unsupported, cat("cuda backend: this build has no kernels for ", prop.name, " (sm_",
                                                prop.major, prop.minor, "): ", cudaGetErrorString(image),
                                                "; rebuild with CMAKE_CUDA_ARCHITECTURES including ", prop.major,
                                                prop.minor));
    }
    int runtime = 0;
    KEV_CUDA_TRY(cudaRuntimeGetVersion(&runtime));
    pool_ = std::make_shared<cuda::DevicePool>(device_);
    recorder_ = std::make_unique<cuda::PassRecorder>(device_, pool_, options_.cuda_graphs);
    KEV_TRY(recorder_->init());
    KEV_ASSIGN_OR_RETURN(gemm_workspace_, pool_->acquire(kGemmWorkspace));
    KEV_TRY(gemm_.init(gemm_workspace_, kGemmWorkspace));
    total_memory_ = prop.totalGlobalMem;
    sm_count_ = prop.multiProcessorCount;
    device_text_ = cat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                       std::round(static_cast<double>(prop.totalGlobalMem) / double(1ull << 30) * 10) / 10,
                       " GiB), CUDA runtime ", runtime / 1000, ".", (runtime % 1000) / 10, ", cuBLASLt ",
                       gemm_.cublaslt_version(), options_.cuda_graphs ? ", graphs" : ", no graphs",
                       options_.cuda_attention_f16 ? ", FP16 attention" : "");
    return Status::success();
  }

  ~CudaBackend() override {
    if (gemm_workspace_) pool_->release(gemm_workspace_);
  }

  BackendInfo info() const override {
    BackendInfo bi;
    bi.name = "cuda";
    bi.device = device_text_;
    bi.activation_dtype = DType::F32;
    if (total_memory_) bi.max_buffer_bytes = total_memory_;
    return bi;
  }

  bool supports(const OpDesc& desc) const override;

  CudaPoolStats pool_stats() const { return pool_ ? pool_->stats() : CudaPoolStats{}; }
  std::optional<DeviceMemory> memory() const override {
    const CudaPoolStats p = pool_stats();
    return DeviceMemory{p.bytes_in_use, p.bytes_cached, p.device_allocations};
  }
  void next_op_is_last_reader(const Tensor& x) override {
    if (recorder_) last_reader_ = LastReader{f32p(x), recorder_->pass_serial(), recorder_->recorded()};
  }
  int matmul_k_splits(int64_t n, int64_t k, int64_t m) const { return cuda::k_splits(n, k, m, sm_count_); }

  CudaGraphStats graph_stats() const {
    CudaGraphStats s;
    if (recorder_) {
      s.captures = recorder_->graph_captures();
      s.launches = recorder_->graph_launches();
      s.cached = recorder_->cached_graphs();
      s.capture_failures = recorder_->capture_failures();
      s.commands = recorder_->recorded();
    }
    return s;
  }

  // ---- memory ---------------------------------------------------------------------------------
  Result<std::shared_ptr<Buffer>> alloc(size_t bytes, BufferUsage usage) override {
    KEV_TRY(ready("alloc"));
    Result<void*> block = pool_->acquire(bytes);
    if (!block.ok()) {
      // Cached blocks may still be named by recorded commands: run them before freeing the cache.
      KEV_TRY(recorder_->flush());
      pool_->trim();
      block = pool_->acquire(bytes);
    }
    KEV_TRY(block.status());
    return std::shared_ptr<Buffer>(std::make_shared<CudaBuffer>(pool_, block.value(), bytes, usage));
  }

  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    KEV_TRY(ready("upload"));
    KEV_TRY(check_transfer("upload", dst, bytes, true));
    KEV_CHECK(src != nullptr || bytes == 0, ErrorCode::InvalidRequest, "upload: source pointer is null");
    if (bytes == 0) return Status::success();
    const bool weights = static_cast<const CudaBuffer*>(dst.buffer)->usage() == BufferUsage::Weights;
    if (weights || (recorder_->empty() && bytes > kSyncUploadBytes)) {
      KEV_TRY(recorder_->flush());  // keeps the order with anything recorded before
      KEV_CUDA_TRY(cudaSetDevice(device_));
      KEV_CUDA_TRY(cudaMemcpyAsync(dptr<char>(dst), src, bytes, cudaMemcpyHostToDevice, recorder_->stream()));
      KEV_CUDA_TRY(cudaStreamSynchronize(recorder_->stream()));
      return Status::success();
    }
    return recorder_->record_upload(dptr<char>(dst), src, bytes);
  }

  Status download(const Tensor& src, void* dst, size_t bytes) override {
    KEV_TRY(ready("download"));
    KEV_TRY(check_transfer("download", src, bytes, true));
    KEV_CHECK(dst != nullptr || bytes == 0, ErrorCode::InvalidRequest, "download: destination pointer is null");
    KEV_TRY(recorder_->flush());
    if (bytes == 0) return Status::success();
    KEV_CUDA_TRY(cudaSetDevice(device_));
    KEV_CUDA_TRY(cudaMemcpyAsync(dst, dptr<char>(src), bytes, cudaMemcpyDeviceToHost, recorder_->stream()));
    KEV_CUDA_TRY(cudaStreamSynchronize(recorder_->stream()));
    return Status::success();
  }

  Status fill_zero(const Tensor& dst) override {
    KEV_TRY(ready("fill_zero"));
    KEV_TRY(check_transfer("fill_zero", dst, 0, false));
    const size_t bytes = dst.span_bytes();
    if (bytes == 0) return Status::success();
    char* p = dptr<char>(dst);
    CommandSig sig;
    sig.word(bytes);
    sig.ptr(p);
    const bool now = recorder_->empty();
    recorder_->record("fill_zero", sig, [=](cudaStream_t s) -> Status {
      KEV_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, s));
      return Status::success();
    });
    return now ? recorder_->flush() : Status::success();
  }

  Status synchronize() override {
    KEV_TRY(ready("synchronize"));
    return recorder_->flush();
  }

  // ---- ops ----------------------------------------------------------------------------------------
  Status embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    constexpr const char* kOp = "embedding";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_embedding(bound(kOp), table, ids, out));
    KEV_TRY(check_grid(bound(kOp), "n", ids.shape[0]));
    return record_gather(kOp, table, ids, out);
  }

  Status gather_rows(const Tensor& x, const Tensor& idx, const Tensor& out) override {
    constexpr const char* kOp = "gather_rows";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_gather_rows(bound(kOp), x, idx, out));
    KEV_TRY(check_grid(bound(kOp), "m", idx.shape[0]));
    return record_gather(kOp, x, idx, out);
  }

  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    constexpr const char* kOp = "rms_norm";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_rms_norm(bound(kOp), x, w, out));
    cuda::NormArgs a;
    a.kind = cuda::NormKind::Rms;
    a.w = f32p(w);
    return record_norm(kOp, a, x, Tensor{}, w, out, eps);
  }

  Status add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) override {
    constexpr const char* kOp = "add_rms_norm";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_add_rms_norm(bound(kOp), x, y, w, out));
    cuda::NormArgs a;
    a.kind = cuda::NormKind::AddRms;
    a.w = f32p(w);
    a.z = f32p(y);
    a.z_rows = rows_of(y);
    a.z_scales = pending_rescale(y, Tensor{}, true);
    a.sum = f32p(x);
    if (a.z_scales && last_scaled_.planes) {
      a.z_planes = last_scaled_.planes;
      a.z_n_planes = last_scaled_.n_planes;
      if (!cuda::norm_takes_planes(with_rows(a, x, out, eps))) {
        a.z_scales = a.z_planes = nullptr;  // the matmul adds its planes itself
        a.z_n_planes = 0;
      }
    }
    return record_norm(kOp, a, x, y, w, out, eps);
  }

  Status l2_norm(const Tensor& x, float eps, float scale, const Tensor& out) override {
    constexpr const char* kOp = "l2_norm";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_l2_norm(bound(kOp), x, out));
    KEV_TRY(check_rows(bound(kOp), x));
    cuda::NormArgs a;
    a.kind = cuda::NormKind::L2;
    a.scale = scale;
    cuda::GdnPrepArgs part;
    part.norms[0] = with_rows(a, x, out, eps);
    part.n_norms = 1;
    KEV_ASSIGN_OR_RETURN(const bool joined, join_gdn_prep(part, norm_sig(x, Tensor{}, Tensor{}, out, eps, scale), {x}, {out}));
    if (joined) return Status::success();
    KEV_TRY(record_norm(kOp, a, x, Tensor{}, Tensor{}, out, eps));
    note_gdn_prep(part, norm_sig(x, Tensor{}, Tensor{}, out, eps, scale), {x}, {out});
    return Status::success();
  }

  Status rms_norm_gated(const Tensor& o, const Tensor& z, const Tensor& w, float eps, const Tensor& out) override {
    constexpr const char* kOp = "rms_norm_gated";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_rms_norm_gated(bound(kOp), o, z, w, out));
    cuda::NormArgs a;
    a.kind = cuda::NormKind::RmsGated;
    a.w = f32p(w);
    a.z = f32p(z);
    a.z_rows = rows_of(z);
    return record_norm(kOp, a, o, z, w, out, eps);
  }

  Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;

  Status causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in, const SeqLayout& layout,
                            const Tensor& out, const Tensor& state_out) override;

  Status gdn_gates(const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias, const Tensor& beta,
                   const Tensor& g) override {
    constexpr const char* kOp = "gdn_gates";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_gdn_gates(bound(kOp), b, a, a_log, dt_bias, beta, g));
    const int64_t n = b.shape[0], Hv = b.shape[1];
    KEV_TRY(check_grid(bound(kOp), "n·Hv", n * Hv));
    CommandSig sig;
    for (const Tensor* t : {&b, &a, &a_log, &dt_bias, &beta, &g}) sig_tensor(sig, *t);
    cuda::GdnPrepArgs part;
    cuda::GatesArgs& ga = part.gates;
    ga.b = f32p(b);
    ga.b_stride = b.stride[0];
    ga.a = f32p(a);
    ga.a_stride = a.stride[0];
    ga.a_log = f32p(a_log);
    ga.dt_bias = f32p(dt_bias);
    ga.beta = f32p(beta);
    ga.beta_stride = beta.stride[0];
    ga.g = f32p(g);
    ga.g_stride = g.stride[0];
    ga.n = n;
    ga.Hv = Hv;
    KEV_ASSIGN_OR_RETURN(const bool joined, join_gdn_prep(part, sig, {b, a, a_log, dt_bias}, {beta, g}));
    if (joined) return Status::success();
    recorder_->record(kOp, sig, [=](cudaStream_t s) { return launched(cuda::launch_gdn_gates(ga, s), kOp); });
    note_gdn_prep(part, std::move(sig), {b, a, a_log, dt_bias}, {beta, g});
    return Status::success();
  }

  Status gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state_in, const SeqLayout& layout, const Tensor& out,
                          const Tensor& state_out) override;

  Status rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) override;

  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k, const Tensor& prefix_v,
                   const SeqLayout& layout, float scale, const Tensor& out) override;

  Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    return record_binary("sigmoid_mul", cuda::BinaryKind::SigmoidMul, x, gate, nullptr, out);
  }
  Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    return record_binary("swiglu", cuda::BinaryKind::Swiglu, gate, up, pending_rescale(gate, up), out);
  }
  Status add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    return record_binary("add", cuda::BinaryKind::Add, a, b, nullptr, out);
  }

  Status pointer_logits(const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                        const Tensor& out) override {
    constexpr const char* kOp = "pointer_logits";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_pointer_logits(bound(kOp), u, kappa, question, out));
    const int64_t M = kappa.shape[0], P = u.shape[1], Q = u.shape[0];
    KEV_TRY(check_grid(bound(kOp), "M", M));
    CommandSig sig;
    for (const Tensor* t : {&u, &kappa, &question, &out}) sig_tensor(sig, *t);
    sig.word(scale);
    const float *up = f32p(u), *kp = f32p(kappa);
    const int32_t* qp = dptr<const int32_t>(question);
    float* op = f32p(out);
    const int64_t us = u.stride[0], ks = kappa.stride[0];
    recorder_->record(kOp, sig, [=](cudaStream_t s) {
      return launched(cuda::launch_pointer_logits(up, us, Q, kp, ks, qp, M, P, scale, op, s), kOp);
    });
    return Status::success();
  }

  Status copy(const Tensor& x, const Tensor& out) override {
    constexpr const char* kOp = "copy";
    KEV_TRY(ready(kOp));
    KEV_TRY(cpu::check_copy(bound(kOp), x, out));
    KEV_TRY(check_rows(bound(kOp), x));
    KEV_TRY(check_elementwise(bound(kOp), x));
    CommandSig sig;
    sig_tensor(sig, x);
    sig_tensor(sig, out);
    const void* xp = dptr<const void>(x);
    void* op = dptr<void>(out);
    const bool xb = x.dtype == DType::BF16, ob = out.dtype == DType::BF16;
    const cuda::Rows xr = rows_of(x), orows = rows_of(out);
    const int64_t d = x.dim(-1);
    recorder_->record(kOp, sig, [=](cudaStream_t s) {
      return launched(cuda::launch_copy(xp, xb, xr, op, ob, orows, d, s), kOp);
    });
    return Status::success();
  }

 private:
  Status ready(const char* what) const {
    KEV_CHECK(!options_.audit_only, ErrorCode::Unsupported, what,
              ": this cuda backend was opened audit-only (supports() only; no device)");
    return Status::success();
  }

  // A contiguous tensor in one of our buffers, `bytes` long: what upload/download/fill_zero accept.
  static Status check_transfer(const char* what, const Tensor& t, size_t bytes, bool check_bytes) {
    const OpCheck c = bound(what);
    KEV_TRY(cpu::check_tensor_any_rank(c, "tensor", t, {DType::F32, DType::BF16, DType::F16, DType::I32}));
    KEV_TRY(cpu::check_contiguous(c, "tensor", t));
    const size_t want = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
    KEV_CHECK(!check_bytes || bytes == want, ErrorCode::InvalidRequest, what, ": tensor ", t.describe(), " holds ",
              want, " bytes but ", bytes, " were given");
    return Status::success();
  }

  Status record_gather(const char* op, const Tensor& src, const Tensor& ids, const Tensor& out) {
    CommandSig sig;
    for (const Tensor* t : {&src, &ids, &out}) sig_tensor(sig, *t);
    const void* sp = dptr<const void>(src);
    const bool bf16 = src.dtype == DType::BF16;
    const int64_t V = src.shape[0], ss = src.stride[0], n = ids.shape[0], d = out.shape[1], os = out.stride[0];
    const int32_t* ip = dptr<const int32_t>(ids);
    float* o = f32p(out);
    recorder_->record(op, sig, [=](cudaStream_t s) {
      return launched(cuda::launch_gather_rows(sp, bf16, V, ss, ip, n, d, o, os, s), op);
    });
    return Status::success();
  }

  // a with the operands every norm has: x's and out's rows, d and eps.
  static cuda::NormArgs with_rows(cuda::NormArgs a, const Tensor& x, const Tensor& out, float eps) {
    a.x = f32p(x);
    a.x_rows = rows_of(x);
    a.out = f32p(out);
    a.out_rows = rows_of(out);
    a.d = x.dim(-1);
    a.eps = eps;
    return a;
  }

  static CommandSig norm_sig(const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& out, float eps,
                             float scale) {
    CommandSig sig;
    for (const Tensor* t : {&x, &z, &w, &out}) sig_tensor(sig, *t);
    sig.word(eps, scale);
    return sig;
  }

  Status record_norm(const char* op, cuda::NormArgs a, const Tensor& x, const Tensor& z, const Tensor& w,
                     const Tensor& out, float eps) {
    KEV_TRY(check_rows(bound(op), x));
    a = with_rows(a, x, out, eps);
    CommandSig sig = norm_sig(x, z, w, out, eps, a.scale);
    if (a.z_scales) KEV_TRY(fold_rescale(sig));
    recorder_->record(op, sig, [=](cudaStream_t s) { return launched(cuda::launch_norm(a, s), op); });
    last_norm_ = LastNorm{a, sig, recorder_->pass_serial(), recorder_->recorded()};
    noted_producer(op, std::move(sig), out,
                   [=](uint16_t* xs, float* scales, int group, bool store_out) -> cuda::PassRecorder::Enqueue {
      cuda::NormArgs b = a;
      b.half = xs;
      b.half_scales = scales;
      b.half_group = group;
      b.store_out = store_out;
      if (!cuda::norm_writes_half(b)) return {};
      return [=](cudaStream_t s) { return launched(cuda::launch_norm(b, s), op); };
    });
    return Status::success();
  }

  // A Gated DeltaNet layer's l2_norm (q, k) and gdn_gates ops, recorded back to back, run as one launch
  // (norms.cu's launch_gdn_prep, the bits of separate launches), and with the causal conv recorded right
  // before them, whose out the norms read, in its launch (causal_conv1d.cu's
  // launch_causal_conv1d_silu_joined): an op of that kind joins the command recorded just before it in
  // this pass when that command is such a launch (or the conv) with room for it (two norms, one gates),
  // the fused kernel takes it (cuda::gdn_prep_fusable, cuda::conv_prep_fusable) and it is independent
  // of the ops already there, which it would run alongside: it writes nothing they read or write and
  // reads nothing they write — except a norm reading the conv's out, which the joined kernel normalises
  // from the registers that hold it. The joined command is re-recorded with both signatures
  // (replace_last).
  Result<bool> join_gdn_prep(const cuda::GdnPrepArgs& part, const CommandSig& sig, std::initializer_list<Tensor> reads,
                             std::initializer_list<Tensor> writes) {
    GdnPrep& p = last_prep_;
    if (p.pass != recorder_->pass_serial() || p.recorded != recorder_->recorded() || p.recorded == 0) return false;
    cuda::GdnPrepArgs joined = p.args;
    if (part.n_norms > 0) {
      if (joined.n_norms == 2) return false;
      joined.norms[joined.n_norms++] = part.norms[0];
    } else {
      if (joined.gates.n * joined.gates.Hv > 0) return false;
      joined.gates = part.gates;
    }
    if (p.conv ? !cuda::conv_prep_fusable(*p.conv, joined) : !cuda::gdn_prep_fusable(joined)) return false;
    // A norm may read the conv's out: the joined kernel normalises it from the registers that hold it.
    auto read_from_registers = [&](const Tensor& t) {
      return part.n_norms > 0 &&
             std::any_of(p.conv_out.begin(), p.conv_out.end(), [&](const Tensor& o) { return o.same_view(t); });
    };
    for (const Tensor& w : writes) {
      for (const std::vector<Tensor>* ts : {&p.reads, &p.writes}) {
        for (const Tensor& t : *ts) {
          if (!disjoint(w, t)) return false;
        }
      }
    }
    for (const Tensor& r : reads) {
      for (const Tensor& t : p.writes) {
        if (!read_from_registers(t) && !disjoint(r, t)) return false;
      }
    }
    p.args = joined;
    p.sig.shape.insert(p.sig.shape.end(), sig.shape.begin(), sig.shape.end());
    p.sig.ptrs.insert(p.sig.ptrs.end(), sig.ptrs.begin(), sig.ptrs.end());
    p.reads.insert(p.reads.end(), reads);
    p.writes.insert(p.writes.end(), writes);
    const bool gates = joined.gates.n * joined.gates.Hv > 0;
    if (p.conv) {
      const cuda::ConvJoin conv = *p.conv;
      const char* op = conv_label(conv.n_segs, joined.n_norms, gates);
      KEV_TRY(recorder_->replace_last(
          op, p.sig, [=](cudaStream_t s) { return launched(cuda::launch_causal_conv1d_silu_joined(conv, joined, s), op); }));
      return true;
    }
    const char* op = !gates ? "l2_norm x2" : joined.n_norms == 2 ? "l2_norm x2 + gdn_gates" : "l2_norm + gdn_gates";
    KEV_TRY(recorder_->replace_last(op, p.sig, [=](cudaStream_t s) { return launched(cuda::launch_gdn_prep(joined, s), op); }));
    last_producer_ = Producer{};  // the norm it noted is no longer the command's only op
    return true;
  }

  // An rms_norm recorded just before a rope, in this pass, whose out is exactly the rope's x (the
  // attention layer's q and k: norm, then RoPE in place) runs with it as one launch (norms.cu's
  // launch_norm_rope, the bits of the two launches); the joined command is re-recorded with both
  // signatures (replace_last).
  Result<bool> join_norm_rope(const Tensor& x, const cuda::RopeArgs& rope, const CommandSig& sig) {
    const LastNorm& p = last_norm_;
    if (p.pass != recorder_->pass_serial() || p.recorded != recorder_->recorded() || p.recorded == 0 ||
        x.rank != 3 || x.shape[2] != p.args.d || !cuda::norm_rope_fusable(p.args, rope)) {
      return false;
    }
    CommandSig joined = p.sig;
    joined.shape.insert(joined.shape.end(), sig.shape.begin(), sig.shape.end());
    joined.ptrs.insert(joined.ptrs.end(), sig.ptrs.begin(), sig.ptrs.end());
    const cuda::NormArgs norm = p.args;
    constexpr const char* kOp = "rms_norm + rope";
    KEV_TRY(recorder_->replace_last(
        kOp, joined, [=](cudaStream_t s) { return launched(cuda::launch_norm_rope(norm, rope, s), kOp); }));
    last_producer_ = Producer{};  // the norm alone is no longer the command
    last_norm_ = LastNorm{};
    return true;
  }

  // Notes the l2_norm or gdn_gates just recorded on its own as a command the next such op may join.
  void note_gdn_prep(const cuda::GdnPrepArgs& part, CommandSig sig, std::initializer_list<Tensor> reads,
                     std::initializer_list<Tensor> writes) {
    if (!cuda::gdn_prep_fusable(part)) {
      last_prep_ = GdnPrep{};
      return;
    }
    last_prep_ = GdnPrep{part, std::move(sig), reads, writes, recorder_->pass_serial(), recorder_->recorded(), {}, {}};
  }

  // Notes the command just recorded as one whose kernel can also write out's FP16 copy for a matmul
  // (`with_half` gives that command's closure, or none where its kernel cannot).
  void noted_producer(const char* op, CommandSig sig, const Tensor& out, Producer::WithHalf with_half) {
    last_producer_ =
        Producer{op, std::move(sig), out, recorder_->pass_serial(), recorder_->recorded(), std::move(with_half)};
  }

  // When the command recorded just before an F16-weight matmul, in this pass, is a producer (a norm,
  // swiglu or sigmoid_mul) whose out is exactly the matmul's x (the same rows: one out row, or the g
  // rows [i, 0..g) of a [n, g, d] out, per GEMM row), re-records it so that it also writes x's FP16
  // copy and row scales into (xs, scales) and returns true; the matmul then skips its conversion.
  // When the forward said this matmul is x's last reader (next_op_is_last_reader, right before it),
  // the producer need not store its FP32 out at all: only the copy is read.
  Result<bool> producer_writes_matmul_input(const Tensor& x, int64_t ldx, uint16_t* xs, float* scales) {
    const Producer& p = last_producer_;
    if (!p.with_half || p.pass != recorder_->pass_serial() || p.recorded != recorder_->recorded() ||
        f32p(p.out) != f32p(x)) {
      return false;
    }
    const Tensor& o = p.out;
    const int64_t n = x.shape[0], k = x.shape[1];
    int64_t group = 0;
    if (o.rank == 2 && o.shape[0] == n && o.shape[1] == k) {
      group = 1;
    } else if (o.rank == 3 && o.shape[0] == n && o.shape[1] * o.shape[2] == k &&
               (o.shape[1] <= 1 || o.stride[1] == o.shape[2])) {
      group = o.shape[1];
    }
    if (group == 0 || (n > 1 && o.stride[0] != ldx) || group > INT_MAX) return false;
    const LastReader& lr = last_reader_;
    const bool store_out =
        !(lr.x == f32p(x) && lr.pass == recorder_->pass_serial() && lr.recorded == recorder_->recorded());
    cuda::PassRecorder::Enqueue enqueue = p.with_half(xs, scales, static_cast<int>(group), store_out);
    if (!enqueue) return false;
    CommandSig sig = p.sig;
    sig.word(group, store_out);
    sig.ptr(xs, scales);
    const char* op = p.op;
    KEV_TRY(recorder_->replace_last(op, sig, std::move(enqueue), trace_label([&] { return cat(op, " +f16 copy"); })));
    return true;
  }

  // The row scales of the F16-weight matmul recorded last, in this pass, when its GEMM needs only them
  // (no bias) and the op about to be recorded reads exactly its out: `lo` alone the same [n, m] rows, or
  // lo and hi the two halves of every row ([n, m/2] views at columns 0 and m/2: swiglu's gate and up),
  // so the op reads every value the rescale would write, each in its token's row. Else null. Checks
  // only; the op calls fold_rescale once its own operands are validated. A k-split matmul's planes
  // are added only by add_rms_norm's row kernel (takes_planes; cuda::norm_takes_planes).
  const float* pending_rescale(const Tensor& lo, const Tensor& hi, bool takes_planes = false) const {
    const ScaledMatmul& mm = last_scaled_;
    if (!mm.unscaled || mm.pass != recorder_->pass_serial() || mm.recorded != recorder_->recorded()) return nullptr;
    if (mm.planes && !takes_planes) return nullptr;
    const Tensor& o = mm.out;
    const int64_t n = o.shape[0], m = o.shape[1], half = hi.empty() ? m : m / 2;
    auto rows_of_out = [&](const Tensor& t, int64_t col) {
      return t.rank == 2 && t.shape[0] == n && t.shape[1] == half && t.stride[1] == 1 &&
             (n <= 1 || t.stride[0] == o.stride[0]) && f32p(t) == f32p(o) + col;
    };
    const bool whole = hi.empty() ? rows_of_out(lo, 0) : m % 2 == 0 && rows_of_out(lo, 0) && rows_of_out(hi, half);
    return whole ? mm.scales : nullptr;
  }

  // Re-records the matmul pending_rescale found without its row rescale, which the op recorded next
  // (whose signature `sig` gains the scales) now applies as it reads the rows.
  Status fold_rescale(CommandSig& sig) {
    ScaledMatmul& mm = last_scaled_;
    KEV_CHECK(mm.unscaled && mm.pass == recorder_->pass_serial() && mm.recorded == recorder_->recorded(),
              ErrorCode::Internal, "fold_rescale: the matmul is no longer the last command recorded");
    CommandSig msig = mm.sig;
    msig.word(uint64_t{1});  // rescale folded into the next op
    KEV_TRY(recorder_->replace_last("matmul", msig, std::move(mm.unscaled),
                                    trace_label([&] { return cat(mm.label, " rescale folded"); })));
    sig.word(uint64_t{1});  // applies the previous matmul's rescale
    sig.ptr(mm.scales, mm.planes);
    sig.word(mm.n_planes);
    mm = ScaledMatmul{};
    return Status::success();
  }

  // in_scales: from pending_rescale (x's and y's rows as the matmul just recorded left them), or null.
  Status record_binary(const char* op, cuda::BinaryKind kind, const Tensor& x, const Tensor& y,
                       const float* in_scales, const Tensor& out) {
    KEV_TRY(ready(op));
    KEV_TRY(cpu::check_binary(bound(op), x, y, out));
    KEV_TRY(check_rows(bound(op), x));
    KEV_TRY(check_elementwise(bound(op), x));
    CommandSig sig;
    for (const Tensor* t : {&x, &y, &out}) sig_tensor(sig, *t);
    if (in_scales) KEV_TRY(fold_rescale(sig));
    const float *xp = f32p(x), *yp = f32p(y);
    float* op_ = f32p(out);
    const cuda::Rows xr = rows_of(x), yr = rows_of(y), orows = rows_of(out);
    const int64_t d = x.dim(-1);
    recorder_->record(op, sig, [=](cudaStream_t s) {
      return launched(cuda::launch_binary(kind, xp, xr, yp, yr, in_scales, op_, orows, d, s), op);
    });
    noted_producer(op, std::move(sig), out,
                   [=](uint16_t* xs, float* scales, int group, bool store_out) -> cuda::PassRecorder::Enqueue {
      if (!cuda::binary_writes_half(xp, xr, yp, yr, op_, orows, d, group)) return {};
      return [=](cudaStream_t s) {
        return launched(cuda::launch_binary_half(kind, xp, xr, yp, yr, in_scales, op_, orows, d, xs, scales, group,
                                                 store_out, s),
                        op);
      };
    });
    return Status::success();
  }

  // A command's label in the per-op trace (pass_recorder.h); only built when tracing.
  template <class F>
  std::string trace_label(F&& make) const {
    return recorder_->tracing_ops() ? make() : std::string();
  }

  // `t` itself when `as_is`, else a contiguous scratch copy made before (input) or after (output) the
  // op's kernel.
  Result<float*> restaged(const Tensor& t, bool as_is, bool output, Restage& r, CommandSig& sig) {
    if (as_is) return f32p(t);
    KEV_ASSIGN_OR_RETURN(char* scratch, recorder_->scratch(static_cast<size_t>(t.numel()) * sizeof(float)));
    float* p = reinterpret_cast<float*>(scratch);
    sig.ptr(p);
    if (output) {
      r.after.push_back({p, contiguous_rows(t), f32p(t), rows_of(t), t.dim(-1)});
    } else {
      r.before.push_back({f32p(t), rows_of(t), p, contiguous_rows(t), t.dim(-1)});
    }
    return p;
  }

  BackendOptions options_;
  int device_ = 0;
  std::string device_text_;
  size_t total_memory_ = 0;
  int sm_count_ = 0;
  std::shared_ptr<cuda::DevicePool> pool_;
  std::unique_ptr<cuda::PassRecorder> recorder_;
  cuda::GemmRunner gemm_;
  void* gemm_workspace_ = nullptr;
  // The 16-bit copy of x made (or shared) by the last 16-bit matmul recorded, and when (see matmul()).
  struct HalfInput {
    const float* x = nullptr;
    int64_t n = 0, k = 0, ldx = 0;
    DType dtype = DType::F32;  // BF16 (rounded or split) or F16 (row-scaled)
    bool split = false;
    uint16_t* xs = nullptr;
    float* scales = nullptr;  // F16: the rows' power-of-two scales
    uint64_t pass = 0, recorded = 0;
  };
  HalfInput last_half_;
  // The last command recorded that could write a matmul's FP16 input, and when (see
  // producer_writes_matmul_input()).
  Producer last_producer_;
  // The tensor whose last reader is the op recorded next, and when that was said (next_op_is_last_reader).
  struct LastReader {
    const float* x = nullptr;
    uint64_t pass = 0, recorded = 0;
  };
  LastReader last_reader_;
  // The last causal conv or l2_norm / gdn_gates command (alone or joined), and when (see join_gdn_prep()).
  struct GdnPrep {
    cuda::GdnPrepArgs args;
    CommandSig sig;
    std::vector<Tensor> reads, writes;
    uint64_t pass = 0, recorded = 0;
    std::optional<cuda::ConvJoin> conv;  // the conv segments it starts with, if any
    std::vector<Tensor> conv_out;        // their outs
  };
  GdnPrep last_prep_;
  // The last norm command, and when (see join_norm_rope()).
  struct LastNorm {
    cuda::NormArgs args;  // its out is what norm_rope_fusable compares with the rope's x
    CommandSig sig;
    uint64_t pass = 0, recorded = 0;
  };
  LastNorm last_norm_;
  // The last F16-weight matmul without bias, and when: the op recorded right after it may take over its
  // row rescale (pending_rescale(), fold_rescale()).
  struct ScaledMatmul {
    CommandSig sig;
    Tensor out;
    const float* scales = nullptr;
    const float* planes = nullptr;  // a k-split GEMM's planes, which the folding op adds (matmul.h)
    int n_planes = 0;
    cuda::PassRecorder::Enqueue unscaled;  // the matmul's closure without the rescale
    std::string label;
    uint64_t pass = 0, recorded = 0;
  };
  ScaledMatmul last_scaled_;
  // The scratch region this pass's k-split matmuls write their planes to (see matmul()).
  struct PlanesRegion {
    float* planes = nullptr;
    size_t bytes = 0;
    uint64_t pass = 0;
  };
  PlanesRegion planes_region_;
};

Status CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  constexpr const char* kOp = "matmul";
  KEV_TRY(ready(kOp));
  KEV_TRY(check_cuda_matmul(bound(kOp), x, w, bias, out, options_.cuda_gemm));
  const int64_t n = x.shape[0], k = x.shape[1], m = w.shape[0];
  if (n == 0 || m == 0) return Status::success();
  // A single row's stride is never stepped over; cuBLASLt still wants it >= the row length.
  const int64_t ldx = n > 1 ? x.stride[0] : std::max<int64_t>(k, 1);
  const int64_t ldo = n > 1 ? out.stride[0] : std::max<int64_t>(m, 1);
  const float* xp = f32p(x);
  const void* wp = dptr<const void>(w);
  const float* bp = f32p(bias);
  float* op = f32p(out);
  CommandSig sig;
  for (const Tensor* t : {&x, &w, &bias, &out}) sig_tensor(sig, *t);
  if (k == 0) {
    recorder_->record(kOp, sig, [=](cudaStream_t s) {
      return launched(cuda::launch_bias_rows(op, ldo, bp, true, n, m, s), kOp);
    });
    return Status::success();
  }
  // 16-bit weights take x as a 16-bit copy in scratch:
  // - F16 (the default for bf16 exports): x rounded to FP16 (11 significand bits) after dividing each
  //   row by a power of two that keeps it within FP16's range (by a conversion kernel, or by the op
  //   recorded just before that produced x: producer_writes_matmul_input); a row kernel multiplies the
  //   GEMM's rows back (and adds the bias).
  // - BF16 with cuda_gemm f16 / bf16x2: x as hi + lo BF16 halves stacked into one GEMM of 2n rows (W
  //   read once, ~16 significand bits of x kept); with bf16: x rounded to BF16 (8 bits).
  // docs/numerics.md gives each one's end-to-end error.
  const bool half = w.dtype != DType::F32;
  const bool split = w.dtype == DType::BF16 && options_.cuda_gemm != CudaGemm::BF16;
  const int64_t rows = split ? 2 * n : n;
  // F16 weights without bias may split k into slices whose planes are added after the GEMM, by a row
  // kernel with the rescale or by the add_rms_norm that reads the product (matmul.h).
  const int splits = w.dtype == DType::F16 && !bp ? cuda::k_splits(n, k, m, sm_count_) : 1;
  const int64_t wsize = static_cast<int64_t>(dtype_size(w.dtype)), slice = k / splits;
  cuda::GemmShape shape;
  shape.n = rows;
  shape.k = k;
  shape.m = m;
  shape.ldx = half ? k : ldx;
  const bool out_in_scratch = split || splits > 1;  // the halves or the planes, summed into out after
  shape.ldo = out_in_scratch ? m : ldo;
  shape.w = w.dtype;
  shape.splits = splits;
  // The 16-bit copy, the split GEMM's output and the planes go to scratch, which is 256-byte aligned (a
  // null pointer stands for that); slices start every `slice` columns of x and W.
  shape.align_x =
      half ? cuda::column_alignment(nullptr, (k | slice) * 2) : cuda::column_alignment(xp, ldx * 4);
  shape.align_w = cuda::column_alignment(wp, (k | slice) * wsize);
  shape.align_out = out_in_scratch ? cuda::column_alignment(nullptr, m * 4) : cuda::column_alignment(op, ldo * 4);
  KEV_TRY(gemm_.prepare(shape, wp, recorder_->stream()));
  // Consecutive projections of one input (q/k/v, the four GDN projections, gate/up) share its 16-bit
  // copy: when the command recorded just before this one, in this pass, was a matmul that converted
  // (or shared) this same view of x the same way, nothing can have written x since (a matmul writes
  // only its out, which never overlaps its x), so its copy is still current.
  uint16_t* xs = nullptr;
  float* scales = nullptr;
  bool convert = false, from_producer = false;
  if (half) {
    const HalfInput& last = last_half_;
    if (last.xs != nullptr && last.x == xp && last.n == n && last.k == k && last.ldx == ldx &&
        last.dtype == w.dtype && last.split == split && last.pass == recorder_->pass_serial() &&
        last.recorded == recorder_->recorded()) {
      xs = last.xs;
      scales = last.scales;
    } else {
      KEV_ASSIGN_OR_RETURN(char* scratch, recorder_->scratch(static_cast<size_t>(rows * k) * sizeof(uint16_t)));
      xs = reinterpret_cast<uint16_t*>(scratch);
      if (w.dtype == DType::F16) {
        KEV_ASSIGN_OR_RETURN(char* sc, recorder_->scratch(static_cast<size_t>(n) * sizeof(float)));
        scales = reinterpret_cast<float*>(sc);
        KEV_ASSIGN_OR_RETURN(from_producer, producer_writes_matmul_input(x, ldx, xs, scales));
      }
      convert = !from_producer;
    }
    sig.ptr(xs);
    sig.ptr(scales);
    sig.word(convert, from_producer);
  }
  float* planes = nullptr;
  if (splits > 1) {
    // Planes are dead once the command after their matmul is recorded (their sum, or the add_rms_norm
    // that adds them, runs before anything recorded later: one stream), so a pass's split matmuls share
    // one region, grown when a larger one comes.
    const size_t bytes = static_cast<size_t>(splits * n * m) * sizeof(float);
    PlanesRegion& r = planes_region_;
    if (r.pass != recorder_->pass_serial() || r.bytes < bytes) {
      KEV_ASSIGN_OR_RETURN(char* scratch, recorder_->scratch(bytes));
      r = PlanesRegion{reinterpret_cast<float*>(scratch), bytes, recorder_->pass_serial()};
    }
    planes = r.planes;
    sig.ptr(planes);
    sig.word(splits);
  }
  float* halves = nullptr;
  if (split) {
    KEV_ASSIGN_OR_RETURN(char* scratch, recorder_->scratch(static_cast<size_t>(rows * m) * sizeof(float)));
    halves = reinterpret_cast<float*>(scratch);
    sig.ptr(halves);
  }
  const cuda::GemmRunner* gemm = &gemm_;
  const DType wdt = w.dtype;
  // `rescale` false: the op recorded next multiplies the rows by their scales (fold_rescale).
  auto enqueue = [=](bool rescale) -> cuda::PassRecorder::Enqueue {
    return [=](cudaStream_t s) -> Status {
      if (convert && wdt == DType::F16) {
        KEV_TRY(launched(cuda::launch_f32_to_f16_rows_scaled(xp, ldx, xs, scales, n, k, s), "matmul input to f16"));
      } else if (convert) {
        KEV_TRY(launched(cuda::launch_f32_to_bf16_rows(xp, ldx, xs, n, k, split, s), "matmul input to bf16"));
      }
      if (split) {
        KEV_TRY(gemm->enqueue(shape, xs, wp, halves, s));
        return launched(cuda::launch_planes_sum_rows(halves, 2, n, m, nullptr, bp, op, ldo, s), "matmul split sum");
      }
      if (planes) {
        KEV_TRY(gemm->enqueue(shape, xs, wp, planes, s));
        if (!rescale) return Status::success();
        return launched(cuda::launch_planes_sum_rows(planes, splits, n, m, scales, nullptr, op, ldo, s),
                        "matmul k-slice sum");
      }
      KEV_TRY(gemm->enqueue(shape, xs ? static_cast<const void*>(xs) : xp, wp, op, s));
      if (scales && rescale) {
        return launched(cuda::launch_scale_bias_rows(op, ldo, scales, bp, n, m, s), "matmul row rescale");
      }
      if (bp) KEV_TRY(launched(cuda::launch_bias_rows(op, ldo, bp, false, n, m, s), "matmul bias"));
      return Status::success();
    };
  };
  std::string label = trace_label([&] {
    return cat("matmul n=", n, " k=", k, " m=", m, " ", dtype_name(w.dtype), split ? "x2" : "",
               splits > 1 ? cat(" in ", splits, " k slices") : std::string(),
               from_producer ? " x from producer" : convert || !half ? "" : " shared x");
  });
  recorder_->record(kOp, sig, enqueue(true), label);
  if (half) {
    last_half_ = HalfInput{xp, n, k, ldx, w.dtype, split, xs, scales, recorder_->pass_serial(), recorder_->recorded()};
  }
  if (scales && !bp) {
    last_scaled_ = ScaledMatmul{std::move(sig),          out, scales, planes, planes ? splits : 0, enqueue(false),
                                std::move(label),        recorder_->pass_serial(), recorder_->recorded()};
  }
  return Status::success();
}

Status CudaBackend::causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in,
                                       const SeqLayout& layout, const Tensor& out, const Tensor& state_out) {
  constexpr const char* kOp = "causal_conv1d_silu";
  KEV_TRY(ready(kOp));
  KEV_TRY(cpu::check_causal_conv1d_silu(bound(kOp), x, w, state_in, out, state_out));
  KEV_TRY(cpu::check_layout(kOp, layout, x.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  KEV_TRY(check_grid(bound(kOp), "n_tokens", x.shape[0]));
  KEV_TRY(check_grid(bound(kOp), "n_seqs", layout.n_seqs()));
  KEV_ASSIGN_OR_RETURN(const int32_t* offsets, recorder_->offsets(layout));
  cuda::ConvArgs a;
  a.x = f32p(x);
  a.x_stride = x.stride[0];
  a.w = f32p(w);
  a.prefix = layout.from_prefix ? f32p(state_in) : nullptr;
  a.out = f32p(out);
  a.out_stride = out.stride[0];
  a.state_out = f32p(state_out);
  a.offsets = offsets;
  a.n_tokens = x.shape[0];
  a.C = x.shape[1];
  a.K = w.shape[1];
  a.n_seqs = static_cast<int>(layout.n_seqs());
  CommandSig sig;
  for (const Tensor* t : {&x, &w, &state_in, &out, &state_out}) sig_tensor(sig, *t);
  sig.word(layout.n_seqs(), layout.from_prefix);
  sig.ptr(offsets);
  // A fused state + score pass's question rows right after its state, from the state the conv just
  // recorded writes: one launch (cuda::ConvJoin).
  GdnPrep& p = last_prep_;
  if (p.conv && p.conv->n_segs == 1 && p.args.n_norms == 0 && p.args.gates.n * p.args.gates.Hv == 0 &&
      p.pass == recorder_->pass_serial() && p.recorded == recorder_->recorded() && p.recorded > 0) {
    cuda::ConvJoin pair = *p.conv;
    pair.seg[1] = a;
    pair.n_segs = 2;
    bool apart = disjoint(x, out);  // beyond the kernel's conditions: nothing else shared between the two
    for (const Tensor& t : p.reads) apart = apart && disjoint(out, t);
    for (const Tensor& t : p.writes) apart = apart && disjoint(out, t) && disjoint(x, t);
    if (apart && cuda::conv_prep_fusable(pair, cuda::GdnPrepArgs{})) {
      p.conv = pair;
      p.sig.shape.insert(p.sig.shape.end(), sig.shape.begin(), sig.shape.end());
      p.sig.ptrs.insert(p.sig.ptrs.end(), sig.ptrs.begin(), sig.ptrs.end());
      p.reads.insert(p.reads.end(), {x, w, state_in});
      p.writes.push_back(out);
      p.conv_out.push_back(out);
      const char* op = conv_label(2, 0, false);
      return recorder_->replace_last(op, p.sig, [=](cudaStream_t s) {
        return launched(cuda::launch_causal_conv1d_silu_joined(pair, cuda::GdnPrepArgs{}, s), op);
      });
    }
  }
  recorder_->record(kOp, sig, [=](cudaStream_t s) { return launched(cuda::launch_causal_conv1d_silu(a, s), kOp); });
  cuda::ConvJoin one;
  one.seg[0] = a;
  last_prep_ = GdnPrep{cuda::GdnPrepArgs{}, std::move(sig), {x, w, state_in}, {out, state_out},
                       recorder_->pass_serial(), recorder_->recorded(), one, {out}};
  return Status::success();
}

Status CudaBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                     const Tensor& beta, const Tensor& state_in, const SeqLayout& layout,
                                     const Tensor& out, const Tensor& state_out) {
  constexpr const char* kOp = "gated_delta_rule";
  KEV_TRY(ready(kOp));
  KEV_TRY(check_gdn(bound(kOp), q, k, v, g, beta, state_in, out, state_out));
  KEV_TRY(cpu::check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  KEV_TRY(check_grid(bound(kOp), "n_seqs", layout.n_seqs()));
  const float* sin = layout.from_prefix ? f32p(state_in) : nullptr;
  float* sout = f32p(state_out);
  const size_t state_bytes = static_cast<size_t>(v.shape[1] * q.shape[2] * v.shape[2]) * sizeof(float);
  CommandSig sig;
  for (const Tensor* t : {&q, &k, &v, &g, &beta, &state_in, &out, &state_out}) sig_tensor(sig, *t);
  sig.word(layout.n_seqs(), layout.from_prefix);
  if (q.shape[0] == 0) {
    // No tokens: the final state is the initial one.
    if (!sout) return Status::success();
    recorder_->record(kOp, sig, [=](cudaStream_t s) -> Status {
      if (sin == sout) return Status::success();
      if (sin) {
        KEV_CUDA_TRY(cudaMemcpyAsync(sout, sin, state_bytes, cudaMemcpyDeviceToDevice, s));
      } else {
        KEV_CUDA_TRY(cudaMemsetAsync(sout, 0, state_bytes, s));
      }
      return Status::success();
    });
    return Status::success();
  }
  KEV_ASSIGN_OR_RETURN(const int32_t* offsets, recorder_->offsets(layout));
  const int64_t n = q.shape[0], Hk = q.shape[1], dk = q.shape[2], Hv = v.shape[1], dv = v.shape[2];
  // The kernel wants heads contiguous within a token, one token stride for q and k and one for g and
  // beta; other views (e.g. per-head padded q/k) go through contiguous copies.
  const bool qk_ok = (Hk <= 1 || (q.stride[1] == dk && k.stride[1] == dk)) && same_stride(q, k, 0);
  const bool gates_ok = same_stride(g, beta, 0);
  const bool v_ok = Hv <= 1 || v.stride[1] == dv, out_ok = Hv <= 1 || out.stride[1] == dv;
  Restage restage;
  KEV_ASSIGN_OR_RETURN(float* qp, restaged(q, qk_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* kp, restaged(k, qk_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* vp, restaged(v, v_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* gp, restaged(g, gates_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* bp, restaged(beta, gates_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* op, restaged(out, out_ok, true, restage, sig));
  cuda::GdnArgs a;
  a.q = qp;
  a.k = kp;
  a.qk_token_stride = qk_ok ? q.stride[0] : Hk * dk;
  a.v = vp;
  a.v_token_stride = v_ok ? v.stride[0] : Hv * dv;
  a.g = gp;
  a.beta = bp;
  a.gate_token_stride = gates_ok ? g.stride[0] : Hv;
  a.state_in = sin;
  a.out = op;
  a.out_token_stride = out_ok ? out.stride[0] : Hv * dv;
  a.state_out = sout;
  a.offsets = offsets;
  a.n_seqs = static_cast<int>(layout.n_seqs());
  a.n_tokens = static_cast<int>(n);
  a.Hk = static_cast<int>(Hk);
  a.Hv = static_cast<int>(Hv);
  a.dk = static_cast<int>(dk);
  a.dv = static_cast<int>(dv);
  a.short_seqs = layout.longest() <= cuda::kGdnChunkTokens;
  sig.word(a.short_seqs);
  // state_out may be the identical view of state_in (a state pass updating its snapshot in place);
  // the kernel then reads a copy, so it never depends on the order its blocks read and write.
  float* state_copy = nullptr;
  if (sin && sout && sin == sout) {
    KEV_ASSIGN_OR_RETURN(char* c, recorder_->scratch(state_bytes));
    state_copy = reinterpret_cast<float*>(c);
    a.state_in = state_copy;
  }
  KEV_ASSIGN_OR_RETURN(char* ws, recorder_->scratch(cuda::gated_delta_rule_workspace_bytes(a)));
  sig.ptr(offsets, state_copy, ws);
  recorder_->record(kOp, sig, [=](cudaStream_t s) -> Status {
    KEV_TRY(Restage::run(restage.before, s));
    if (state_copy) KEV_CUDA_TRY(cudaMemcpyAsync(state_copy, sin, state_bytes, cudaMemcpyDeviceToDevice, s));
    KEV_TRY(launched(cuda::launch_gated_delta_rule(a, ws, s), kOp));
    return Restage::run(restage.after, s);
  }, trace_label([&] {
    return cat(kOp, " n=", n, " seqs=", layout.n_seqs(), " Hv=", Hv, restage.before.empty() ? "" : " restaged");
  }));
  return Status::success();
}

Status CudaBackend::rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) {
  constexpr const char* kOp = "rope";
  KEV_TRY(ready(kOp));
  KEV_TRY(cpu::check_rope(bound(kOp), x));
  KEV_TRY(cpu::check_layout(kOp, layout, x.shape[0]));
  const int64_t hd = x.shape[2];
  KEV_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= hd, ErrorCode::InvalidRequest, kOp, ": n_rot = ", n_rot,
            " must be even and within [0, head size ", hd, "]");
  KEV_CHECK(theta > 0 && std::isfinite(theta), ErrorCode::InvalidRequest, kOp, ": theta = ", theta,
            " must be positive and finite");
  KEV_TRY(check_grid(bound(kOp), "n_tokens·n_rot/2", x.shape[0] * (n_rot / 2)));
  KEV_TRY(check_grid(bound(kOp), "n_seqs", layout.n_seqs()));
  if (n_rot == 0 || x.shape[0] == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(const int32_t* offsets, recorder_->offsets(layout));
  cuda::RopeArgs a;
  a.x = f32p(x);
  a.stride_token = x.stride[0];
  a.stride_head = x.stride[1];
  a.n_tokens = x.shape[0];
  a.H = x.shape[1];
  a.n_rot = n_rot;
  a.theta = theta;
  a.pos0 = layout.pos0;
  a.offsets = offsets;
  a.n_seqs = static_cast<int>(layout.n_seqs());
  CommandSig sig;
  sig_tensor(sig, x);
  sig.word(n_rot, theta, layout.pos0, layout.n_seqs());
  sig.ptr(offsets);
  KEV_ASSIGN_OR_RETURN(const bool joined, join_norm_rope(x, a, sig));
  if (joined) return Status::success();
  recorder_->record(kOp, sig, [=](cudaStream_t s) { return launched(cuda::launch_rope(a, s), kOp); });
  return Status::success();
}

Status CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                              const Tensor& prefix_v, const SeqLayout& layout, float scale, const Tensor& out) {
  constexpr const char* kOp = "attention";
  KEV_TRY(ready(kOp));
  KEV_TRY(check_attn(bound(kOp), q, k, v, prefix_k, prefix_v, out));
  KEV_TRY(cpu::check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !prefix_k.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but prefix_k / prefix_v are empty");
  KEV_TRY(check_grid(bound(kOp), "n_seqs", layout.n_seqs()));
  if (q.shape[0] == 0) return Status::success();
  const bool use_prefix = layout.from_prefix && prefix_k.shape[0] > 0;
  KEV_ASSIGN_OR_RETURN(const int32_t* offsets, recorder_->offsets(layout));
  // The kernel takes one set of strides for k and v and contiguous prefix K/V; other views go through
  // contiguous copies.
  const bool kv_ok = same_stride(k, v, 0) && same_stride(k, v, 1);
  const bool prefix_ok = !use_prefix || (prefix_k.is_contiguous() && prefix_v.is_contiguous());
  CommandSig sig;
  for (const Tensor* t : {&q, &k, &v, &prefix_k, &prefix_v, &out}) sig_tensor(sig, *t);
  Restage restage;
  KEV_ASSIGN_OR_RETURN(float* kp, restaged(k, kv_ok, false, restage, sig));
  KEV_ASSIGN_OR_RETURN(float* vp, restaged(v, kv_ok, false, restage, sig));
  float *pkp = nullptr, *pvp = nullptr;
  if (use_prefix) {
    KEV_ASSIGN_OR_RETURN(pkp, restaged(prefix_k, prefix_ok, false, restage, sig));
    KEV_ASSIGN_OR_RETURN(pvp, restaged(prefix_v, prefix_ok, false, restage, sig));
  }
  const int64_t Hkv = k.shape[1], hd = q.shape[2];
  cuda::AttentionArgs a;
  a.q = f32p(q);
  a.q_token_stride = q.stride[0];
  a.q_head_stride = q.stride[1];
  a.k = kp;
  a.v = vp;
  a.kv_token_stride = kv_ok ? k.stride[0] : Hkv * hd;
  a.kv_head_stride = kv_ok ? k.stride[1] : hd;
  a.prefix_k = pkp;
  a.prefix_v = pvp;
  a.prefix_len = use_prefix ? prefix_k.shape[0] : 0;
  a.out = f32p(out);
  a.out_token_stride = out.stride[0];
  a.out_head_stride = out.stride[1];
  a.offsets = offsets;
  a.n_seqs = static_cast<int>(layout.n_seqs());
  a.n_tokens = static_cast<int>(q.shape[0]);
  a.H = static_cast<int>(q.shape[1]);
  a.Hkv = static_cast<int>(Hkv);
  a.hd = static_cast<int>(hd);
  a.scale = scale;
  a.f16 = options_.cuda_attention_f16;
  a.splits = cuda::attention_split_count(a);
  KEV_ASSIGN_OR_RETURN(char* ws, recorder_->scratch(cuda::attention_workspace_bytes(a)));
  sig.word(scale, layout.n_seqs(), use_prefix, a.splits, a.f16);
  sig.ptr(offsets, ws);
  recorder_->record(kOp, sig, [=](cudaStream_t s) -> Status {
    KEV_TRY(Restage::run(restage.before, s));
    return launched(cuda::launch_attention(a, ws, s), kOp);
  }, trace_label([&] {
    return cat(kOp, a.f16 ? " f16" : "", " n=", a.n_tokens, " seqs=", a.n_seqs, " prefix=", a.prefix_len,
               restage.before.empty() ? "" : " restaged");
  }));
  return Status::success();
}

bool CudaBackend::supports(const OpDesc& desc) const {
  const std::vector<Tensor>& t = desc.operands;
  const OpCheck c = shapes(op_name(desc.op));
  // The CPU's operand rules, except where the CUDA kernels differ (matmul dtypes, the GDN and attention
  // kernels' shape limits).
  switch (desc.op) {
    case OpKind::Matmul: return t.size() == 4 && check_cuda_matmul(c, t[0], t[1], t[2], t[3], options_.cuda_gemm).ok();
    case OpKind::GatedDeltaRule:
      return t.size() == 8 && check_gdn(c, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]).ok();
    case OpKind::Attention: return t.size() == 6 && check_attn(c, t[0], t[1], t[2], t[3], t[4], t[5]).ok();
    default: return cpu::check_op_desc(c, desc);
  }
}

}  // namespace

Result<std::shared_ptr<Backend>> create_cuda_backend(const BackendOptions& options) {
  auto backend = std::make_shared<CudaBackend>(options);
  KEV_TRY(backend->open());
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<CudaPoolStats> cuda_pool_stats(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  KEV_CHECK(b != nullptr, ErrorCode::InvalidRequest, "cuda_pool_stats: backend '", backend.info().name,
            "' is not a CUDA backend");
  return b->pool_stats();
}

Result<CudaGraphStats> cuda_graph_stats(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  KEV_CHECK(b != nullptr, ErrorCode::InvalidRequest, "cuda_graph_stats: backend '", backend.info().name,
            "' is not a CUDA backend");
  return b->graph_stats();
}

Result<int> cuda_matmul_k_splits(const Backend& backend, int64_t n, int64_t k, int64_t m) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  KEV_CHECK(b != nullptr, ErrorCode::InvalidRequest, "cuda_matmul_k_splits: backend '", backend.info().name,
            "' is not a CUDA backend");
  return b->matmul_k_splits(n, k, m);
}

}  // namespace kev
