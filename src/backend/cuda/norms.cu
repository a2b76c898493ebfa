// Row normalisations over the innermost dimension d (rows = every outer index of a rank 1..4 view):
//
//   rms_norm:       out = x / sqrt(mean(x²) + eps) · (1 + w)        (zero-centred gain)
//   l2_norm:        out = x / sqrt(Σx² + eps) · scale
//   rms_norm_gated: out = w · o / sqrt(mean(o²) + eps) · SiLU(z)    (plain gain)
//
// Layout: x/o, z, out [..., d] with free outer strides (Rows), innermost contiguous; w [d].
// Launch: one warp per row, 4 rows per 128-thread block (grid.x = ceil(rows / 4): Kev's passes have a
// few hundred rows, so small blocks spread them over more SMs); a lane strides over the row, so loads
// are coalesced per warp, as float4 when d % 4 == 0 and every row of x, z, out and w is 16-byte
// aligned (scalar otherwise). The sum of squares is an FP32 warp reduction; the second
// pass re-reads the row (an L1/L2 hit). Rows are independent, so out may be the identical view of x
// (in place): every lane reads its elements before writing them and no lane reads another's.
#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

template <NormKind kKind>
__global__ void norm_vec4_kernel(NormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2]) return;
  const float* x = a.x + row_offset(a.x_rows, row);
  float* out = a.out + row_offset(a.out_rows, row);
  float ss = 0.0f;
  // Unrolled so that several loads per lane are in flight (a row of 1-4 K floats is 2-8 steps).
#pragma unroll 4
  for (int64_t j = 4 * lane; j < a.d; j += 128) {
    const float4 v = ld4(x + j);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warp_sum(ss);
  const float* z = kKind == NormKind::RmsGated ? a.z + row_offset(a.z_rows, row) : nullptr;
  const float f =
      kKind == NormKind::L2 ? a.scale / sqrtf(ss + a.eps) : 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
#pragma unroll 4
  for (int64_t j = 4 * lane; j < a.d; j += 128) {
    const float4 v = ld4(x + j);
    float4 r;
    if constexpr (kKind == NormKind::Rms) {
      const float4 w = ld4(a.w + j);
      r = make_float4(v.x * f * (1.0f + w.x), v.y * f * (1.0f + w.y), v.z * f * (1.0f + w.z), v.w * f * (1.0f + w.w));
    } else if constexpr (kKind == NormKind::L2) {
      r = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
    } else {
      const float4 w = ld4(a.w + j), zz = ld4(z + j);
      r = make_float4(w.x * (v.x * f) * siluf(zz.x), w.y * (v.y * f) * siluf(zz.y), w.z * (v.z * f) * siluf(zz.z),
                      w.w * (v.w * f) * siluf(zz.w));
    }
    *reinterpret_cast<float4*>(out + j) = r;
  }
}

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

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool rows_vec4(const Rows& r) {
  for (int i = 0; i < r.n_outer; ++i) {
    if (r.shape[i] > 1 && r.stride[i] % 4 != 0) return false;
  }
  return true;
}

}  // namespace

cudaError_t launch_norm(const NormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x_rows.count();
  if (rows == 0 || a.d == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const int threads = 32 * kWarpsPerBlock;
  const bool gated = a.kind == NormKind::RmsGated;
  const bool vec4 = a.d % 4 == 0 && aligned16(a.x) && aligned16(a.out) && rows_vec4(a.x_rows) &&
                    rows_vec4(a.out_rows) && (a.kind == NormKind::L2 || aligned16(a.w)) &&
                    (!gated || (aligned16(a.z) && rows_vec4(a.z_rows)));
  if (vec4) {
    switch (a.kind) {
      case NormKind::Rms: norm_vec4_kernel<NormKind::Rms><<<grid, threads, 0, stream>>>(a); break;
      case NormKind::L2: norm_vec4_kernel<NormKind::L2><<<grid, threads, 0, stream>>>(a); break;
      case NormKind::RmsGated: norm_vec4_kernel<NormKind::RmsGated><<<grid, threads, 0, stream>>>(a); break;
    }
    return cudaGetLastError();
  }
  switch (a.kind) {
    case NormKind::Rms: norm_kernel<NormKind::Rms><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::L2: norm_kernel<NormKind::L2><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::RmsGated: norm_kernel<NormKind::RmsGated><<<grid, threads, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

}  // namespace kev::cuda
