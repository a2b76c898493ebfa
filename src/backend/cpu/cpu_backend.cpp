// CpuBackend: memory, transfers, supports() and the op entry points. Each op validates and runs in
// the kernel files (ops.h); this file only routes, and turns exceptions from allocation inside the
// kernels into Status values so nothing throws across the Backend interface.
#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "backend/cpu/blas.h"
#include "backend/cpu/matmul_row_invariant.h"
#include "backend/cpu/ops.h"

namespace kev {

namespace {

using cpu::Exec;
using cpu::HostBuffer;
using cpu::OpCheck;

constexpr int kMaxThreads = 1024;

const char* arch_name() {
#if defined(__x86_64__) || defined(_M_X64)
  return "x86-64";
#elif defined(__aarch64__)
  return "arm64";
#else
  return "unknown-arch";
#endif
}

template <class Fn>
Status guarded(const char* op, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::Device, cat(op, ": out of host memory"));
  } catch (const std::exception& ex) {
    return Status(ErrorCode::Internal, cat(op, ": ", ex.what()));
  }
}

// A contiguous tensor in one of our buffers, `bytes` long: what upload/download/fill_zero accept.
Status check_transfer(const char* what, const Tensor& t, size_t bytes, bool check_bytes) {
  const OpCheck c{what, true};
  KEV_TRY(cpu::check_tensor_any_rank(c, "tensor", t, {DType::F32, DType::BF16, DType::F16, DType::I32}));
  KEV_TRY(cpu::check_contiguous(c, "tensor", t));
  const size_t want = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
  KEV_CHECK(!check_bytes || bytes == want, ErrorCode::InvalidRequest, what, ": tensor ", t.describe(), " holds ", want,
            " bytes but ", bytes, " were given");
  return Status::success();
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool reference, bool row_invariant_matmul)
      : threads_(threads), reference_(reference), row_invariant_matmul_(row_invariant_matmul),
        pool_(reference ? 1 : threads) {
    if (!reference_) openblas_set_num_threads(threads_);
  }

  BackendInfo info() const override {
    BackendInfo bi;
    bi.name = "cpu";
    bi.device = reference_ ? cat(arch_name(), ", 1 thread, reference mode (plain loops, no BLAS)")
                           : cat(arch_name(), ", ", threads_, threads_ == 1 ? " thread, " : " threads, ",
                                 row_invariant_matmul_
                                     ? cat("row-invariant matmul (", cpu::gemm_row_invariant_isa(), "), ")
                                     : std::string(),
                                 openblas_get_config());
    bi.activation_dtype = DType::F32;
    return bi;
  }

  bool supports(const OpDesc& desc) const override;

  Result<std::shared_ptr<Buffer>> alloc(size_t bytes, BufferUsage) override {
    std::unique_ptr<HostBuffer> b = HostBuffer::create(bytes);
    if (!b) return Status(ErrorCode::Device, cat("cpu: cannot allocate ", bytes, " bytes of host memory"));
    return std::shared_ptr<Buffer>(std::move(b));
  }

  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    KEV_TRY(check_transfer("upload", dst, bytes, true));
    KEV_CHECK(src != nullptr || bytes == 0, ErrorCode::InvalidRequest, "upload: source pointer is null");
    if (bytes) std::memcpy(cpu::data_ptr<char>(dst), src, bytes);
    return Status::success();
  }

  Status download(const Tensor& src, void* dst, size_t bytes) override {
    KEV_TRY(check_transfer("download", src, bytes, true));
    KEV_CHECK(dst != nullptr || bytes == 0, ErrorCode::InvalidRequest, "download: destination pointer is null");
    if (bytes) std::memcpy(dst, cpu::data_ptr<const char>(src), bytes);
    return Status::success();
  }

  Status fill_zero(const Tensor& dst) override {
    KEV_TRY(check_transfer("fill_zero", dst, 0, false));
    std::memset(cpu::data_ptr<char>(dst), 0, dst.span_bytes());
    return Status::success();
  }

  Status synchronize() override { return Status::success(); }

  Status embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    return guarded("embedding", [&] { return cpu::embedding(exec(), table, ids, out); });
  }
  Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    return guarded("rms_norm", [&] { return cpu::rms_norm(exec(), x, w, eps, out); });
  }
  Status add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) override {
    return guarded("add_rms_norm", [&] { return cpu::add_rms_norm(exec(), x, y, w, eps, out); });
  }
  Status matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override {
    return guarded("matmul", [&] { return cpu::matmul(exec(), x, w, bias, out); });
  }
  Status causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in, const SeqLayout& layout,
                            const Tensor& out, const Tensor& state_out) override {
    return guarded("causal_conv1d_silu",
                   [&] { return cpu::causal_conv1d_silu(exec(), x, w, state_in, layout, out, state_out); });
  }
  Status gdn_gates(const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias, const Tensor& beta,
                   const Tensor& g) override {
    return guarded("gdn_gates", [&] { return cpu::gdn_gates(exec(), b, a, a_log, dt_bias, beta, g); });
  }
  Status l2_norm(const Tensor& x, float eps, float scale, const Tensor& out) override {
    return guarded("l2_norm", [&] { return cpu::l2_norm(exec(), x, eps, scale, out); });
  }
  Status gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                          const Tensor& state_in, const SeqLayout& layout, const Tensor& out,
                          const Tensor& state_out) override {
    return guarded("gated_delta_rule",
                   [&] { return cpu::gated_delta_rule(exec(), q, k, v, g, beta, state_in, layout, out, state_out); });
  }
  Status rms_norm_gated(const Tensor& o, const Tensor& z, const Tensor& w, float eps, const Tensor& out) override {
    return guarded("rms_norm_gated", [&] { return cpu::rms_norm_gated(exec(), o, z, w, eps, out); });
  }
  Status rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) override {
    return guarded("rope", [&] { return cpu::rope(exec(), x, layout, n_rot, theta); });
  }
  Status attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k, const Tensor& prefix_v,
                   const SeqLayout& layout, float scale, const Tensor& out) override {
    return guarded("attention",
                   [&] { return cpu::attention(exec(), q, k, v, prefix_k, prefix_v, layout, scale, out); });
  }
  Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    return guarded("sigmoid_mul", [&] { return cpu::sigmoid_mul(exec(), x, gate, out); });
  }
  Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    return guarded("swiglu", [&] { return cpu::swiglu(exec(), gate, up, out); });
  }
  Status add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    return guarded("add", [&] { return cpu::add(exec(), a, b, out); });
  }
  Status gather_rows(const Tensor& x, const Tensor& idx, const Tensor& out) override {
    return guarded("gather_rows", [&] { return cpu::gather_rows(exec(), x, idx, out); });
  }
  Status pointer_logits(const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                        const Tensor& out) override {
    return guarded("pointer_logits", [&] { return cpu::pointer_logits(exec(), u, kappa, question, scale, out); });
  }
  Status copy(const Tensor& x, const Tensor& out) override {
    return guarded("copy", [&] { return cpu::copy(exec(), x, out); });
  }

 private:
  Exec exec() { return Exec{pool_, reference_, row_invariant_matmul_}; }

  int threads_;
  bool reference_;
  bool row_invariant_matmul_;
  cpu::ThreadPool pool_;
};

bool CpuBackend::supports(const OpDesc& desc) const {
  return cpu::check_op_desc(OpCheck{op_name(desc.op), false}, desc);
}

}  // namespace

bool cpu::check_op_desc(const OpCheck& c, const OpDesc& desc) {
  const std::vector<Tensor>& t = desc.operands;
  auto arity = [&](size_t n) { return t.size() == n; };
  switch (desc.op) {
    case OpKind::Embedding: return arity(3) && check_embedding(c, t[0], t[1], t[2]).ok();
    case OpKind::RmsNorm: return arity(3) && check_rms_norm(c, t[0], t[1], t[2]).ok();
    case OpKind::AddRmsNorm: return arity(4) && check_add_rms_norm(c, t[0], t[1], t[2], t[3]).ok();
    case OpKind::Matmul: return arity(4) && check_matmul(c, t[0], t[1], t[2], t[3]).ok();
    case OpKind::CausalConv1dSilu:
      return arity(5) && check_causal_conv1d_silu(c, t[0], t[1], t[2], t[3], t[4]).ok();
    case OpKind::GdnGates: return arity(6) && check_gdn_gates(c, t[0], t[1], t[2], t[3], t[4], t[5]).ok();
    case OpKind::L2Norm: return arity(2) && check_l2_norm(c, t[0], t[1]).ok();
    case OpKind::GatedDeltaRule:
      return arity(8) && check_gated_delta_rule(c, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]).ok();
    case OpKind::RmsNormGated: return arity(4) && check_rms_norm_gated(c, t[0], t[1], t[2], t[3]).ok();
    case OpKind::Rope: return arity(1) && check_rope(c, t[0]).ok();
    case OpKind::Attention: return arity(6) && check_attention(c, t[0], t[1], t[2], t[3], t[4], t[5]).ok();
    case OpKind::SigmoidMul:
    case OpKind::Swiglu:
    case OpKind::Add: return arity(3) && check_binary(c, t[0], t[1], t[2]).ok();
    case OpKind::GatherRows: return arity(3) && check_gather_rows(c, t[0], t[1], t[2]).ok();
    case OpKind::PointerLogits: return arity(4) && check_pointer_logits(c, t[0], t[1], t[2], t[3]).ok();
    case OpKind::Copy: return arity(2) && check_copy(c, t[0], t[1]).ok();
    case OpKind::kCount: return false;
  }
  return false;
}

Result<std::shared_ptr<Backend>> create_cpu_backend(const BackendOptions& options) {
  KEV_CHECK(options.threads >= 0 && options.threads <= kMaxThreads, ErrorCode::InvalidRequest,
            "cpu backend: threads = ", options.threads, " must be in [0, ", kMaxThreads, "] (0 = all cores)");
  int threads = options.threads;
  if (threads == 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  try {
    return std::shared_ptr<Backend>(
        std::make_shared<CpuBackend>(threads, options.reference_mode, options.row_invariant_matmul));
  } catch (const std::exception& ex) {
    return Status(ErrorCode::Device, cat("cpu backend: cannot start ", threads, " threads: ", ex.what()));
  }
}

}  // namespace kev
