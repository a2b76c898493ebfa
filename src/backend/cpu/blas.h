// The CPU backend's OpenBLAS boundary: the cblas header, a size check for its 32-bit integer
// arguments, and a scope that makes BLAS single-threaded while the thread pool runs kernels that call
// BLAS from several threads at once (OpenBLAS's thread count is process-global; the backend sets it
// to its own thread count at creation, so a lone big GEMM uses every core).
#pragma once

#include <cblas.h>

#include <climits>
#include <cstdint>

namespace kev::cpu {

inline bool fits_blas_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

class BlasSingleThreaded {
 public:
  BlasSingleThreaded() : previous_(openblas_get_num_threads()) {
    if (previous_ != 1) openblas_set_num_threads(1);
  }
  ~BlasSingleThreaded() {
    if (previous_ != 1) openblas_set_num_threads(previous_);
  }
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  int previous_;
};

}  // namespace kev::cpu
