// The small-n FP16 GEMM of the F16-weight projections (Kev's evaluation passes, n ≈ 220–256 rows):
// out[n,m] = (x16[n,k] · W16[m,k]ᵀ) · row_scale + bias, FP32 accumulation. Math, layout and launch
// shape are documented in gemm_f16_small.cu; cuBLASLt (matmul.h) runs every other GEMM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kev::cuda {

// The most rows the kernel takes (two 128-row tiles): Kev's evaluation passes have 220–256; the
// 2,187-token prefill stays on cuBLASLt.
constexpr int64_t kGemmF16SmallMaxRows = 256;
// The widest output it is chosen for by default (gemm_f16_small_preferred): at most 16 output tiles,
// where cuBLASLt's kernels run far below its rate on wide outputs (gemm_f16_small.cu, "Dispatch").
constexpr int64_t kGemmF16SmallMaxCols = 1024;

struct GemmF16SmallArgs {
  const uint16_t* x = nullptr;  // [n, k] FP16, contiguous (row stride k)
  const uint16_t* w = nullptr;  // [m, k] FP16, contiguous
  float* out = nullptr;         // [n, m] FP32, row stride ldo
  int64_t ldo = 0;
  const float* row_scales = nullptr;  // [n] or null: out row i multiplied by row_scales[i] (the F16 rescale)
  const float* bias = nullptr;        // [m] or null: added after the scale, as one fmaf
  int64_t n = 0, k = 0, m = 0;
};

// Whether the kernel can run on the current device: sm_90 code in this binary and cluster launch
// (the split-K reduction goes through distributed shared memory). Asked of the driver once per device;
// also opts the kernel into its shared memory, so call it before capturing a launch.
bool gemm_f16_small_available();

// The shapes and alignments the kernel takes (its preconditions; byte alignments as
// column_alignment() gives them): 1 <= n <= kGemmF16SmallMaxRows, k a positive multiple of 16, m >= 1,
// x and W rows 16-byte aligned, out rows 8-byte aligned.
bool gemm_f16_small_supported(int64_t n, int64_t k, int64_t m, int align_x, int align_w, int align_out);

// Whether the kernel is the default choice for an output of m columns (m <= kGemmF16SmallMaxCols).
bool gemm_f16_small_preferred(int64_t m);

// Enqueues the kernel: a function of the shapes only (grid, cluster and split-K count), never of the
// values, so a captured graph stays valid. Requires gemm_f16_small_supported() and _available().
cudaError_t launch_gemm_f16_small(const GemmF16SmallArgs& a, cudaStream_t stream);

}  // namespace kev::cuda
