// Element-wise maps over same-shaped strided views, plus the small helpers matmul needs.
//
//   sigmoid_mul: out = x · σ(y)      swiglu: out = SiLU(x) · y      add: out = x + y
//   gdn_gates:   beta = σ(b);  g = −exp(A_log) · softplus(a + dt_bias)      b, a, beta, g [n,Hv]
//   copy:        out = x, F32/BF16 on either side (BF16: round to nearest even, NaN kept quiet)
//   f32_to_bf16_rows: matmul's x rounded to BF16 into contiguous scratch [n,k]
//   bias_rows:   out[i,:] += bias, or out[i,:] = bias (or 0) for a matmul with k = 0
//
// σ, SiLU and softplus are the overflow-free forms (device_math.cuh). FP32 throughout.
// Launch: one 256-thread block per innermost row (grid.x = rows), threads striding over d; binary maps
// use float4 when d, every row stride and every base pointer allow 16-byte access. gdn_gates: one
// thread per (token, head), 256 per block. An output may be the identical view of an input: each
// element is read by the thread that writes it, before it writes it.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool rows_vec4(const Rows& r) {
  for (int i = 0; i < r.n_outer; ++i) {
    if (r.shape[i] > 1 && r.stride[i] % 4 != 0) return false;
  }
  return true;
}

template <BinaryKind kKind>
__device__ __forceinline__ float binary_op(float x, float y) {
  if constexpr (kKind == BinaryKind::SigmoidMul) {
    return x * sigmoidf_stable(y);
  } else if constexpr (kKind == BinaryKind::Swiglu) {
    return siluf(x) * y;
  } else {
    return x + y;
  }
}

template <BinaryKind kKind, bool kVec4>
__global__ void binary_kernel(const float* x, Rows xr, const float* y, Rows yr, float* out, Rows outr, int64_t d) {
  const int64_t row = blockIdx.x;
  const float* xp = x + row_offset(xr, row);
  const float* yp = y + row_offset(yr, row);
  float* op = out + row_offset(outr, row);
  if constexpr (kVec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xp);
    const float4* y4 = reinterpret_cast<const float4*>(yp);
    float4* o4 = reinterpret_cast<float4*>(op);
    for (int64_t j = threadIdx.x; j < d / 4; j += blockDim.x) {
      const float4 a = x4[j], b = y4[j];
      o4[j] = make_float4(binary_op<kKind>(a.x, b.x), binary_op<kKind>(a.y, b.y), binary_op<kKind>(a.z, b.z),
                          binary_op<kKind>(a.w, b.w));
    }
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) op[j] = binary_op<kKind>(xp[j], yp[j]);
  }
}

template <BinaryKind kKind>
void launch_binary_kind(bool vec4, unsigned rows, const float* x, const Rows& xr, const float* y, const Rows& yr,
                        float* out, const Rows& outr, int64_t d, cudaStream_t stream) {
  if (vec4) {
    binary_kernel<kKind, true><<<rows, kThreads, 0, stream>>>(x, xr, y, yr, out, outr, d);
  } else {
    binary_kernel<kKind, false><<<rows, kThreads, 0, stream>>>(x, xr, y, yr, out, outr, d);
  }
}

__global__ void gdn_gates_kernel(const float* b, int64_t b_stride, const float* a, int64_t a_stride,
                                 const float* a_log, const float* dt_bias, float* beta, int64_t beta_stride, float* g,
                                 int64_t g_stride, int64_t n, int64_t Hv) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * Hv) return;
  const int64_t t = i / Hv, h = i % Hv;
  const float bv = b[t * b_stride + h];
  const float av = a[t * a_stride + h];
  beta[t * beta_stride + h] = sigmoidf_stable(bv);
  g[t * g_stride + h] = -expf(a_log[h]) * softplusf(av + dt_bias[h]);
}

template <bool kInBf16, bool kOutBf16>
__global__ void copy_kernel(const void* x, Rows xr, void* out, Rows outr, int64_t d) {
  const int64_t row = blockIdx.x;
  const int64_t xo = row_offset(xr, row), oo = row_offset(outr, row);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    if constexpr (kInBf16 && kOutBf16) {
      static_cast<uint16_t*>(out)[oo + j] = static_cast<const uint16_t*>(x)[xo + j];
    } else if constexpr (kInBf16) {
      static_cast<float*>(out)[oo + j] = bf16_bits_to_f32(static_cast<const uint16_t*>(x)[xo + j]);
    } else if constexpr (kOutBf16) {
      static_cast<uint16_t*>(out)[oo + j] = f32_to_bf16_bits(static_cast<const float*>(x)[xo + j]);
    } else {
      static_cast<float*>(out)[oo + j] = static_cast<const float*>(x)[xo + j];
    }
  }
}

__global__ void f32_to_bf16_rows_kernel(const float* x, int64_t ldx, uint16_t* dst, int64_t k) {
  const int64_t row = blockIdx.x;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dst[row * k + j] = f32_to_bf16_bits(x[row * ldx + j]);
}

template <bool kOverwrite>
__global__ void bias_rows_kernel(float* out, int64_t ld, const float* bias, int64_t m) {
  float* o = out + static_cast<int64_t>(blockIdx.x) * ld;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    if constexpr (kOverwrite) {
      o[j] = bias ? bias[j] : 0.0f;
    } else {
      o[j] += bias[j];
    }
  }
}

}  // namespace

cudaError_t launch_binary(BinaryKind kind, const float* x, const Rows& xr, const float* y, const Rows& yr, float* out,
                          const Rows& outr, int64_t d, cudaStream_t stream) {
  const int64_t rows = xr.count();
  if (rows == 0 || d == 0) return cudaSuccess;
  const bool vec4 = d % 4 == 0 && rows_vec4(xr) && rows_vec4(yr) && rows_vec4(outr) && aligned16(x) &&
                    aligned16(y) && aligned16(out);
  const unsigned grid = static_cast<unsigned>(rows);
  switch (kind) {
    case BinaryKind::SigmoidMul:
      launch_binary_kind<BinaryKind::SigmoidMul>(vec4, grid, x, xr, y, yr, out, outr, d, stream);
      break;
    case BinaryKind::Swiglu:
      launch_binary_kind<BinaryKind::Swiglu>(vec4, grid, x, xr, y, yr, out, outr, d, stream);
      break;
    case BinaryKind::Add: launch_binary_kind<BinaryKind::Add>(vec4, grid, x, xr, y, yr, out, outr, d, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_gdn_gates(const float* b, int64_t b_stride, const float* a, int64_t a_stride, const float* a_log,
                             const float* dt_bias, float* beta, int64_t beta_stride, float* g, int64_t g_stride,
                             int64_t n, int64_t Hv, cudaStream_t stream) {
  const int64_t total = n * Hv;
  if (total == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  gdn_gates_kernel<<<grid, kThreads, 0, stream>>>(b, b_stride, a, a_stride, a_log, dt_bias, beta, beta_stride, g,
                                                  g_stride, n, Hv);
  return cudaGetLastError();
}

cudaError_t launch_copy(const void* x, bool x_bf16, const Rows& xr, void* out, bool out_bf16, const Rows& outr,
                        int64_t d, cudaStream_t stream) {
  const int64_t rows = xr.count();
  if (rows == 0 || d == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(rows);
  if (x_bf16 && out_bf16) {
    copy_kernel<true, true><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, d);
  } else if (x_bf16) {
    copy_kernel<true, false><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, d);
  } else if (out_bf16) {
    copy_kernel<false, true><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, d);
  } else {
    copy_kernel<false, false><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, d);
  }
  return cudaGetLastError();
}

cudaError_t launch_f32_to_bf16_rows(const float* x, int64_t ldx, uint16_t* dst, int64_t n, int64_t k,
                                    cudaStream_t stream) {
  if (n == 0 || k == 0) return cudaSuccess;
  f32_to_bf16_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, ldx, dst, k);
  return cudaGetLastError();
}

cudaError_t launch_bias_rows(float* out, int64_t ld, const float* bias, bool overwrite, int64_t n, int64_t m,
                             cudaStream_t stream) {
  if (n == 0 || m == 0 || (!bias && !overwrite)) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(n);
  if (overwrite) {
    bias_rows_kernel<true><<<grid, kThreads, 0, stream>>>(out, ld, bias, m);
  } else {
    bias_rows_kernel<false><<<grid, kThreads, 0, stream>>>(out, ld, bias, m);
  }
  return cudaGetLastError();
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, bias_rows_kernel<false>);
}

}  // namespace kev::cuda
