// DevicePool (see device_pool.h).
#include "backend/cuda/device_pool.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace kev::cuda {

namespace {
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{2} << 20;
constexpr size_t kMinBlock = 256;
}  // namespace

DevicePool::~DevicePool() {
  // Buffers keep the pool alive, so nothing is live here except blocks leaked by a bug; free all.
  cudaSetDevice(device_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
  }
  for (auto& [p, size] : live_) cudaFree(p);
}

size_t DevicePool::class_size(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes <= kSmallLimit) {
    size_t c = kMinBlock;
    while (c < bytes) c <<= 1;
    return c;
  }
  if (bytes > SIZE_MAX - kLargeGranule) return 0;
  return (bytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

Result<void*> DevicePool::acquire(size_t bytes) {
  const size_t cls = class_size(bytes);
  KEV_CHECK(cls != 0, ErrorCode::InvalidRequest, "cuda: cannot allocate ", bytes, " bytes");
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    live_.emplace(p, cls);
    stats_.bytes_cached -= cls;
    stats_.blocks_cached -= 1;
    stats_.bytes_in_use += cls;
    stats_.reuses += 1;
    return p;
  }
  KEV_CUDA_TRY(cudaSetDevice(device_));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, cls);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return Status(ErrorCode::Device, cat("cuda: cannot allocate ", bytes, " bytes (block of ", cls, "): ",
                                         cudaGetErrorString(err), "; device has ", free_bytes, " of ", total_bytes,
                                         " bytes free, the pool holds ", stats_.bytes_in_use, " in use"));
  }
  live_.emplace(p, cls);
  stats_.bytes_in_use += cls;
  stats_.device_allocations += 1;
  return p;
}

void DevicePool::release(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  const size_t cls = it->second;
  live_.erase(it);
  free_[cls].push_back(ptr);
  stats_.bytes_in_use -= cls;
  stats_.bytes_cached += cls;
  stats_.blocks_cached += 1;
}

void DevicePool::trim() {
  cudaSetDevice(device_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
    blocks.clear();
  }
  stats_.bytes_cached = 0;
  stats_.blocks_cached = 0;
}

}  // namespace kev::cuda
