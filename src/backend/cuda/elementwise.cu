// Element-wise maps over same-shaped strided views, plus the small helpers matmul needs.
//
//   sigmoid_mul: out = x · σ(y)      swiglu: out = SiLU(x) · y      add: out = x + y
//   gdn_gates:   beta = σ(b);  g = −exp(A_log) · softplus(a + dt_bias)      b, a, beta, g [n,Hv]
//   copy:        out = x, F32/BF16 on either side (BF16: round to nearest even, NaN kept quiet)
//   f32_to_bf16_rows: matmul's x rounded to BF16 into contiguous scratch [n,k], or split x = hi + lo
//                     into [2n,k] (hi rows, then lo rows); planes_sum_rows adds the GEMM's two halves
//   f32_to_f16_rows_scaled: matmul's x for F16 weights: row i divided by a power of two s_i (exact) and
//                     rounded to FP16 into [n,k] scratch, s_i to scales[i]: s_i = 1 when max|x_i| lies in
//                     [2^-10, 2^15], else the s_i putting max|x_i| / s_i in [2^14, 2^15], so FP16's
//                     65,504 is never exceeded and small rows keep 11 significant bits;
//                     scale_bias_rows then multiplies the GEMM's row i by s_i (and adds the bias)
//   planes_sum_rows: out[i,:] = (Σ_p planes[p][i,:]) · s_i (+ bias) for a k-split GEMM's planes
//                     (matmul.h) or a split-input GEMM's two halves (s_i = 1)
//   bias_rows:   out[i,:] += bias, or out[i,:] = bias (or 0) for a matmul with k = 0
//
// σ, SiLU and softplus are the overflow-free forms (device_math.cuh). FP32 throughout.
// Launch: binary maps: one thread per float4 (when d, every row stride and every base pointer allow
// 16-byte access; else per float) of the flattened [rows, d] space, 256 per block, grid.x =
// ceil(rows·d / (4·256)); when the map also writes the FP16 copy of its out for the next matmul
// (binary_half, float4 path only, f16_rows.cuh's rule, `group` rows of out per GEMM row: sigmoid_mul's
// H heads of a token): with kOptimisticMinGemmRows GEMM rows or more (Kev's long prefills) the same
// grid writes it optimistically (f16_rows.cuh: FP16 as if s = 1, one atomic max per warp into the GEMM
// row's zeroed scale slot), then f16_rows_fixup, one 128-thread block per GEMM row, turns the max into
// the scale and converts the rare rows with s != 1 again from out; fewer rows take one block per GEMM
// row, the row's max needing the whole row, of about one thread per two float4s of the row
// (row_threads: 32..512; 4B swiglu's 2,304 float4s get 512 threads), a thread issuing all its loads of
// x and y (up to 5 float4s each per chunk) before computing, and converting the outputs it holds in
// registers (rows past 2,560 float4s: earlier chunks read back from L2). When the matmul reading the
// copy is out's last reader (the backend's next_op_is_last_reader), out is not stored: the block per
// row stores only the chunks it reads back, the optimistic grid none, its fix-up mapping x and y again
// (H200, 2026-12-03, `KEV_CUDA_TRACE=ops`, 4B short evaluation: swiglu +f16 18.8 → 16.0 us a call,
// with the 5-float4 chunk that holds the 4B's rows in registers). At its 64 registers a
// 1,024-thread block took a whole SM's register file, so the 4B's 220-250 swiglu rows ran in two waves;
// capped at 512 threads two blocks share an SM (H200, 2026-12-02, `KEV_CUDA_TRACE=ops`, 4B short
// passes, same run: 20.5 / 19.8 → 19.3 / 18.9 us a call; the 0.8B's 448-thread rows unchanged;
// docs/backends.md). H200, `KEV_CUDA_TRACE=ops`,
// 2026-12-02, per call, block per row → optimistic: 4B 2,187-token prefill swiglu 140.5 → 101.0 us,
// sigmoid_mul 61.1 → 53.7; 0.8B swiglu 52.7 → 45.4; but 0.8B short passes (220-250 rows) swiglu 9.7 →
// 12.4 us, sigmoid_mul 9.0 → 11.2 (the memset and the fix-up launch cost more than the block-wide max
// there). An earlier 256-thread block looping over the row with one pair of loads in flight ran at
// ~15 % of DRAM bandwidth (4B short prefill, 250 x 9216 swiglu: 25.3 us under Nsight Compute); holding
// 12 float4s a thread in 256-thread blocks had been tried before and was slower (101 → 170 us on the
// long prefill). copy: one thread per element of the flattened [rows, d] space, 256 per
// block (F32 to F32 under the binary maps' float4 conditions: one thread per float4; the per-element
// kernel reached 1.67 TB/s on the H200, which kev_benchmark --ceilings reported as the copy ceiling).
// gdn_gates: one thread per (token, head), 256 per block. f32_to_bf16_rows: grid
// (n, min(ceil(k / (4·256)), 65535)), a thread converting 4 consecutive values (float4 in, 8 bytes
// out) per step when x's rows are 16-byte aligned and k % 4 == 0, else one value per step (grid.y
// from ceil(k / 256)). f32_to_f16_rows_scaled: one block per row of row_threads(k / 4) threads as
// binary_half's short passes (the row's max needs the whole row), the row loaded in one burst and
// converted from registers, with float4 loads and 8-byte stores under f32_to_bf16_rows' conditions
// (else per value).
// scale_bias_rows: one 256-thread block per row. planes_sum_rows: grid (rows,
// ceil(m / 256)), a thread per output element. An output may be the identical
// view of an input: each element is read by the thread that writes it, before it writes it.
// Binary maps right after the F16-weight matmul that wrote x and y (swiglu's gate and up; in_scales):
// the thread reading an element multiplies it by its row's scale and stores the product back where the
// scale is not 1 (f16_rows.cuh), before it writes out.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/f16_rows.cuh"

namespace kev::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kFixupThreads = 128;  // per GEMM row; most rows only turn their max into scale 1



// float4 or float access for the vector and scalar paths (binary maps, the F16 conversion).
template <int V>
struct VecOfT {
  using type = float;
};
template <>
struct VecOfT<4> {
  using type = float4;
};
template <int V>
using VecOf = typename VecOfT<V>::type;

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

template <BinaryKind kKind>
__device__ __forceinline__ float4 binary_op4(const float4& x, const float4& y) {
  return make_float4(binary_op<kKind>(x.x, y.x), binary_op<kKind>(x.y, y.y), binary_op<kKind>(x.z, y.z),
                     binary_op<kKind>(x.w, y.w));
}

// Thread i owns float V-group i of the flattened [rows, d / V] index space: a short row (the attention
// gate's 256 floats) no longer idles most of a block, and the row lookup is one 32-bit division.
// The V values at xp and yp, multiplied by s (in_scales) and, where s is not 1, stored back.
template <int V>
__device__ __forceinline__ void load_rescaled(const float* xp, const float* yp, float s, VecOf<V>& a, VecOf<V>& b) {
  a = rescaled(*reinterpret_cast<const VecOf<V>*>(xp), s);
  b = rescaled(*reinterpret_cast<const VecOf<V>*>(yp), s);
  if (s != 1.0f) {
    *reinterpret_cast<VecOf<V>*>(const_cast<float*>(xp)) = a;
    *reinterpret_cast<VecOf<V>*>(const_cast<float*>(yp)) = b;
  }
}

// kHalf (V = 4): also out's FP16 copy, written optimistically (f16_rows.cuh): FP16(o) into half (the
// [rows / group, group·d] copy is [rows, d] row-major, so vector i lands at 4·i) and the GEMM row's
// max raised; every lane stays to the end for the warp's shuffles. out itself only if store_out (the
// fix-up then converts its rows again from x and y: FromInputs).
template <BinaryKind kKind, int V, bool kHalf = false>
__global__ void binary_kernel(const float* x, Rows xr, const float* y, Rows yr, const float* in_scales, float* out,
                              Rows outr, uint32_t dv, uint32_t total, __half* half = nullptr, float* scales = nullptr,
                              uint32_t group = 1, bool store_out = true) {
  static_assert(!kHalf || V == 4, "the FP16 copy takes the float4 path");
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (!kHalf && i >= total) return;
  float mx = 0.0f;
  uint32_t grow = ~0u;
  if (i < total) {
    const uint32_t row = i / dv, col = (i - row * dv) * V;
    float* op = out + row_offset(outr, row) + col;
    VecOf<V> a, b;
    load_rescaled<V>(x + row_offset(xr, row) + col, y + row_offset(yr, row) + col, row_scale(in_scales, row), a, b);
    if constexpr (V == 4) {
      const float4 o = binary_op4<kKind>(a, b);
      if (!kHalf || store_out) *reinterpret_cast<float4*>(op) = o;
      if constexpr (kHalf) {
        store_f16(half + 4 * static_cast<int64_t>(i), o, 1.0f);
        mx = abs_max(o);
        grow = row / group;
      }
    } else {
      *op = binary_op<kKind>(a, b);
    }
  }
  if constexpr (kHalf) raise_row_max_warp(scales, grow, mx);
}

// Where f16_rows_fixup_kernel reads a row's float4 at (row, col) again: out as stored, or, for a
// binary map that left out unwritten, the map of x and y (which hold its rescaled inputs by then).
struct FromOut {
  const float* out;
  Rows outr;
  __device__ float4 operator()(uint32_t row, uint32_t col) const {
    return *reinterpret_cast<const float4*>(out + row_offset(outr, row) + col);
  }
};
template <BinaryKind kKind>
struct FromInputs {
  const float* x;
  Rows xr;
  const float* y;
  Rows yr;
  __device__ float4 operator()(uint32_t row, uint32_t col) const {
    return binary_op4<kKind>(*reinterpret_cast<const float4*>(x + row_offset(xr, row) + col),
                             *reinterpret_cast<const float4*>(y + row_offset(yr, row) + col));
  }
};

// launch_f16_rows_fixup: one block per GEMM row (group rows of dv float4s; half that row's copy).
// The slot holds the row's max until every thread has read it, then its scale; a row whose scale is
// not 1 is converted again from src.
template <class Source>
__global__ void f16_rows_fixup_kernel(Source src, uint32_t dv, uint32_t group, __half* half, float* scales) {
  const float inv = f16_row_inverse_scale(scales[blockIdx.x]);
  __syncthreads();
  if (threadIdx.x == 0) scales[blockIdx.x] = 1.0f / inv;
  if (inv == 1.0f) return;
  const uint32_t per_row = group * dv;
  __half* h = half + static_cast<int64_t>(blockIdx.x) * per_row * 4;
  for (uint32_t e = threadIdx.x; e < per_row; e += blockDim.x) {
    const uint32_t sub = e / dv, row = blockIdx.x * group + sub;
    store_f16(h + 4 * e, src(row, (e - sub * dv) * 4), inv);
  }
}

template <class Source>
cudaError_t launch_fixup(Source src, int64_t grows, int64_t d, int group, __half* half, float* scales,
                         cudaStream_t stream) {
  if (grows == 0 || d == 0) return cudaSuccess;
  f16_rows_fixup_kernel<<<static_cast<unsigned>(grows), kFixupThreads, 0, stream>>>(
      src, static_cast<uint32_t>(d / 4), static_cast<uint32_t>(group), half, scales);
  return cudaGetLastError();
}

// The per-row kernels that need a row's max before converting (binary_half under
// kOptimisticMinGemmRows, f32_to_f16_rows_scaled): a block of row_threads(v) threads per row of v
// vectors, a thread holding up to kVecs of them in registers per chunk of blockDim.x · kVecs, all its
// loads of a chunk issued before any use; rows up to blockDim.x · kVecs vectors are one chunk and are
// converted from registers, longer ones re-read their earlier chunks (their own writes) for the
// conversion.
constexpr int kRowVecs = 4, kMaxRowThreads = 1024;
// binary_half_kernel's largest block, two per SM at its 64 registers, and its vectors a thread: five,
// so that the 4B's swiglu rows (2,304 float4s) are one chunk, converted from registers without out.
constexpr int kBinaryRowThreads = 512, kBinaryRowVecs = 5;

// About two vectors a thread (more threads in flight than bytes per thread), at most max_threads.
unsigned row_threads(int64_t vecs, int max_threads = kMaxRowThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((vecs + 63) / 64 * 32, 32, max_threads));
}

// This thread's vectors e of a row of `count`, chunk by chunk: load(e, u) for each of them into the
// caller's slot u, then use(e, u) for each. Returns where the last chunk starts (its vectors stay in
// the slots).
template <int kVecs, class Index, class Load, class Use>
__device__ __forceinline__ Index walk_row(Index count, Load&& load, Use&& use) {
  const Index chunk = blockDim.x * kVecs;
  for (Index base = 0;; base += chunk) {
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const Index e = base + threadIdx.x + u * blockDim.x;
      if (e < count) load(e, u);
    }
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const Index e = base + threadIdx.x + u * blockDim.x;
      if (e < count) use(e, u);
    }
    if (base + chunk >= count) return base;
  }
}

// The FP16 copy of a walked row of `count` vectors whose largest |value| in this thread is mx: the
// row's scale to *scale, vector e to dst + V·e, the last chunk's from `held`, the earlier chunks'
// re-read by reread(e) (this thread's own values).
template <int kVecs, class Index, class Vec, class Reread>
__device__ __forceinline__ void store_row_f16(float mx, float* scale, __half* dst, Index last_chunk, Index count,
                                              const Vec (&held)[kVecs], Reread&& reread) {
  __shared__ float part[kMaxRowThreads / 32];
  constexpr int V = sizeof(Vec) / sizeof(float);
  const float inv = f16_row_inverse_scale(block_max(mx, part));
  if (threadIdx.x == 0) *scale = 1.0f / inv;
  for (Index e = threadIdx.x; e < last_chunk; e += blockDim.x) store_f16(dst + V * e, reread(e), inv);
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const Index e = last_chunk + threadIdx.x + u * blockDim.x;
    if (e < count) store_f16(dst + V * e, held[u], inv);
  }
}

// binary_half of a pass under kOptimisticMinGemmRows: one block per GEMM row (`group` rows of d
// floats), the map as binary_kernel computes it (into a's registers), stored, then the block's max and
// the FP16 copy. Without store_out only the chunks before the last are stored (they are read back).
template <BinaryKind kKind>
__global__ void __launch_bounds__(kBinaryRowThreads, 2)
    binary_half_kernel(const float* x, Rows xr, const float* y, Rows yr, const float* in_scales, float* out,
                       Rows outr, uint32_t dv, uint32_t group, __half* half, float* scales, bool store_out) {
  const uint32_t per_row = group * dv;
  // Element e of the GEMM row: float4 `col / 4` of row `row` of x, y and out.
  auto at = [&](uint32_t e, uint32_t& row, uint32_t& col) {
    const uint32_t sub = e / dv;
    col = (e - sub * dv) * 4, row = blockIdx.x * group + sub;
  };
  float4 a[kBinaryRowVecs], b[kBinaryRowVecs];
  float mx = 0.0f;
  const uint32_t chunk = blockDim.x * kBinaryRowVecs, last_start = (per_row - 1) / chunk * chunk;
  // Every load of a chunk first: out may be the identical view of x or y, which would otherwise order
  // each load after the previous element's store.
  const uint32_t last_chunk = walk_row<kBinaryRowVecs>(
      per_row,
      [&](uint32_t e, int u) {
        uint32_t row, col;
        at(e, row, col);
        a[u] = *reinterpret_cast<const float4*>(x + row_offset(xr, row) + col);
        b[u] = *reinterpret_cast<const float4*>(y + row_offset(yr, row) + col);
      },
      [&](uint32_t e, int u) {
        uint32_t row, col;
        at(e, row, col);
        const float s = row_scale(in_scales, row);
        a[u] = rescaled(a[u], s);
        b[u] = rescaled(b[u], s);
        if (s != 1.0f) {
          *reinterpret_cast<float4*>(const_cast<float*>(x) + row_offset(xr, row) + col) = a[u];
          *reinterpret_cast<float4*>(const_cast<float*>(y) + row_offset(yr, row) + col) = b[u];
        }
        a[u] = binary_op4<kKind>(a[u], b[u]);
        if (store_out || e < last_start) *reinterpret_cast<float4*>(out + row_offset(outr, row) + col) = a[u];
        mx = fmaxf(mx, abs_max(a[u]));
      });
  store_row_f16(mx, scales + blockIdx.x, half + static_cast<int64_t>(blockIdx.x) * per_row * 4, last_chunk, per_row,
                a, [&](uint32_t e) {
                  uint32_t row, col;
                  at(e, row, col);
                  return *reinterpret_cast<const float4*>(out + row_offset(outr, row) + col);
                });
}

template <BinaryKind kKind>
void launch_binary_kind(bool vec4, int64_t rows, const float* x, const Rows& xr, const float* y, const Rows& yr,
                        const float* in_scales, float* out, const Rows& outr, int64_t d, cudaStream_t stream) {
  const int V = vec4 ? 4 : 1;
  const uint32_t total = static_cast<uint32_t>(rows * (d / V));  // < kMaxElementwise (launch_binary)
  const unsigned grid = (total + kThreads - 1) / kThreads;
  if (vec4) {
    binary_kernel<kKind, 4>
        <<<grid, kThreads, 0, stream>>>(x, xr, y, yr, in_scales, out, outr, static_cast<uint32_t>(d / 4), total);
  } else {
    binary_kernel<kKind, 1>
        <<<grid, kThreads, 0, stream>>>(x, xr, y, yr, in_scales, out, outr, static_cast<uint32_t>(d), total);
  }
}

// binary_half's kernels for one kind: one block per GEMM row, or (optimistic) binary_kernel writing the
// copy as if s = 1 over the flattened grid, then the fix-up (converting again from out, or without
// out from x and y).
template <BinaryKind kKind>
cudaError_t launch_binary_half_kind(bool optimistic, int64_t rows, const float* x, const Rows& xr, const float* y,
                                    const Rows& yr, const float* in_scales, float* out, const Rows& outr, int64_t d,
                                    __half* half, float* scales, int group, bool store_out, cudaStream_t stream) {
  const uint32_t dv = static_cast<uint32_t>(d / 4), g = static_cast<uint32_t>(group);
  if (!optimistic) {
    binary_half_kernel<kKind>
        <<<static_cast<unsigned>(rows / group), row_threads(group * d / 4, kBinaryRowThreads), 0, stream>>>(
        x, xr, y, yr, in_scales, out, outr, dv, g, half, scales, store_out);
    return cudaGetLastError();
  }
  const uint32_t total = static_cast<uint32_t>(rows * dv);  // < kMaxElementwise (binary_writes_half)
  binary_kernel<kKind, 4, true><<<(total + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      x, xr, y, yr, in_scales, out, outr, dv, total, half, scales, g, store_out);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (store_out) return launch_fixup(FromOut{out, outr}, rows / group, d, group, half, scales, stream);
  return launch_fixup(FromInputs<kKind>{x, xr, y, yr}, rows / group, d, group, half, scales, stream);
}

__global__ void gdn_gates_kernel(GatesArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < a.n * a.Hv) gdn_gate(a, i);
}

template <bool kInBf16, bool kOutBf16>
__global__ void copy_kernel(const void* x, Rows xr, void* out, Rows outr, uint32_t d, uint32_t total) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const uint32_t row = i / d, j = i - row * d;
  const int64_t xo = row_offset(xr, row) + j, oo = row_offset(outr, row) + j;
  if constexpr (kInBf16 && kOutBf16) {
    static_cast<uint16_t*>(out)[oo] = static_cast<const uint16_t*>(x)[xo];
  } else if constexpr (kInBf16) {
    static_cast<float*>(out)[oo] = bf16_bits_to_f32(static_cast<const uint16_t*>(x)[xo]);
  } else if constexpr (kOutBf16) {
    static_cast<uint16_t*>(out)[oo] = f32_to_bf16_bits(static_cast<const float*>(x)[xo]);
  } else {
    static_cast<float*>(out)[oo] = static_cast<const float*>(x)[xo];
  }
}

__global__ void copy_f32x4_kernel(const float* x, Rows xr, float* out, Rows outr, uint32_t dv, uint32_t total) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const uint32_t row = i / dv, j = 4 * (i - row * dv);
  *reinterpret_cast<float4*>(out + row_offset(outr, row) + j) =
      *reinterpret_cast<const float4*>(x + row_offset(xr, row) + j);
}

// With kSplit, x = hi + lo with both BF16: hi = round(x) into rows [0, n), lo = round(x − hi) into rows
// [n, 2n) of dst (`lo` points at row n); one GEMM over the 2n rows then reads W once for both halves.
template <bool kVec4, bool kSplit>
__global__ void f32_to_bf16_rows_kernel(const float* x, int64_t ldx, uint16_t* dst, uint16_t* lo, int64_t k) {
  const int64_t row = blockIdx.x, step = static_cast<int64_t>(gridDim.y) * blockDim.x * (kVec4 ? 4 : 1);
  for (int64_t j = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * (kVec4 ? 4 : 1); j < k;
       j += step) {
    if constexpr (kVec4) {
      const float4 v = *reinterpret_cast<const float4*>(x + row * ldx + j);
      const uint16_t h0 = f32_to_bf16_bits(v.x), h1 = f32_to_bf16_bits(v.y), h2 = f32_to_bf16_bits(v.z),
                     h3 = f32_to_bf16_bits(v.w);
      *reinterpret_cast<uint2*>(dst + row * k + j) =
          make_uint2(h0 | (static_cast<uint32_t>(h1) << 16), h2 | (static_cast<uint32_t>(h3) << 16));
      if constexpr (kSplit) {
        const uint16_t l0 = f32_to_bf16_bits(v.x - bf16_bits_to_f32(h0)), l1 = f32_to_bf16_bits(v.y - bf16_bits_to_f32(h1)),
                       l2 = f32_to_bf16_bits(v.z - bf16_bits_to_f32(h2)), l3 = f32_to_bf16_bits(v.w - bf16_bits_to_f32(h3));
        *reinterpret_cast<uint2*>(lo + row * k + j) =
            make_uint2(l0 | (static_cast<uint32_t>(l1) << 16), l2 | (static_cast<uint32_t>(l3) << 16));
      }
    } else {
      const float v = x[row * ldx + j];
      const uint16_t h = f32_to_bf16_bits(v);
      dst[row * k + j] = h;
      if constexpr (kSplit) lo[row * k + j] = f32_to_bf16_bits(v - bf16_bits_to_f32(h));
    }
  }
}

// out[i, :] = (planes[0][i, :] + planes[1][i, :] + ...) · scales[i] (+ bias): planes [np, n, m] contiguous,
// a k-split GEMM's (added in plane order and rescaled exactly as norms.cu's add_rms_norm does when it
// reads them itself, NormArgs::z_planes, so both give the same bits) or a split-input GEMM's hi and lo
// halves (no scales: s = 1, the product exact).
__global__ void planes_sum_rows_kernel(const float* planes, int np, int64_t n, int64_t m, const float* scales,
                                       const float* bias, float* out, int64_t ldo) {
  const int64_t row = blockIdx.x;
  const float* p = planes + row * m;
  const float s = row_scale(scales, row);
  float* o = out + row * ldo;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < m;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float v = p[j];
    for (int q = 1; q < np; ++q) v = v + p[q * n * m + j];
    v = rescaled(v, s);
    o[j] = bias ? v + bias[j] : v;
  }
}

template <int V>
__global__ void __launch_bounds__(kMaxRowThreads)
    f32_to_f16_rows_scaled_kernel(const float* x, int64_t ldx, __half* dst, float* scales, int64_t k) {
  using Vec = VecOf<V>;
  const int64_t row = blockIdx.x;
  const Vec* xr = reinterpret_cast<const Vec*>(x + row * ldx);
  Vec v[kRowVecs];
  float mx = 0.0f;
  const int64_t last_chunk = walk_row<kRowVecs>(
      k / V, [&](int64_t j, int u) { v[u] = xr[j]; }, [&](int64_t, int u) { mx = fmaxf(mx, abs_max(v[u])); });
  // Rows within [2^-10, 2^15] keep s = 1 (then the rescale kernel has nothing to do).
  store_row_f16(mx, scales + row, dst + row * k, last_chunk, k / V, v, [&](int64_t j) { return xr[j]; });
}

__global__ void scale_bias_rows_kernel(float* out, int64_t ldo, const float* scales, const float* bias, int64_t m) {
  const float s = scales[blockIdx.x];
  if (s == 1.0f && bias == nullptr) return;  // the common case: nothing to do
  float* o = out + static_cast<int64_t>(blockIdx.x) * ldo;
  for (int64_t j = threadIdx.x; j < m; j += kThreads) o[j] = bias ? fmaf(o[j], s, bias[j]) : o[j] * s;
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

cudaError_t launch_binary(BinaryKind kind, const float* x, const Rows& xr, const float* y, const Rows& yr,
                          const float* in_scales, float* out, const Rows& outr, int64_t d, cudaStream_t stream) {
  const int64_t rows = xr.count();
  if (rows == 0 || d == 0) return cudaSuccess;
  const bool vec4 = d % 4 == 0 && rows_vec4(xr) && rows_vec4(yr) && rows_vec4(outr) && aligned16(x) &&
                    aligned16(y) && aligned16(out);
  // The flattened index is 32-bit (a 64-bit division per thread would cost more than the op).
  if (rows * d >= kMaxElementwise) return cudaErrorInvalidValue;
  switch (kind) {
    case BinaryKind::SigmoidMul:
      launch_binary_kind<BinaryKind::SigmoidMul>(vec4, rows, x, xr, y, yr, in_scales, out, outr, d, stream);
      break;
    case BinaryKind::Swiglu:
      launch_binary_kind<BinaryKind::Swiglu>(vec4, rows, x, xr, y, yr, in_scales, out, outr, d, stream);
      break;
    case BinaryKind::Add:
      launch_binary_kind<BinaryKind::Add>(vec4, rows, x, xr, y, yr, in_scales, out, outr, d, stream);
      break;
  }
  return cudaGetLastError();
}

bool binary_writes_half(const float* x, const Rows& xr, const float* y, const Rows& yr, const float* out,
                        const Rows& outr, int64_t d, int group) {
  const int64_t rows = xr.count();
  return group >= 1 && rows % group == 0 && d % 4 == 0 && rows * d < kMaxElementwise && rows_vec4(xr) &&
         rows_vec4(yr) && rows_vec4(outr) && aligned16(x) && aligned16(y) && aligned16(out);
}

cudaError_t launch_binary_half(BinaryKind kind, const float* x, const Rows& xr, const float* y, const Rows& yr,
                               const float* in_scales, float* out, const Rows& outr, int64_t d, uint16_t* half,
                               float* scales, int group, bool store_out, cudaStream_t stream) {
  const int64_t rows = xr.count();
  if (rows == 0 || d == 0) return cudaSuccess;
  if (!binary_writes_half(x, xr, y, yr, out, outr, d, group)) return cudaErrorInvalidValue;
  const bool optimistic = rows / group >= kOptimisticMinGemmRows;
  if (optimistic) {
    const cudaError_t err = cudaMemsetAsync(scales, 0, static_cast<size_t>(rows / group) * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  __half* h = reinterpret_cast<__half*>(half);
  switch (kind) {
    case BinaryKind::SigmoidMul:
      return launch_binary_half_kind<BinaryKind::SigmoidMul>(optimistic, rows, x, xr, y, yr, in_scales, out, outr, d,
                                                             h, scales, group, store_out, stream);
    case BinaryKind::Swiglu:
      return launch_binary_half_kind<BinaryKind::Swiglu>(optimistic, rows, x, xr, y, yr, in_scales, out, outr, d, h,
                                                         scales, group, store_out, stream);
    case BinaryKind::Add:
      return launch_binary_half_kind<BinaryKind::Add>(optimistic, rows, x, xr, y, yr, in_scales, out, outr, d, h,
                                                      scales, group, store_out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_f16_rows_fixup(const float* out, const Rows& outr, int64_t d, int group, uint16_t* half,
                                  float* scales, cudaStream_t stream) {
  return launch_fixup(FromOut{out, outr}, outr.count() / group, d, group, reinterpret_cast<__half*>(half), scales,
                      stream);
}

cudaError_t launch_gdn_gates(const GatesArgs& a, cudaStream_t stream) {
  const int64_t total = a.n * a.Hv;
  if (total == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  gdn_gates_kernel<<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_copy(const void* x, bool x_bf16, const Rows& xr, void* out, bool out_bf16, const Rows& outr,
                        int64_t d, cudaStream_t stream) {
  const int64_t rows = xr.count();
  if (rows == 0 || d == 0) return cudaSuccess;
  if (rows * d >= kMaxElementwise) return cudaErrorInvalidValue;  // 32-bit flattened index
  if (!x_bf16 && !out_bf16 && d % 4 == 0 && rows_vec4(xr) && rows_vec4(outr) && aligned16(x) && aligned16(out)) {
    const uint32_t total = static_cast<uint32_t>(rows * d / 4);
    copy_f32x4_kernel<<<(total + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        static_cast<const float*>(x), xr, static_cast<float*>(out), outr, static_cast<uint32_t>(d / 4), total);
    return cudaGetLastError();
  }
  const uint32_t total = static_cast<uint32_t>(rows * d), dd = static_cast<uint32_t>(d);
  const unsigned grid = (total + kThreads - 1) / kThreads;
  if (x_bf16 && out_bf16) {
    copy_kernel<true, true><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, dd, total);
  } else if (x_bf16) {
    copy_kernel<true, false><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, dd, total);
  } else if (out_bf16) {
    copy_kernel<false, true><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, dd, total);
  } else {
    copy_kernel<false, false><<<grid, kThreads, 0, stream>>>(x, xr, out, outr, dd, total);
  }
  return cudaGetLastError();
}

cudaError_t launch_f32_to_bf16_rows(const float* x, int64_t ldx, uint16_t* dst, int64_t n, int64_t k, bool split,
                                    cudaStream_t stream) {
  if (n == 0 || k == 0) return cudaSuccess;
  // dst rows start at multiples of k·2 bytes from a 256-aligned base: 8-byte stores need k % 4 == 0.
  const bool vec4 = k % 4 == 0 && (n == 1 || ldx % 4 == 0) && aligned16(x) &&
                    (reinterpret_cast<uintptr_t>(dst) & 7u) == 0;
  const int64_t per_block = kThreads * (vec4 ? 4 : 1);
  const int64_t col_blocks = std::min<int64_t>((k + per_block - 1) / per_block, 65535);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(col_blocks));
  uint16_t* lo = dst + n * k;
  if (vec4) {
    if (split) f32_to_bf16_rows_kernel<true, true><<<grid, kThreads, 0, stream>>>(x, ldx, dst, lo, k);
    else f32_to_bf16_rows_kernel<true, false><<<grid, kThreads, 0, stream>>>(x, ldx, dst, lo, k);
  } else {
    if (split) f32_to_bf16_rows_kernel<false, true><<<grid, kThreads, 0, stream>>>(x, ldx, dst, lo, k);
    else f32_to_bf16_rows_kernel<false, false><<<grid, kThreads, 0, stream>>>(x, ldx, dst, lo, k);
  }
  return cudaGetLastError();
}

cudaError_t launch_planes_sum_rows(const float* planes, int n_planes, int64_t n, int64_t m, const float* scales,
                                   const float* bias, float* out, int64_t ldo, cudaStream_t stream) {
  if (n == 0 || m == 0) return cudaSuccess;
  const int64_t col_blocks = std::min<int64_t>((m + kThreads - 1) / kThreads, 65535);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(col_blocks));
  planes_sum_rows_kernel<<<grid, kThreads, 0, stream>>>(planes, n_planes, n, m, scales, bias, out, ldo);
  return cudaGetLastError();
}

cudaError_t launch_f32_to_f16_rows_scaled(const float* x, int64_t ldx, uint16_t* dst, float* scales, int64_t n,
                                          int64_t k, cudaStream_t stream) {
  if (n == 0 || k == 0) return cudaSuccess;
  // dst rows start at multiples of k·2 bytes from a 256-aligned base: 8-byte stores need k % 4 == 0.
  const bool vec4 =
      k % 4 == 0 && (n == 1 || ldx % 4 == 0) && aligned16(x) && (reinterpret_cast<uintptr_t>(dst) & 7u) == 0;
  __half* d = reinterpret_cast<__half*>(dst);
  const unsigned threads = row_threads(vec4 ? k / 4 : k);
  if (vec4) {
    f32_to_f16_rows_scaled_kernel<4><<<static_cast<unsigned>(n), threads, 0, stream>>>(x, ldx, d, scales, k);
  } else {
    f32_to_f16_rows_scaled_kernel<1><<<static_cast<unsigned>(n), threads, 0, stream>>>(x, ldx, d, scales, k);
  }
  return cudaGetLastError();
}

cudaError_t launch_scale_bias_rows(float* out, int64_t ldo, const float* scales, const float* bias, int64_t n, int64_t m,
                                   cudaStream_t stream) {
  if (n == 0 || m == 0) return cudaSuccess;
  scale_bias_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(out, ldo, scales, bias, m);
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
