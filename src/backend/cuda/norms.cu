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
// GEMM row is half_group consecutive norm rows (rms_norm_gated: the Hv heads of a token): with
// kOptimisticMinGemmRows GEMM rows or more (Kev's long prefills) each warp of the usual 4-row blocks
// stores its row's copy as if s = 1 and raises the GEMM row's max, and launch_f16_rows_fixup sets the
// scales and converts the rare rows with s != 1 again (f16_rows.cuh); fewer GEMM rows take
// norm_vec4_block_kernel, a block per GEMM row (grid.x = rows / half_group) of half_group warps, or of
// half_group / 2 warps each normalising two rows one after the other when half_group > 16 (the 4B's 32
// heads a token: 512 threads, so two blocks share an SM), which takes the block max and each lane
// converts the out elements it wrote (each row's last chunk from registers, the rest read back; Kev's
// head rows are one chunk). When only the copy is read after (NormArgs::store_out false), these
// kernels and the wide-row one leave out's last chunk unwritten. H200, 2026-12-02,
// `KEV_CUDA_TRACE=ops`, rms_norm_gated +f16 per call, block → optimistic: 4B 2,187-token prefill 89.2
// → 75.5 us (the plain norm: 52.6), 0.8B 41.6 → 43.3; 0.8B short passes 9.0 → 12.5 (the memset and
// fix-up launches).
// The FP32 out is computed by the same code either way.
// Fused GDN prep (launch_gdn_prep; the backend joins a Gated DeltaNet layer's q and k l2 norms and its
// gdn_gates, recorded back to back and independent of each other, into one command): one launch of
// 128-thread blocks, first the blocks the standalone float4 L2 launches would run (4 rows each, the same
// row code), then one thread per (token, head) gate pair (device_math.cuh's gdn_gate, as elementwise.cu's
// kernel), so every value has the bits of the separate launches, with two launches fewer.
// add_rms_norm right after the F16-weight matmul that wrote y (NormArgs::z_scales): every path
// multiplies y's row r by z_scales[r] as it reads it and stores the product back into y where the
// scale is not 1 (f16_rows.cuh); the lane that reads an element of y is the one that writes it.
// When that matmul split k into planes (NormArgs::z_planes, matmul.h), the row kernel reads the planes
// instead of y, adds them in plane order, rescales the sum and stores it into y, the bits
// launch_planes_sum_rows would have written: the cuBLASLt split-K reduce kernel, or ours, does not run.
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

// One row of the warp-per-row float4 kernel, in chunks of 128 · kVecs floats (lane l's float4s of a
// chunk at base + 4·l + 128·u): out's row `row` written (its last chunk only if a.store_out); r[] keeps
// the out values of the last chunk, which starts at `last`; with kMax the lane's largest |out| returned
// (for the half copy; else 0).
// A lane's squares are summed in increasing j, as one strided loop over the row would, whatever kVecs.
template <NormKind kKind, bool kMax, int kVecs = kLaneVecs>
__device__ __forceinline__ float norm_vec4_row(const NormArgs& a, int64_t row, int lane, float4 (&r)[kVecs],
                                               int64_t& last) {
  constexpr bool kAdd = kKind == NormKind::AddRms, kZ = kKind == NormKind::RmsGated, kW = kKind != NormKind::L2;
  constexpr int kChunkFloats = 128 * kVecs;
  const int64_t x_off = row_offset(a.x_rows, row);
  const float* x = a.x + x_off;
  float* out = a.out + row_offset(a.out_rows, row);
  const float* z = kZ || kAdd ? a.z + row_offset(a.z_rows, row) : nullptr;
  float* sum = kAdd ? a.sum + x_off : nullptr;
  const float ys = kAdd ? row_scale(a.z_scales, row) : 1.0f;
  float4 v[kVecs], zv[kVecs], wv[kVecs];
  // Chunk b into v (from src), zv (y or z, with_z) and wv (the gain); every load before any use.
  auto load = [&](const float* src, int64_t b, bool with_z) {
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
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
  for (;; base += kChunkFloats) {
    load(x, base, true);
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = base + 4 * lane + 128 * u;
      if (j < a.d) {
        if constexpr (kAdd) {
          const float4 y = rescaled(zv[u], ys);
          if (ys != 1.0f) *reinterpret_cast<float4*>(const_cast<float*>(z) + j) = y;
          v[u] = add4(v[u], y);
          *reinterpret_cast<float4*>(sum + j) = v[u];
        }
        ss += sum_squares(v[u]);
      }
    }
    if (base + kChunkFloats >= a.d) break;
  }
  ss = warp_sum(ss);
  const float f =
      kKind == NormKind::L2 ? l2_factor(ss, a.scale, a.eps) : 1.0f / sqrtf(ss / static_cast<float>(a.d) + a.eps);
  float mx = 0.0f;
  auto emit = [&](int64_t b, float4(&o)[kVecs], bool store) {
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = b + 4 * lane + 128 * u;
      if (j < a.d) {
        o[u] = norm_out<kKind>(v[u], f, wv[u], zv[u]);
        if (store) *reinterpret_cast<float4*>(out + j) = o[u];
        if constexpr (kMax) mx = fmaxf(mx, abs_max(o[u]));
      }
    }
  };
  // The last chunk from registers, then the earlier chunks of a longer row again (add_rms_norm: the
  // lane's own sums; in place, the chunks out holds so far are the last and those before the one re-read),
  // always stored: the FP16 copy reads them back.
  emit(base, r, a.store_out);
  for (int64_t b = 0; b < base; b += kChunkFloats) {
    load(kAdd ? sum : x, b, false);
    float4 o[kVecs];
    emit(b, o, true);
  }
  last = base;
  return mx;
}

// How norm_vec4_kernel writes out's FP16 copy: not at all, or optimistically (f16_rows.cuh), each
// warp storing its row as if s = 1 and raising its GEMM row's max (launch_vec4 zeroes the slots first
// and runs launch_f16_rows_fixup after). Passes of fewer GEMM rows take norm_vec4_block_kernel, a
// block per GEMM row taking the row's max first. The copy [rows / half_group, half_group·d] is
// [rows, d] row-major either way.
enum class HalfCopy { None, Optimistic };

template <NormKind kKind, HalfCopy kHalf>
__global__ void __launch_bounds__(1024) norm_vec4_kernel(NormArgs a) {
  constexpr bool kCopy = kHalf != HalfCopy::None;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.x_rows.shape[0] * a.x_rows.shape[1] * a.x_rows.shape[2]) return;
  float4 r[kLaneVecs];
  int64_t last = 0;
  [[maybe_unused]] const float mx = norm_vec4_row<kKind, kCopy>(a, row, lane, r, last);
  if constexpr (kCopy) {
    const float* out = a.out + row_offset(a.out_rows, row);
    __half* h = reinterpret_cast<__half*>(a.half) + row * a.d;
    for (int64_t j = 4 * lane; j < last; j += 128) store_f16(h + j, ld4(out + j), 1.0f);  // this lane's own writes
#pragma unroll
    for (int u = 0; u < kLaneVecs; ++u) {
      const int64_t j = last + 4 * lane + 128 * u;
      if (j < a.d) store_f16(h + j, r[u], 1.0f);
    }
    raise_row_max_warp(a.half_scales, static_cast<uint32_t>(row / a.half_group), mx);
  }
}

// Norm rows per warp of norm_vec4_block_kernel: two when a GEMM row has more than 16 (the 4B's 32 heads
// a token), so its block has at most 512 threads and two blocks share an SM at ~64 registers; with a
// warp per head the 1,024-thread blocks ran one per SM and a short pass's ~250 tokens in two waves.
__host__ __forceinline__ int block_rows_per_warp(int64_t half_group) { return half_group > 16 ? 2 : 1; }

// The FP16 copy of passes under kOptimisticMinGemmRows GEMM rows: one block per GEMM row of half_group
// norm rows, block_rows_per_warp rows a warp (a warp may have none: every warp still takes part in the
// block max). Each row's last chunk stays in registers for the copy (so out need not hold it:
// NormArgs::store_out); a longer row's earlier chunks are read back. kPer = block_rows_per_warp; kVecs
// 1 for rows of up to 128 floats (Kev's head rows), whose chunk needs half the registers (the sums'
// order is the same), so that two rows' chunks fit without spilling.
template <NormKind kKind, int kVecs, int kPer>
__global__ void __launch_bounds__(512, 2) norm_vec4_block_kernel(NormArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.half_group + static_cast<int64_t>(threadIdx.x / 32) * kPer;
  const int64_t end = min(row + kPer, (static_cast<int64_t>(blockIdx.x) + 1) * a.half_group);
  float4 r[kPer][kVecs];
  int64_t last = 0;  // the same for every row (d)
  float mx = 0.0f;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (row + q < end) mx = fmaxf(mx, norm_vec4_row<kKind, true, kVecs>(a, row + q, lane, r[q], last));
  }
  __shared__ float part[32];
  const float inv = f16_row_inverse_scale(block_max(mx, part));
  if (threadIdx.x == 0) a.half_scales[blockIdx.x] = 1.0f / inv;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int64_t i = row + q;
    if (i >= end) break;
    const float* out = a.out + row_offset(a.out_rows, i);
    __half* h = reinterpret_cast<__half*>(a.half) + i * a.d;
    for (int64_t j = 4 * lane; j < last; j += 128) store_f16(h + j, ld4(out + j), inv);  // this lane's own writes
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t j = last + 4 * lane + 128 * u;
      if (j < a.d) store_f16(h + j, r[q][u], inv);
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

// The rms_norm + rope launch (launch_norm_rope): launch_norm's warp-per-row float4 rows (one chunk: d <=
// kLaneChunk), then RoPE on the row's first n_rot dims (<= 128: lane l's first float4, dims 4l..4l+3)
// from the registers the norm left: lane l < n_rot/8 holds x_i, lane l + n_rot/8 its partner
// x_{i+n_rot/2}, one shuffle apart. Row = token · H + head (out is [n, H, d]). Lane l computes the
// cos/sin of pairs l and l + 32 only (a lane computing its four pairs' angles one after the other
// made the joined launch slower than the two it replaces: 10.1 against 5.6 + 5.7 µs traced, 0.8B
// short evaluation, H200) and the lanes exchange them by shuffles; the token's sequence start comes
// from one load of offsets[lane] issued before the row's loads (a ballot over the first 32 offsets;
// binary search past them). rope.cu's arithmetic (rope_cos_sin, rope_low / rope_high), so the bits are
// those of the two separate launches.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) norm_rope_kernel(NormArgs a, RopeArgs r) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows_of(a)) return;  // whole warps: the shuffles below see every lane of theirs
  const int32_t offset = lane <= r.n_seqs ? r.offsets[lane] : INT_MAX;
  float4 v[kLaneVecs];
  int64_t last = 0;
  norm_vec4_row<NormKind::Rms, false>(a, row, lane, v, last);
  const int64_t t = row / r.H;
  // offsets increase from offsets[0] = 0 <= t, so the lanes at or below t are a prefix; its last names t's
  // sequence when t < offsets[min(n_seqs, 31)], which holds unless over 31 sequences start at or before t.
  const unsigned below = __ballot_sync(0xffffffffu, offset <= t);
  int64_t start = __shfl_sync(0xffffffffu, offset, 31 - __clz(below));
  if (below == 0xffffffffu && r.n_seqs > 31) start = seq_start(r.offsets, r.n_seqs, t);
  const int64_t pos = r.pos0 + (t - start);
  const int half = static_cast<int>(r.n_rot / 2), quads = half / 4;  // quads: lanes per half of the dims
  float cs[2] = {}, sn[2] = {};
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    if (lane + 32 * u < half) rope_cos_sin(pos, lane + 32 * u, r.n_rot, r.theta, cs[u], sn[u]);
  }
  const int partner = lane < quads ? lane + quads : lane < 2 * quads ? lane - quads : lane;
  const bool low = lane < quads;
  const float own[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float other = __shfl_sync(0xffffffffu, own[e], partner);
    const int i = 4 * (low ? lane : lane - quads) + e;  // this element's pair (lanes >= 2·quads: unused)
    const float c0 = __shfl_sync(0xffffffffu, cs[0], i & 31), c1 = __shfl_sync(0xffffffffu, cs[1], i & 31);
    const float s0 = __shfl_sync(0xffffffffu, sn[0], i & 31), s1 = __shfl_sync(0xffffffffu, sn[1], i & 31);
    const float c = i < 32 ? c0 : c1, s = i < 32 ? s0 : s1;
    o[e] = low ? rope_low(own[e], other, c, s) : rope_high(other, own[e], c, s);
  }
  if (lane < 2 * quads) {
    *reinterpret_cast<float4*>(a.out + row_offset(a.out_rows, row) + 4 * lane) = make_float4(o[0], o[1], o[2], o[3]);
  }
}

constexpr int kRowThreads = 128, kRowVec = 8;  // wide rows: d / 4 <= kRowThreads · kRowVec

// kAdd: add_rms_norm (the row is x + y, written back through a.sum before the reduction). kHalf: also
// the row's FP16 copy (half_group = 1). kPlanes: y is the sum of a.z_planes' rows (kAdd only).
template <bool kAdd, bool kHalf, bool kPlanes = false>
__global__ void __launch_bounds__(kRowThreads) rms_norm_row_kernel(NormArgs a) {
  static_assert(kAdd || !kPlanes, "planes are add_rms_norm's y");
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
      if constexpr (kPlanes) {
        const int64_t plane = static_cast<int64_t>(gridDim.x) * a.d;  // a block per row
        const float* p = a.z_planes + row * a.d + 4 * j;
        yv[u] = ld4(p);
#pragma unroll
        for (int q = 1; q < kMaxKSplits; ++q) {
          if (q < a.z_n_planes) yv[u] = add4(yv[u], ld4(p + q * plane));
        }
      } else if constexpr (kAdd) {
        yv[u] = ld4(y + 4 * j);
      }
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
        if (kPlanes || ys != 1.0f) *reinterpret_cast<float4*>(const_cast<float*>(y) + 4 * j) = yv[u];
        v[u] = add4(v[u], yv[u]);
        *reinterpret_cast<float4*>(a.sum + x_off + 4 * j) = v[u];
      }
      ss += sum_squares(v[u]);
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
      if (!kHalf || a.store_out) *reinterpret_cast<float4*>(out + 4 * j) = v[u];
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
cudaError_t launch_vec4(const NormArgs& a, int64_t rows, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(norm_blocks(a));
  if (!a.half) {
    norm_vec4_kernel<kKind, HalfCopy::None><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const int64_t gemm_rows = rows / a.half_group;
  if (gemm_rows < kOptimisticMinGemmRows) {
    const int64_t per = block_rows_per_warp(a.half_group);
    const dim3 grid_rows(static_cast<unsigned>(gemm_rows)), block(static_cast<unsigned>(32 * ((a.half_group + per - 1) / per)));
    const bool one_vec = a.d <= 128;
    if (per == 1) {
      (one_vec ? norm_vec4_block_kernel<kKind, 1, 1> : norm_vec4_block_kernel<kKind, kLaneVecs, 1>)
          <<<grid_rows, block, 0, stream>>>(a);
    } else {
      (one_vec ? norm_vec4_block_kernel<kKind, 1, 2> : norm_vec4_block_kernel<kKind, kLaneVecs, 2>)
          <<<grid_rows, block, 0, stream>>>(a);
    }
    return cudaGetLastError();
  }
  cudaError_t err = cudaMemsetAsync(a.half_scales, 0, static_cast<size_t>(gemm_rows) * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  NormArgs stored = a;
  stored.store_out = true;  // the fix-up converts its rows again from out
  norm_vec4_kernel<kKind, HalfCopy::Optimistic><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(stored);
  err = cudaGetLastError();
  return err != cudaSuccess ? err
                            : launch_f16_rows_fixup(a.out, a.out_rows, a.d, a.half_group, a.half, a.half_scales, stream);
}

template <bool kAdd>
void launch_row(const NormArgs& a, int64_t rows, cudaStream_t stream) {
  if constexpr (kAdd) {
    if (a.z_planes) {
      if (a.half) {
        rms_norm_row_kernel<true, true, true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(a);
      } else {
        rms_norm_row_kernel<true, false, true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(a);
      }
      return;
    }
  }
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

bool norm_takes_planes(const NormArgs& a) {
  return a.kind == NormKind::AddRms && a.z_scales != nullptr && a.z_n_planes >= 1 && a.z_n_planes <= kMaxKSplits &&
         aligned16(a.z_planes) && norm_path(a) == NormPath::Row;
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

bool norm_rope_fusable(const NormArgs& a, const RopeArgs& r) {
  return a.kind == NormKind::Rms && a.half == nullptr && a.d > 0 && a.d <= kLaneChunk &&
         norm_path(a) == NormPath::Vec4 && a.out_rows.n_outer == 2 && r.x == a.out && r.n_tokens == a.out_rows.shape[0] &&
         r.H == a.out_rows.shape[1] && r.stride_token == a.out_rows.stride[0] && r.stride_head == a.out_rows.stride[1] &&
         r.n_rot > 0 && r.n_rot % 8 == 0 && r.n_rot <= 128 && r.n_rot <= a.d && norm_blocks(a) <= INT_MAX;
}

cudaError_t launch_norm_rope(const NormArgs& a, const RopeArgs& r, cudaStream_t stream) {
  if (!norm_rope_fusable(a, r)) return cudaErrorInvalidValue;
  if (a.x_rows.count() == 0) return cudaSuccess;
  norm_rope_kernel<<<static_cast<unsigned>(norm_blocks(a)), 32 * kWarpsPerBlock, 0, stream>>>(a, r);
  return cudaGetLastError();
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
  if (a.z_planes && !norm_takes_planes(a)) return cudaErrorInvalidValue;
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
      case NormKind::Rms: return launch_vec4<NormKind::Rms>(a, rows, stream);
      case NormKind::AddRms: return launch_vec4<NormKind::AddRms>(a, rows, stream);
      case NormKind::L2: return launch_vec4<NormKind::L2>(a, rows, stream);
      case NormKind::RmsGated: return launch_vec4<NormKind::RmsGated>(a, rows, stream);
    }
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
