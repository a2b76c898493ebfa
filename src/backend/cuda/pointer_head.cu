// Pointer-head logits: out[j] = (kappa[j] · u[question[j]]) · scale.
//
// Layout: u [Q, P], kappa [M, P] (row strides free), question [M] I32, out [M] F32.
// Launch: one warp per option j, 8 per 256-thread block (grid.x = ceil(M/8)); lanes stride over P and
// the dot product is an FP32 warp reduction. A question index outside [0, Q) is not checked on the
// host (that would need a synchronisation): the logit becomes NaN instead of reading out of bounds.
#include <cmath>

#include "backend/cuda/device_math.cuh"

namespace kev::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void pointer_logits_kernel(const float* u, int64_t u_stride, int64_t Q, const float* kappa,
                                      int64_t kappa_stride, const int32_t* question, int64_t M, int64_t P,
                                      float scale, float* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= M) return;
  const int32_t q = question[j];
  if (q < 0 || q >= Q) {
    if (lane == 0) out[j] = NAN;
    return;
  }
  const float* kr = kappa + j * kappa_stride;
  const float* ur = u + q * u_stride;
  float acc = 0.0f;
  for (int64_t p = lane; p < P; p += 32) acc += kr[p] * ur[p];
  acc = warp_sum(acc);
  if (lane == 0) out[j] = acc * scale;
}

}  // namespace

cudaError_t launch_pointer_logits(const float* u, int64_t u_stride, int64_t Q, const float* kappa,
                                  int64_t kappa_stride, const int32_t* question, int64_t M, int64_t P, float scale,
                                  float* out, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((M + kWarpsPerBlock - 1) / kWarpsPerBlock);
  pointer_logits_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(u, u_stride, Q, kappa, kappa_stride, question, M,
                                                                  P, scale, out);
  return cudaGetLastError();
}

}  // namespace kev::cuda
