// The narrow F16-weight projections of small passes (Kev's evaluation: n ≈ 220–256 token rows; outputs
// of at most 1,024 columns) on FP16 tensor cores, in place of cuBLASLt, which runs them far below its
// wide-output rate and splits K through a separate reduce kernel.
//
// Math. out[r, c] = (Σ_j x16[r, j] · W16[c, j]) · s_r + bias[c] for r < n, c < m: x16 the FP16 copy of
// the matmul's input (each row divided by its power-of-two scale s_r, f16_rows.cuh), W16 the FP16
// weights, products exact in the tensor cores and summed in FP32 (mma.sync.m16n8k16 .f32.f16.f16.f32);
// the row scale (null: 1; the backend passes null where the next op takes the rescale over) and the
// bias (null: none) are applied as one fmaf (v · s_r alone without bias), as the separate row kernel
// (elementwise.cu's scale_bias_rows) does after cuBLASLt, so their bits agree for the same sum.
// Summation order, fixed per (k, m): k is cut into S splits of whole 64-wide k tiles (split s: tiles
// [s·T/S, (s+1)·T/S) of T = ceil(k / 64)); within a split each of two warp groups sums its 16-wide k
// steps of every tile in ascending order on the tensor cores, group 0's sum is added to group 1's, and
// the splits' sums are added in ascending split order. S depends only on (k, m) and the device
// (gemm_splits), never on n, so a row's result does not depend on the other rows of the pass (nor on
// its position in it) and is bit-identical run to run.
//
// Layout. x16 [n, k] row-major contiguous (the backend's scratch copy), W16 [m, k] row-major
// contiguous (mma's "col" B operand: output column c is W's row c), out [n, m] with row stride ldo.
//
// Launch. A block computes a 128-row × 128-column output tile over one k split: grid (S, ceil(n/128),
// ceil(m/128)), 256 threads = two k groups of 4 warps; each warp owns a 64 × 64 output block (4 × 8
// m16n8 accumulators, 128 floats a thread) and, of every 64-wide k tile, the 16-wide steps of its
// group (group 0 steps 0 and 1, group 1 steps 2 and 3): a 64 × 64 warp block takes 8 ldmatrix per 32
// mma (a 64 × 32 one 6 per 16), and the second group doubles the warps without more shared memory. At
// the end group 1 leaves its sums in shared memory and group 0 adds them. x rows
// are the mma A operand and W rows the B operand, both read with ldmatrix (non-transposed: both are
// k-contiguous) from 64-wide k tiles held as 128-byte rows whose 16-byte chunks are XOR-swizzled by
// row % 8 (mma_f16.cuh's swz). Four stages of (x tile, W tile) = 128 KiB stream through a cp.async
// pipeline (three tiles in flight while one is multiplied, one barrier per tile); one block per SM
// (200 registers). Rows past n and columns past m are zero-filled by the copies (no global read) and
// never stored; a warp skips the m16 row groups that lie wholly past n, so a 220-row pass costs 224
// rows of products, not 256. The k tail (k a multiple of 16, not of 64) is zero-filled too. Blocks
// sharing a W tile are adjacent in the grid (the row tiles sit in grid.y, inside grid.z's column
// tiles), so both 128-row tiles of a pass read it while it is in L2.
// Split-K (S > 1): the S blocks of an output tile run as one thread block cluster (S × 1 × 1, S ≤ 8,
// the portable size); after the k loop each block has its 128 × 128 partial tile in its own shared
// memory (over the pipeline buffers), a cluster barrier, then block `rank` reduces rows rank,
// rank + S, ... (a warp per row, a float4 per lane) from all S blocks through distributed shared
// memory in split order and writes them to out, and a second barrier keeps every block's shared
// memory alive until the others have read it: one kernel, no workspace, no reduce launch.
// S = the count (1..8, at least 2 k tiles a split) that minimises waves × (k tiles per split + 2, the
// pipeline's fill and the epilogue) for the tiles of a 256-row pass (two row tiles), a wave being the
// S-block clusters the driver reports resident at once (cudaOccupancyMaxActiveClusters, asked once
// per device); ties go to the smaller S.
// Dispatch (gemm_f16_small_preferred, the backend's default): outputs of at most 1,024 columns (16
// tiles at 256 rows: the MLP down projection, out_proj / o_proj and k/v of both models), where
// cuBLASLt ran at 90–145 TFLOP/s on the H200; on wide outputs (in_proj, gate_up, q, k|v|q) it runs
// wgmma kernels at 390–440 TFLOP/s that mma.sync does not approach (docs/backends.md, CUDA matmul).
// Preconditions (gemm_f16_small_supported): 1 <= n <= 256, k % 16 == 0, x and W rows 16-byte
// aligned (16-byte copies), out rows 8-byte aligned (float2 stores); sm_90 (clusters; the dispatch
// asks gemm_f16_small_available()).
#include "backend/cuda/gemm_f16_small.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/mma_f16.cuh"

namespace kev::cuda {

namespace {

constexpr int kTileRows = 128;  // x rows (tokens) per block
constexpr int kTileCols = 128;  // W rows (output columns) per block
constexpr int kTileK = 64;      // k per pipeline stage: one 128-byte swizzled row per tile row
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kWarpRows = 64, kWarpCols = 64;  // a warp's output block; 4 warps cover the tile
constexpr int kKGroups = 2;                    // warp groups splitting each k tile's 16-wide steps
constexpr int kMaxSplits = 8;                  // the portable cluster size
constexpr int kChunks = kTileK / 8;            // 16-byte chunks per tile row
constexpr int kLoads = kTileRows * kChunks / kThreads;  // chunks of x (and of W) a thread copies per stage
constexpr int kStageHalves = (kTileRows + kTileCols) * kTileK;
// A partial tile in shared memory (the warp groups' sum, then the cluster's): pitch 128 + 8 floats, so
// a quarter-warp's float2 accesses (rows g, columns 2t) meet every bank once per phase.
constexpr int kPartLd = kTileCols + 8;
constexpr size_t kPipeBytes = static_cast<size_t>(kStages) * kStageHalves * sizeof(__half);
constexpr size_t kPartBytes = static_cast<size_t>(kTileRows) * kPartLd * sizeof(float);
constexpr size_t kSmemBytes = kPipeBytes > kPartBytes ? kPipeBytes : kPartBytes;
static_assert(kThreads == kKGroups * (kTileRows / kWarpRows) * (kTileCols / kWarpCols) * 32, "8 warps");
static_assert(kTileK / 16 % kKGroups == 0, "whole 16-wide steps per warp group");
static_assert(kTileRows == kTileCols, "x and W tiles share the copy loop");
static_assert(kTileRows * kChunks % kThreads == 0, "whole copies per thread");
static_assert(2 * (kSmemBytes + 1024) > 228 * 1024 && kSmemBytes <= 227 * 1024, "one block per SM on sm_90");

struct Params {
  const __half* x;
  const __half* w;
  float* out;
  int64_t ldo;
  const float* row_scales;
  const float* bias;
  int n, k, m;
  int k_tiles;  // ceil(k / kTileK)
};

// The row scale and bias applied to a sum, as scale_bias_rows applies them after cuBLASLt.
__device__ __forceinline__ float finish(float v, float s, const float* bias, int c) {
  return bias != nullptr ? fmaf(v, s, bias[c]) : v * s;
}

// Stores columns c, c + 1 of row r (c even; the pair straddles m only when m is odd).
__device__ __forceinline__ void store_pair(const Params& p, int r, int c, float v0, float v1) {
  if (r >= p.n || c >= p.m) return;
  const float s = p.row_scales != nullptr ? p.row_scales[r] : 1.0f;
  float* dst = p.out + static_cast<int64_t>(r) * p.ldo + c;
  if (c + 1 < p.m) {
    *reinterpret_cast<float2*>(dst) = make_float2(finish(v0, s, p.bias, c), finish(v1, s, p.bias, c + 1));
  } else {
    dst[0] = finish(v0, s, p.bias, c);
  }
}

// The S k splits of one output tile, launched as a cluster (header: "Split-K"): each block has left
// its partial tile in its own shared memory; block `rank` adds rows rank, rank + S, ... of all S tiles
// in split order and writes them.
__device__ __forceinline__ void reduce_cluster_splits(const Params& p, const float* part, int row0, int col0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's partial tile is in its shared memory
  const int splits = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* src[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) src[s] = cluster.map_shared_rank(part, s < splits ? s : rank);
  const int rows = min(kTileRows, p.n - row0), c = 4 * lane;
  for (int r = rank + splits * warp; r < rows; r += splits * (kThreads / 32)) {
    float4 v = *reinterpret_cast<const float4*>(src[0] + r * kPartLd + c);
#pragma unroll
    for (int s = 1; s < kMaxSplits; ++s) {
      if (s < splits) {
        const float4 u = *reinterpret_cast<const float4*>(src[s] + r * kPartLd + c);
        v.x += u.x;
        v.y += u.y;
        v.z += u.z;
        v.w += u.w;
      }
    }
    store_pair(p, row0 + r, col0 + c, v.x, v.y);
    store_pair(p, row0 + r, col0 + c + 2, v.z, v.w);
  }
  cluster.sync();
#endif
}

template <bool kCluster>
__global__ void __launch_bounds__(kThreads, 1) gemm_f16_small_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* tiles = reinterpret_cast<__half*>(smem_raw);  // stage b: x tile [128][64], then W tile [128][64]
  const int split = blockIdx.x, splits = gridDim.x;
  const int row0 = blockIdx.y * kTileRows, col0 = blockIdx.z * kTileCols;
  const int kt_begin = split * p.k_tiles / splits, kt_end = (split + 1) * p.k_tiles / splits;
  const int n_kt = kt_end - kt_begin;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int mat = lane >> 3, mrow = lane & 7;  // ldmatrix: this lane's matrix and row within it

  // This thread's copies: rows tid / 8 + 32 i of the x and W tiles, 16-byte chunk tid % 8 of each.
  const int ld_chunk = tid % kChunks, ld_row = tid / kChunks;
  const __half* x_src[kLoads];
  const __half* w_src[kLoads];
  bool x_ok[kLoads], w_ok[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = ld_row + i * (kThreads / kChunks);
    x_ok[i] = row0 + r < p.n;
    w_ok[i] = col0 + r < p.m;
    x_src[i] = p.x + static_cast<int64_t>(x_ok[i] ? row0 + r : 0) * p.k + 8 * ld_chunk;
    w_src[i] = p.w + static_cast<int64_t>(w_ok[i] ? col0 + r : 0) * p.k + 8 * ld_chunk;
  }
  // Copies k tile kt into stage buffer buf (one cp.async group); chunks past k read nothing (zeros).
  auto stage = [&](int kt, int buf) {
    __half* xs = tiles + buf * kStageHalves;
    __half* ws = xs + kTileRows * kTileK;
    const bool k_ok = kt * kTileK + 8 * ld_chunk < p.k;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int r = ld_row + i * (kThreads / kChunks);
      const bool xf = x_ok[i] && k_ok, wf = w_ok[i] && k_ok;
      cp_async<16>(xs + swz<kTileK>(r, ld_chunk), xf ? x_src[i] + kt * kTileK : p.x, xf);
      cp_async<16>(ws + swz<kTileK>(r, ld_chunk), wf ? w_src[i] + kt * kTileK : p.w, wf);
    }
    cp_async_commit();
  };

  const int kg = warp / 4;                       // the warp's k group: 16-wide steps 2·kg, 2·kg + 1
  const int wr = ((warp & 3) >> 1) * kWarpRows;  // the warp's first row in the tile
  const int wc = (warp & 1) * kWarpCols;         // and first column
  const int warp_rows = p.n - row0 - wr;         // rows of the warp's 64 that exist (<= 0: none)
  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_kt) {
      stage(kt_begin + s, s);
    } else {
      cp_async_commit();  // keeps the group count the waits below assume
    }
  }
  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<kStages - 2>();  // tile it has landed (this thread's copies)
    __syncthreads();               // everyone's copies; and everyone is done with tile it - 1's buffer
    const int next = it + kStages - 1;
    if (next < n_kt) {
      stage(kt_begin + next, next % kStages);
    } else {
      cp_async_commit();
    }
    const __half* xs = tiles + (it % kStages) * kStageHalves;
    const __half* ws = xs + kTileRows * kTileK;
    if (warp_rows > 0) {
#pragma unroll
      for (int q = 0; q < kTileK / 16 / kKGroups; ++q) {
        const int kk = kg * (kTileK / 16 / kKGroups) + q;
        uint32_t b[8][2];
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t r4[4];
          ldmatrix_x4(r4, ws + swz<kTileK>(wc + 16 * np + mrow + 8 * (mat >> 1), 2 * kk + (mat & 1)));
          b[2 * np][0] = r4[0];
          b[2 * np][1] = r4[1];
          b[2 * np + 1][0] = r4[2];
          b[2 * np + 1][1] = r4[3];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (16 * i < warp_rows) {
            uint32_t a[4];
            ldmatrix_x4(a, xs + swz<kTileK>(wr + 16 * i + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
            for (int j = 0; j < 8; ++j) mma_f16(acc[i][j], a, b[j][0], b[j][1]);
          }
        }
      }
    }
  }

  // The two k groups' sums meet in shared memory (over the pipeline buffers): group 1 stores, group 0
  // adds (acc0 + acc1).
  cp_async_wait_all();
  __syncthreads();
  float* part = reinterpret_cast<float*>(smem_raw);
  auto part_at = [&](int i, int j, int h) { return part + (wr + 16 * i + g + 8 * h) * kPartLd + wc + 8 * j + 2 * t4; };
  if (kg == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(part_at(i, j, 0)) = make_float2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<float2*>(part_at(i, j, 1)) = make_float2(acc[i][j][2], acc[i][j][3]);
      }
    }
  }
  __syncthreads();
  if (kg == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 o = *reinterpret_cast<const float2*>(part_at(i, j, h));
          const float v0 = acc[i][j][2 * h] + o.x, v1 = acc[i][j][2 * h + 1] + o.y;
          if constexpr (kCluster) {
            *reinterpret_cast<float2*>(part_at(i, j, h)) = make_float2(v0, v1);  // this block's partial tile
          } else {
            store_pair(p, row0 + wr + 16 * i + g + 8 * h, col0 + wc + 8 * j + 2 * t4, v0, v1);
          }
        }
      }
    }
  }
  if constexpr (kCluster) reduce_cluster_splits(p, part, row0, col0);
}

// What the launches need to know of the current device, asked of the driver once per device: its SM
// count (0: the kernel does not run there) and, per split count S, the S-block clusters resident at
// once.
struct DeviceInfo {
  int sms = 0;
  int clusters[kMaxSplits + 1] = {};
};

DeviceInfo device_info() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  static std::mutex mutex;
  static std::map<int, DeviceInfo> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  DeviceInfo info;
  int launch = 0;
  cudaFuncAttributes attr = {};
  bool ok = cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, device) == cudaSuccess && launch != 0 &&
            cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
            cudaFuncGetAttributes(&attr, gemm_f16_small_kernel<true>) == cudaSuccess && attr.binaryVersion >= 90 &&
            cudaFuncSetAttribute(gemm_f16_small_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kSmemBytes)) == cudaSuccess &&
            cudaFuncSetAttribute(gemm_f16_small_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kSmemBytes)) == cudaSuccess;
  info.clusters[1] = info.sms;
  for (int s = 2; ok && s <= kMaxSplits; ++s) {
    cudaLaunchAttribute cluster[1] = {};
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = s;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(s, 1, 1);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.attrs = cluster;
    cfg.numAttrs = 1;
    ok = cudaOccupancyMaxActiveClusters(&info.clusters[s], gemm_f16_small_kernel<true>, &cfg) == cudaSuccess;
  }
  if (!ok) {
    cudaGetLastError();
    info = DeviceInfo{};
  }
  known.emplace(device, info);
  return info;
}

// Splits of k (header: "Split-K"), from k, m and the device only.
int gemm_splits(int64_t k, int64_t m, const DeviceInfo& info) {
  const int64_t k_tiles = (k + kTileK - 1) / kTileK;
  const int64_t tiles = (kGemmF16SmallMaxRows / kTileRows) * ((m + kTileCols - 1) / kTileCols);
  int best = 1;
  int64_t best_cost = (tiles + info.sms - 1) / info.sms * (k_tiles + 2);
  for (int s = 2; s <= kMaxSplits && k_tiles / s >= 2; ++s) {
    if (info.clusters[s] == 0) continue;
    const int64_t cost = (tiles + info.clusters[s] - 1) / info.clusters[s] * ((k_tiles + s - 1) / s + 2);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace

bool gemm_f16_small_available() { return device_info().sms > 0; }

bool gemm_f16_small_supported(int64_t n, int64_t k, int64_t m, int align_x, int align_w, int align_out) {
  return n >= 1 && n <= kGemmF16SmallMaxRows && k >= 16 && k % 16 == 0 && k <= INT32_MAX && m >= 1 &&
         (m + kTileCols - 1) / kTileCols <= 65535 && align_x >= 16 && align_w >= 16 && align_out >= 8;
}

bool gemm_f16_small_preferred(int64_t m) { return m <= kGemmF16SmallMaxCols; }

cudaError_t launch_gemm_f16_small(const GemmF16SmallArgs& a, cudaStream_t stream) {
  const DeviceInfo info = device_info();
  if (info.sms == 0) return cudaErrorNoKernelImageForDevice;
  Params p;
  p.x = reinterpret_cast<const __half*>(a.x);
  p.w = reinterpret_cast<const __half*>(a.w);
  p.out = a.out;
  p.ldo = a.ldo;
  p.row_scales = a.row_scales;
  p.bias = a.bias;
  p.n = static_cast<int>(a.n);
  p.k = static_cast<int>(a.k);
  p.m = static_cast<int>(a.m);
  p.k_tiles = static_cast<int>((a.k + kTileK - 1) / kTileK);
  const int splits = gemm_splits(a.k, a.m, info);
  const dim3 grid(splits, static_cast<unsigned>((a.n + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((a.m + kTileCols - 1) / kTileCols));
  if (splits == 1) {
    gemm_f16_small_kernel<false><<<grid, kThreads, kSmemBytes, stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, gemm_f16_small_kernel<true>, p);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace kev::cuda
