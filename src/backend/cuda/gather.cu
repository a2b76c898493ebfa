// Row gathers: embedding lookup and gather_rows (both are out[i,:] = src[ids[i],:]).
//
//   src [V, d] F32 or BF16 (row stride free), ids [n] I32, out [n, d] F32 (row stride free).
// Launch: one block of 256 threads per output row (grid.x = n); threads stride over d, with float4
// loads/stores when d, both row strides and both base pointers allow 16-byte access (F32 source).
// BF16 rows are widened exactly. An id outside [0, V) is not an error here (checking would need a
// synchronisation): its row is filled with NaN so the mistake shows instead of reading out of bounds.
#include <cmath>

#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;

template <bool kBf16, bool kVec4>
__global__ void gather_kernel(const void* __restrict__ src, int64_t V, int64_t src_stride,
                              const int32_t* __restrict__ ids, int64_t d, float* __restrict__ out,
                              int64_t out_stride) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  float* o = out + i * out_stride;
  if (id < 0 || id >= V) {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = NAN;
    return;
  }
  if constexpr (kBf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src) + id * src_stride;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = bf16_bits_to_f32(s[j]);
  } else if constexpr (kVec4) {
    const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(src) + id * src_stride);
    float4* o4 = reinterpret_cast<float4*>(o);
    for (int64_t j = threadIdx.x; j < d / 4; j += blockDim.x) o4[j] = s[j];
  } else {
    const float* s = static_cast<const float*>(src) + id * src_stride;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = s[j];
  }
}


}  // namespace

cudaError_t launch_gather_rows(const void* src, bool src_bf16, int64_t V, int64_t src_stride, const int32_t* ids,
                               int64_t n, int64_t d, float* out, int64_t out_stride, cudaStream_t stream) {
  if (n == 0 || d == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n));
  if (src_bf16) {
    gather_kernel<true, false><<<grid, kThreads, 0, stream>>>(src, V, src_stride, ids, d, out, out_stride);
  } else if (d % 4 == 0 && src_stride % 4 == 0 && out_stride % 4 == 0 && aligned16(src) && aligned16(out)) {
    gather_kernel<false, true><<<grid, kThreads, 0, stream>>>(src, V, src_stride, ids, d, out, out_stride);
  } else {
    gather_kernel<false, false><<<grid, kThreads, 0, stream>>>(src, V, src_stride, ids, d, out, out_stride);
  }
  return cudaGetLastError();
}

}  // namespace kev::cuda
