// Row normalisations over the innermost dimension d (rows = every outer index of a rank 1..4 view):
//
//   rms_norm:       out = x / sqrt(mean(x²) + eps) · (1 + w)        (zero-centred gain)
//   add_rms_norm:   x ← x + y (in place), then out = rms_norm(x)     (the residual add fused in)
//   l2_norm:        out = x / sqrt(Σx² + eps) · scale
//   rms_norm_gated: out = w · o / sqrt(mean(o²) + eps) · SiLU(z)    (plain gain)
//
// Layout: x/o, z (gated: z; add_rms_norm: y), out [..., d] with free outer strides (Rows), innermost
// contiguous; w [d]. add_rms_norm writes x + y through `sum` (x itself) with x's rows.
// Launch: one warp per row, 4 rows per 128-thread block (grid.x = ceil(rows / 4): Kev's passes have a
// few hundred rows, so small blocks spread them over more SMs); a lane strides over the row, so loads
// are coalesced per warp, as float4 when d % 4 == 0 and every row of x, z, out and w is 16-byte
// aligned (scalar otherwise). The float4 path takes the row in chunks of 256 floats, a lane loading
// its 2 float4s of x (and y or z) and of the gain in one burst and keeping them in registers through
// the reduction to the output and its FP16 copy: rows up to 256 floats (the head rows: q / k norms,
// rms_norm_gated) are one chunk, so the row costs one load round trip, not three (x; then x, w, z
// again after the reduction; then out again for the copy: rms_norm_gated +f16 on 250 tokens x 32 x 128
// took 17 us under Nsight Compute that way). Longer rows re-read their earlier chunks after the
// reduction (for add_rms_norm the sums this lane wrote). The sum of squares is an FP32 warp reduction
// (of x + y rounded to FP32 for add_rms_norm, as add then rms_norm), each lane summing its elements in
// increasing order. Wide rms_norm and add_rms_norm rows (the hidden state: 1024 <= d <= 4096,
// float4-aligned) instead get one 128-thread block each, a thread holding up to 8 float4 of the row, and
// of y and the gain, in registers, all loaded before the first use (the gain no longer waits for the
// reduction): a warp would walk a 2,560-float row in 20 dependent steps, and a few hundred rows would
// leave most SMs idle. Its sum of squares is a warp reduction, then one over the 4 warps.
// Rows are independent, so out may be the identical view of x (in place) for the plain norms:
// every lane reads its elements before writing them and no lane reads another's. add_rms_norm's out
// and y are disjoint from x (supports() checks).
// FP16 copy for the next matmul (NormArgs::half, float4 paths only; the backend asks norm_writes_half):
// the same kernels also store FP16(out / s) per GEMM row with f16_rows.cuh's power-of-two s, saving
// matmul's conversion kernel (a read of out and a launch). A wide row is one GEMM row: its block
// takes the row max over its 4 warps and converts the registers it just stored. In the warp kernel a
// GEMM row is half_group consecutive norm rows (rms_norm_gated: the Hv heads of a token), so the block
// becomes half_group warps (<= 32, grid.x = rows / half_group), takes the block max and each lane
// converts the out elements it wrote (its last chunk from registers). The FP32 out is computed by the
// same code either way.
// Fused GDN prep (launch_gdn_prep; the backend joins a Gated DeltaNet layer's q and k l2 norms and its
// gdn_gates, recorded back to back and independent of each other, into one command): one launch of
// 128-thread blocks, first the blocks the standalone float4 L2 launches would run (4 rows each, the same
// row code), then one thread per (token, head) gate pair (device_math.cuh's gdn_gate, as elementwise.cu's
// kernel), so every value has the bits of the separate launches, with two launches fewer.
// add_rms_norm right after the F16-weight matmul that wrote y (NormArgs::z_scales): every path
// multiplies y's row r by z_scales[r] as it reads it and stores the product back into y where the
// scale is not 1 (f16_rows.cuh); the lane that reads an element of y is the one that writes it.
#include <climits>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/f16_rows.cuh"

namespace kev::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// x + y element-wise (add_rms_norm's residual update).
__device__ __forceinline__ float4 add4(float4 u, float4 v) {
  return make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
}

// Float4s a lane holds per chunk of a warp-per-row row: rows up to 32 · 4 · kLaneVecs = 256 floats
// (every head row of Kev's models) are one chunk, loaded in one burst (x, and y / z and w as the kind
// needs) and kept in registers from the sum of squares to the output and its FP16 copy.
constexpr int kLaneVecs = 2, kLaneChunk = 32 * 4 * kLaneVecs;

// out = the normalised v (f: the row's factor; w, z as the kind uses them).
template <NormKind kKind>
__device__ __forceinline__ float4 norm_out(float4 v, float f, float4 w, float4 z) {
  if constexpr (kKind == NormKind::Rms || kKind == NormKind::AddRms) {
    return make_float4(v.x * f * (1.0f + w.x), v.y * f * (1.0f + w.y), v.z * f * (1.0f + w.z), v.w * f * (1.0f + w.w));
  } else if constexpr (kKind == NormKind::L2) {
    return make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
  } else {
    return make_float4(w.x * (v.x * f) * siluf(z.x), w.y * (v.y * f) * siluf(z.y), w.z * (v.z * f) * siluf(z.z),
                       w.w * (v.w * f) * siluf(z.w));
  }
}

// One row of the warp-per-row float4 kernel, in chunks of kLaneChunk floats (lane l's float4s of a
// chunk at base + 4·l + 128·u): out's row `row` written; r[] keeps the out values of the last chunk,
// which starts at `last`; with kMax the lane's largest |out| returned (for the half copy; else 0).
// A lane's squares are summed in increasing j, as one strided loop over the row would.
template <NormKind kKind, bool kMax>
__device__ __forceinline__ float norm_vec4_row(const NormArgs& a, int64_t row, int lane, float4 (&r)[kLaneVecs],
                                               int64_t& last) {
  constexpr bool kAdd = kKind == NormKind::AddRms, kZ = kKind == NormKind::RmsGated, kW = kKind != NormKind::L2;
  const int64_t x_off = row_offset(a.x_rows, row);
  const float* x = a.x + x_off;
  float* out = a.out + row_offset(a.out_rows, row);
  const float* z = kZ || kAdd ? a.z + row_offset(a.z_rows, row) : nullptr;
  float* sum = kAdd ? a.sum + x_off : nullptr;
  const float ys = kAdd ? row_scale(a.z_scales, row) : 1.0f;
  float4 v[kLaneVecs], zv[kLaneVecs], wv[kLaneVecs];
  // Chunk b into v (from src), zv (y or z, with_z) and wv (the gain); every load before any use.
  auto load = [&](const float* src, int64_t b, bool with_z) {
#pragma unroll
    for (int u = 0; u < kLaneVecs; ++u) {
      const int64_t j = b + 4 * lane + 128 * u;
      if (j < a.d) {
        v[u] = ld4(src + j);
        if (kZ || (kAdd && with_z)) zv[u] = ld4(z + j);
        if constexpr (kW) wv[u] = ld4(a.w + j);
      }
    }
  };
  float ss = 0.0f;
  int64_t base = 0;
  for (;; base += kLaneChunk) {
    load(x, base, true);
#pragma unroll
    for (int u = 0; u < kLaneVecs; ++u) {
      const int64_t j = base + 4 * lane + 128 * u;
      if (j < a.d) {
        if constexpr (kAdd) {
          const float4 y = rescaled(zv[u], ys);
          if (ys != 1.0f) *reinterpret_cast<float4*>(const_cast<float*>(z) + j) = y;
          v[u] = add4(v[u], y);
          *reinterpret_cast<float4*>(sum + j) = v[u];
        }
        ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
      }
    }
    if (base + kLaneChunk >= a.d) break;
  }
  ss = warp_sum(ss);
  const float f =
      kKind == NormKind::L2 ? a.scale / sqrtf(ss + a.eps) : 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
  float mx = 0.0f;
  auto emit = [&](int64_t b, float4(&o)[kLaneVecs]) {
#pragma unroll
    for (int u = 0; u < kLaneVecs; ++u) {
      const int64_t j = b + 4 * lane + 128 * u;
      if (j < a.d) {
        o[u] = norm_out<kKind>(v[u], f, wv[u], zv[u]);
        *reinterpret_cast<float4*>(out + j) = o[u];
        if constexpr (kMax) mx = fmaxf(mx, abs_max(o[u]));
      }
    }
  };
  // The last chunk from registers, then the earlier chunks of a longer row again (add_rms_norm: the
  // lane's own sums; in place, the chunks out holds so far are the last and those before the one re-read).
  emit(base, r);
  for (int64_t b = 0; b < base; b += kLaneChunk) {
    load(kAdd ? sum : x, b, false);
    float4 o[kLaneVecs];
    emit(b, o);
  }
  last = base;
  return mx;
}

// kHalf: the block's warps are the half_group rows of one GEMM row (grid exact, no row out of range).
template <NormKind kKind, bool kHalf>
__global__ void __launch_bounds__(1024) norm_vec4_kernel(NormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (!kHalf && row >= a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2]) return;
  float4 r[kLaneVecs];
  int64_t last = 0;
  [[maybe_unused]] const float mx = norm_vec4_row<kKind, kHalf>(a, row, lane, r, last);
  if constexpr (kHalf) {
    __shared__ float part[32];
    const float inv = f16_row_inverse_scale(block_max(mx, part));
    if (threadIdx.x == 0) a.half_scales[blockIdx.x] = 1.0f / inv;
    const float* out = a.out + row_offset(a.out_rows, row);
    __half* h = reinterpret_cast<__half*>(a.half) + blockIdx.x * (a.half_group * a.d) + (threadIdx.x / 32) * a.d;
    for (int64_t j = 4 * lane; j < last; j += 128) store_f16(h + j, ld4(out + j), inv);  // this lane's own writes
#pragma unroll
    for (int u = 0; u < kLaneVecs; ++u) {
      const int64_t j = last + 4 * lane + 128 * u;
      if (j < a.d) store_f16(h + j, r[u], inv);
    }
  }
}

__device__ __forceinline__ int64_t rows_of(const NormArgs& a) {
  return a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2];
}

// The fused GDN prep launch (launch_gdn_prep): blocks [0, nb0) are launch_norm's blocks for norms[0]
// (kWarpsPerBlock rows each), the next nb1 those for norms[1], the rest 128 gate pairs each.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gdn_prep_kernel(GdnPrepArgs p, unsigned nb0, unsigned nb1) {
  const int lane = threadIdx.x % 32;
  const int64_t warp_row = threadIdx.x / 32;
  float4 r[kLaneVecs];
  int64_t last = 0;
  unsigned b = blockIdx.x;
  // Each operand by a static index: a dynamic one would copy the kernel parameter to local memory.
  if (b < nb0) {
    const int64_t row = static_cast<int64_t>(b) * kWarpsPerBlock + warp_row;
    if (row < rows_of(p.norms[0])) norm_vec4_row<NormKind::L2, false>(p.norms[0], row, lane, r, last);
    return;
  }
  b -= nb0;
  if (b < nb1) {
    const int64_t row = static_cast<int64_t>(b) * kWarpsPerBlock + warp_row;
    if (row < rows_of(p.norms[1])) norm_vec4_row<NormKind::L2, false>(p.norms[1], row, lane, r, last);
    return;
  }
  b -= nb1;
  const int64_t i = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;
  if (i < p.gates.n * p.gates.Hv) gdn_gate(p.gates, i);
}

constexpr int kRowThreads = 128, kRowVec = 8;  // wide rows: d / 4 <= kRowThreads · kRowVec

// kAdd: add_rms_norm (the row is x + y, written back through a.sum before the reduction). kHalf: also
// the row's FP16 copy (half_group = 1).
template <bool kAdd, bool kHalf>
__global__ void __launch_bounds__(kRowThreads) rms_norm_row_kernel(NormArgs a) {
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t x_off = row_offset(a.x_rows, row);
  const float* x = a.x + x_off;
  const float* y = kAdd ? a.z + row_offset(a.z_rows, row) : nullptr;
  const float ys = kAdd ? row_scale(a.z_scales, row) : 1.0f;
  float* out = a.out + row_offset(a.out_rows, row);
  const int nv = static_cast<int>(a.d / 4);
  float4 v[kRowVec], yv[kRowVec], wv[kRowVec];
#pragma unroll
  for (int u = 0; u < kRowVec; ++u) {
    const int j = threadIdx.x + u * kRowThreads;
    if (j < nv) {
      v[u] = ld4(x + 4 * j);
      if constexpr (kAdd) yv[u] = ld4(y + 4 * j);
      wv[u] = ld4(a.w + 4 * j);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kRowVec; ++u) {
    const int j = threadIdx.x + u * kRowThreads;
    if (j < nv) {
      if constexpr (kAdd) {
        yv[u] = rescaled(yv[u], ys);
        if (ys != 1.0f) *reinterpret_cast<float4*>(const_cast<float*>(y) + 4 * j) = yv[u];
        v[u] = add4(v[u], yv[u]);
        *reinterpret_cast<float4*>(a.sum + x_off + 4 * j) = v[u];
      }
      ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
  }
  __shared__ float part[kRowThreads / 32];
  ss = warp_sum(ss);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  ss = 0.0f;
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) ss += part[w];
  const float f = 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
  float mx = 0.0f;
#pragma unroll
  for (int u = 0; u < kRowVec; ++u) {
    const int j = threadIdx.x + u * kRowThreads;
    if (j < nv) {
      v[u] = norm_out<NormKind::Rms>(v[u], f, wv[u], float4{});
      *reinterpret_cast<float4*>(out + 4 * j) = v[u];
      if constexpr (kHalf) mx = fmaxf(mx, abs_max(v[u]));
    }
  }
  if constexpr (kHalf) {
    __syncthreads();  // every warp has read part[] above
    const float inv = f16_row_inverse_scale(block_max(mx, part));
    if (threadIdx.x == 0) a.half_scales[row] = 1.0f / inv;
    __half* h = reinterpret_cast<__half*>(a.half) + row * a.d;
#pragma unroll
    for (int u = 0; u < kRowVec; ++u) {
      const int j = threadIdx.x + u * kRowThreads;
      if (j < nv) store_f16(h + 4 * j, v[u], inv);
    }
  }
}

template <NormKind kKind>
__global__ void norm_kernel(NormArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2]) return;
  const int64_t x_off = row_offset(a.x_rows, row);
  const float* x = a.x + x_off;
  float* out = a.out + row_offset(a.out_rows, row);
  float ss = 0.0f;
  if constexpr (kKind == NormKind::AddRms) {
    float* y = const_cast<float*>(a.z) + row_offset(a.z_rows, row);
    float* sum = a.sum + x_off;
    const float ys = row_scale(a.z_scales, row);
    for (int64_t j = lane; j < a.d; j += 32) {
      const float yv = rescaled(y[j], ys);
      if (ys != 1.0f) y[j] = yv;
      const float v = x[j] + yv;
      sum[j] = v;
      ss += v * v;
    }
    x = sum;  // the second pass reads back this lane's own sums
  } else {
    for (int64_t j = lane; j < a.d; j += 32) ss += x[j] * x[j];
  }
  ss = warp_sum(ss);
  if constexpr (kKind == NormKind::Rms || kKind == NormKind::AddRms) {
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

// The kernel launch_norm picks (the half copy only on the float4 paths).
enum class NormPath { Scalar, Vec4, Row };

NormPath norm_path(const NormArgs& a) {
  const bool add = a.kind == NormKind::AddRms;
  const bool uses_z = a.kind == NormKind::RmsGated || add;
  const bool vec4 = a.d % 4 == 0 && aligned16(a.x) && aligned16(a.out) && rows_vec4(a.x_rows) &&
                    rows_vec4(a.out_rows) && (a.kind == NormKind::L2 || aligned16(a.w)) &&
                    (!uses_z || (aligned16(a.z) && rows_vec4(a.z_rows))) && (!add || aligned16(a.sum));
  if (!vec4) return NormPath::Scalar;
  return (a.kind == NormKind::Rms || add) && a.d >= 1024 && a.d <= 4 * kRowThreads * kRowVec ? NormPath::Row
                                                                                             : NormPath::Vec4;
}

// launch_norm's grid for the warp-per-row kernels (which the fused GDN prep launch repeats).
int64_t norm_blocks(const NormArgs& a) { return (a.x_rows.count() + kWarpsPerBlock - 1) / kWarpsPerBlock; }

constexpr int kGateThreads = 32 * kWarpsPerBlock;  // gate pairs per block of the fused launch

template <NormKind kKind>
void launch_vec4(const NormArgs& a, int64_t rows, cudaStream_t stream) {
  if (a.half) {
    norm_vec4_kernel<kKind, true><<<static_cast<unsigned>(rows / a.half_group), 32 * a.half_group, 0, stream>>>(a);
  } else {
    norm_vec4_kernel<kKind, false><<<static_cast<unsigned>(norm_blocks(a)), 32 * kWarpsPerBlock, 0, stream>>>(a);
  }
}

template <bool kAdd>
void launch_row(const NormArgs& a, int64_t rows, cudaStream_t stream) {
  if (a.half) {
    rms_norm_row_kernel<kAdd, true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(a);
  } else {
    rms_norm_row_kernel<kAdd, false><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(a);
  }
}

}  // namespace

bool norm_writes_half(const NormArgs& a) {
  if (a.half_group < 1 || a.x_rows.count() % a.half_group != 0) return false;
  switch (norm_path(a)) {
    case NormPath::Row: return a.half_group == 1;
    case NormPath::Vec4: return a.half_group <= 32;  // one warp per row, 1,024 threads per block at most
    case NormPath::Scalar: return false;
  }
  return false;
}

bool gdn_prep_fusable(const GdnPrepArgs& a) {
  if (a.n_norms < 0 || a.n_norms > 2) return false;
  int64_t blocks = (a.gates.n * a.gates.Hv + kGateThreads - 1) / kGateThreads;
  for (int i = 0; i < a.n_norms; ++i) {
    const NormArgs& n = a.norms[i];
    if (n.kind != NormKind::L2 || n.half != nullptr || n.d == 0 || norm_path(n) != NormPath::Vec4) return false;
    blocks += norm_blocks(n);
  }
  return blocks <= INT_MAX;
}

cudaError_t launch_gdn_prep(const GdnPrepArgs& a, cudaStream_t stream) {
  if (!gdn_prep_fusable(a)) return cudaErrorInvalidValue;
  const int64_t nb0 = a.n_norms > 0 ? norm_blocks(a.norms[0]) : 0, nb1 = a.n_norms > 1 ? norm_blocks(a.norms[1]) : 0;
  const int64_t blocks = nb0 + nb1 + (a.gates.n * a.gates.Hv + kGateThreads - 1) / kGateThreads;
  if (blocks == 0) return cudaSuccess;
  gdn_prep_kernel<<<static_cast<unsigned>(blocks), kGateThreads, 0, stream>>>(a, static_cast<unsigned>(nb0),
                                                                              static_cast<unsigned>(nb1));
  return cudaGetLastError();
}

cudaError_t launch_norm(const NormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x_rows.count();
  if (rows == 0 || a.d == 0) return cudaSuccess;
  if (a.half && !norm_writes_half(a)) return cudaErrorInvalidValue;
  const NormPath path = norm_path(a);
  if (path == NormPath::Row) {
    if (a.kind == NormKind::AddRms) {
      launch_row<true>(a, rows, stream);
    } else {
      launch_row<false>(a, rows, stream);
    }
    return cudaGetLastError();
  }
  if (path == NormPath::Vec4) {
    switch (a.kind) {
      case NormKind::Rms: launch_vec4<NormKind::Rms>(a, rows, stream); break;
      case NormKind::AddRms: launch_vec4<NormKind::AddRms>(a, rows, stream); break;
      case NormKind::L2: launch_vec4<NormKind::L2>(a, rows, stream); break;
      case NormKind::RmsGated: launch_vec4<NormKind::RmsGated>(a, rows, stream); break;
    }
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(norm_blocks(a)));
  const int threads = 32 * kWarpsPerBlock;
  switch (a.kind) {
    case NormKind::Rms: norm_kernel<NormKind::Rms><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::AddRms: norm_kernel<NormKind::AddRms><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::L2: norm_kernel<NormKind::L2><<<grid, threads, 0, stream>>>(a); break;
    case NormKind::RmsGated: norm_kernel<NormKind::RmsGated><<<grid, threads, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

}  // namespace kev::cuda
