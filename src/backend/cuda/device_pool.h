// A size-class caching allocator over cudaMalloc, and the Buffer type the CUDA backend hands out.
//
//   auto pool = std::make_shared<DevicePool>(device);
//   KEV_ASSIGN_OR_RETURN(void* p, pool->acquire(bytes));   // a cached block of the class, or cudaMalloc
//   pool->release(p);                                       // back to the cache, not to the driver
//
// Size classes: requests up to 1 MiB round up to a power of two (at least 256 bytes), larger ones to a
// multiple of 2 MiB, so a freed block is reused by any later request of the same class (the engine's
// per-pass arenas and scratch come back with the same sizes). Blocks go back to the driver only through
// trim() (the backend calls it when cudaMalloc fails, after running its pending commands) and in the
// destructor.
// No managed memory. Not thread-safe: the backend is used from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace kev::cuda {

class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {}
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  static size_t class_size(size_t bytes);
  // A block of at least `bytes` (256-byte aligned): a cached one of the class, else cudaMalloc. Fails
  // with the cudaMalloc error; the caller may drain its pending work, trim() and retry (a cached block
  // may still be referenced by recorded commands, so the pool never frees one on its own).
  Result<void*> acquire(size_t bytes);
  void release(void* ptr);
  // Frees every cached (unused) block back to the driver.
  void trim();
  CudaPoolStats stats() const { return stats_; }

 private:
  int device_;
  std::unordered_map<void*, size_t> live_;               // block -> class size
  std::unordered_map<size_t, std::vector<void*>> free_;  // class size -> cached blocks
  CudaPoolStats stats_;
};

// Device memory from the pool. Its block returns to the pool when the last reference goes; the pool
// stays alive as long as any buffer does.
class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(std::shared_ptr<DevicePool> pool, void* ptr, size_t size, BufferUsage usage)
      : pool_(std::move(pool)), ptr_(ptr), size_(size), usage_(usage) {}
  ~CudaBuffer() override { pool_->release(ptr_); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  size_t size() const override { return size_; }
  void* handle() const override { return ptr_; }
  BufferUsage usage() const { return usage_; }

 private:
  std::shared_ptr<DevicePool> pool_;
  void* ptr_;
  size_t size_;
  BufferUsage usage_;
};

}  // namespace kev::cuda
