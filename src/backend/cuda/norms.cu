// Row normalisations over the innermost dimension d (rows = every outer index of a rank 1..4 view):
//
//   rms_norm:       out = x / sqrt(mean(x²) + eps) · (1 + w)        (zero-centred gain)
//   l2_norm:        out = x / sqrt(Σx² + eps) · scale
//   rms_norm_gated: out = w · o / sqrt(mean(o²) + eps) · SiLU(z)    (plain gain)
//
// Layout: x/o, z, out [..., d] with free outer strides (Rows), innermost contiguous; w [d].
// Launch: one warp per row, 8 rows per 256-thread block (grid.x = ceil(rows / 8)); a lane strides over
// the row, so loads are coalesced per warp. The sum of squares is an FP32 warp reduction; the second
// pass re-reads the row (an L1/L2 hit). Rows are independent, so out may be the identical view of x
// (in place): every lane reads its elements before writing them and no lane reads another's.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

template <NormKind kKind>
__global__ void norm_kernel(NormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2]) return;
  const float* x = a.x + row_offset(a.x_rows, row);
  float* out = a.out + row_offset(a.out_rows, row);
  float ss = 0.0f;
  for (int64_t j = lane; j < a.d; j += 32) ss += x[j] * x[j];
  ss = warp_sum(ss);
  if constexpr (kKind == NormKind::Rms) {
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
    for (int64_t j = lane; j < a.d; j += 32) out[j] = x[j] * inv * (1.0f + a.w[j]);
  } else if constexpr (kKind == NormKind::L2) {
    const float f = a.scale / sqrtf(ss + a.eps);
    for (int64_t j = lane; j < a.d; j += 32) out[j] = x[j] * f;
  } else {
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
    const float* z = a.z + row_offset(a.z_rows, row);
    for (int64_t j = lane; j < a.d; j += 32) out[j] = a.w[j] * (x[j] * inv) * siluf(z[j]);
  }
}

}  // namespace

cudaError_t launch_norm(const NormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x_rows.count();
  if (rows == 0 || a.d == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const int threads = 32 * kWarpsPerBlock;
  switch (a.kind) {
    case NormKind::Rms: norm_kernel<NormKind::Rms><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::L2: norm_kernel<NormKind::L2><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::RmsGated: norm_kernel<NormKind::RmsGated><<<grid, threads, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

}  // namespace kev::cuda
