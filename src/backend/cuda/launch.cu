// dependent_launches() (launch.cuh): whether the backend's launches on the current device are
// programmatic dependent launches, decided once per device.
#include "backend/cuda/launch.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kev::cuda {

namespace {

// Compiled like every other kernel of the backend: its PTX architecture tells whether the image the
// driver picked for this device has the griddepcontrol instructions (a build without sm_90 code runs
// on a Hopper from compute_80 or compute_89 PTX, whose kernels would never wait).
__global__ void image_probe_kernel() {}

constexpr int kMaxDevices = 64;
std::atomic<int> decided[kMaxDevices];  // 0: not asked yet, 1: plain launches, 2: dependent launches

bool allowed(int device) {
  const char* env = std::getenv("KEV_CUDA_PDL");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  int major = 0;
  cudaFuncAttributes attr = {};
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, image_probe_kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9 && attr.ptxVersion >= 90;
}

}  // namespace

bool dependent_launches() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  int d = decided[device].load(std::memory_order_relaxed);
  if (d == 0) {
    d = allowed(device) ? 2 : 1;
    decided[device].store(d, std::memory_order_relaxed);
  }
  return d == 2;
}

}  // namespace kev::cuda
