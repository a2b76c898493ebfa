// Causal grouped-query attention over a shared read-only prefix K/V plus each packed sequence's own
// keys (the Attention op), flash-attention style, both products on tensor cores: at FP32 accuracy
// (3xTF32, the default), or on FP16 operands with FP32 accumulation (AttentionArgs::f16, the CUDA
// backend's 16-bit GEMM modes; "FP16 products" below).
//
// Math. For query token t of sequence r (tokens [b_r, e_r) of the packed pass) and query head h
// (KV head h / (H/Hkv)):
//   out[t,h,:] = Σ_s softmax_s(scale · q[t,h]·key_s) · value_s
// over the keys s = all prefix_len prefix keys, then the sequence's own keys b_r..t (inclusive).
// The scale is applied here (scale · q·k); unlike the GDN kernel, q arrives unscaled.
// Online softmax per query row: running max m and sum l; each key tile rescales the accumulator by
// e^{m_old − m_new}, in FP32 with expf (not the fast intrinsic).
// Products (S = Q·Kᵀ, O += P·V) run as 3xTF32 on mma.sync.m16n8k8: each FP32 operand is split into
// a = a_hi + a_lo with a_hi = a rounded to TF32 (nearest, ties away: integer add and mask), a_lo =
// a − a_hi exactly (FP32 subtraction of two numbers within a factor 2), then truncated to TF32; the
// tensor cores accumulate a_hi·b_hi and, in two more accumulators, a_lo·b_hi and a_hi·b_lo in FP32
// (so consecutive mma instructions do not wait for each other). The
// dropped a_lo·b_lo term and the truncation of a_lo leave a relative error near 2^-21 per product,
// the order of FP32's own rounding; plain TF32 (2^-11) would not hold the end-to-end tolerance. The
// tensor cores' accumulation truncates, so no accumulator runs long: scores sum 64 dimensions from
// zero, P·V's main products 8 keys and its cross terms (2^-11 of the sum) the tile's 32 keys, and
// those partial sums are added in FP32 (round to nearest). Operands are split as fragments are read
// from shared memory (FP32 there; four integer / FP32 instructions per element); a warp's P fragments
// are split once per key tile and stay in registers over the V chunks. Splitting everything once
// instead (Q at load, K/V as a chunk lands, p in the softmax; (hi, lo) pairs in sm_90's larger shared
// memory) timed slower on the H200 (2,187-token prefill 1.81 ms against 1.33): the fragment reads
// carry twice the bytes, and shared-memory traffic costs more here than the split instructions.
//
// Layout. q, out [n, H, hd] with token / head strides; k, v [n, Hkv, hd] with token / head strides;
// prefix_k, prefix_v [prefix_len, Hkv, hd] contiguous. All strides in elements.
//
// Launch. A block owns the query rows of one KV head kvh and a tile of T = floor(64 / G) consecutive
// packed tokens (G = H/Hkv query heads per KV head): row ρ is token q0 + ρ / G, head kvh·G + ρ % G, so
// the G heads sharing a KV head read each K/V tile once. Grid (ceil(n_tokens / T), Hkv, S), 256
// threads (8 warps); tiles are visited last-first (blockIdx.x reversed) so a causal prefill's long
// rows start first. Key splits (flash-decoding): Kev's passes have few query tiles (250 tokens,
// Hkv = 2: 32 blocks on a 132-SM GPU), so when ceil(n_tokens / T)·Hkv is under two blocks per SM the
// block's key tiles are split evenly over S = attention_split_count() blocks (blockIdx.z; the backend
// stores S in the args when it records the op): the S (at least two key tiles a split) that
// minimises waves × (key tiles per split + 1 for the Q load), key tiles those of the longest possible
// query tile. The splits' rows are merged as m = max_s m_s, out = Σ_s e^{m_s−m} O_s / Σ_s e^{m_s−m} l_s
// (a split that saw no visible key for a row contributes m_s = −inf, l_s = 0, O_s = 0). Here (3xTF32,
// and FP16 before sm_90) S ≤ 16, waves are counted at the blocks per SM the kernel is compiled for,
// each split writes its rows' unnormalised output and running (max, sum) to the workspace,
// S·n_tokens·H·(hd + 2) floats, and a combine kernel (one 64-thread block per (token, head)) merges
// them. With the FP16 products on sm_90 the S ≤ 8 blocks of a query tile run as one thread block
// cluster (see "Cluster merge" below) and no combine kernel runs. S depends only on n_tokens, H, Hkv,
// hd, prefix_len, f16 and the device; at S = 1 the block writes the normalised output itself (no
// workspace for the 3xTF32 products). A tile may span sequences: each row finds its sequence start in
// `offsets` (seq_start) and the block walks the own-key range [start of its first token's sequence,
// its last token], masking key s for row (t, b_t) unless b_t <= s <= t. Prefix keys are visible to
// every valid row.
// A key tile (32 keys) arrives as 2·hd/64 chunks of 32 keys × 64 columns: K's column blocks, then
// V's. Chunks stream through two shared buffers with cp.async (16-byte copies when aligned, 4-byte
// otherwise; rows past the tile's end zero-filled): chunk i+1, of this tile or the next, is copied
// while chunk i is consumed, with one barrier per chunk. Per chunk:
//   K chunk: S += Q·Kᵀ over its 64 columns (warp w: rows 16·(w%4).., keys 16·(w/4).., two m16n8
//   tiles); after the last one the scaled scores go to P, then masking and the online-softmax update
//   (thread: 2 rows × 4 keys, row max / sum over 8 lanes) write p and the rows' rescale factors.
//   V chunk: O[:, its 64 columns] = diag(α)·O + P·V (warp w: rows 16·(w%4).., 32 of the columns, in
//   registers in the m16n8 accumulator layout; P's fragments are read and split at the tile's first
//   V chunk only).
// K chunk rows are padded to 64 + 4 floats and V rows to 64 + 8 so that the fragment reads (K:
// key-major, V: key-minor) hit 32 distinct banks. Shared memory at hd = 256: Q 64×260 + 2 chunks of
// 32×72 + P 64×36 floats + row data = 93 KiB (61 at hd 128, 45 at 64), under the 99 KiB per-block
// limit of sm_86/sm_89. Registers: hd 256 is compiled for one block per SM (up to 255 registers; 238,
// no spills), hd 64 and 128 for two (128 registers; hd 128 spills a little). The grid never depends on
// the offsets' values.
// Preconditions (attention_supported): hd ∈ {64, 128, 256}, Hkv >= 1 divides H, G = H/Hkv <= 64,
// Hkv <= 65535; sm_80 or newer (TF32 and FP16 mma, ldmatrix, cp.async). Global loads and stores use
// 16-byte copies (output float2) when every base pointer is 16-byte aligned and every stride a
// multiple of 4, scalar accesses otherwise.
//
// FP16 products (AttentionArgs::f16). The same query rows, masks, key splits and merges; S = Q·Kᵀ and
// O += P·V on mma.sync.m16n8k16 with FP16 operands and FP32 accumulation, softmax in FP32.
// Representation. FP16 keeps 11 significant bits (BF16 8: the rounding of q and k sets the scores'
// absolute error, which softmax turns into relative error of every probability) but ends at 65,504,
// and q and k leave an RMSNorm with a learned gain while v has no norm at all, so larger values are
// possible. Every operand therefore goes through f16_rows.cuh's rule, the F16 GEMM inputs' own: a group
// of values is divided by a power of two s (1 unless the group's max |x| lies outside [2^-10, 2^15],
// then into [2^14, 2^15]) before rounding, and s multiplies the products back in FP32. That is exact,
// so nothing overflows and an element's rounding error is at most 2^-11 of itself or, in FP16's
// subnormals, 2^-15 of its group's max |x| (a group holding inf keeps s = 1 and gives inf / NaN, as
// FP32 would). Groups: each q row (its s folds into the row's score
// factor); per KV head and key tile, its 32 keys × hd of K and, separately, of V (s_k folds into the
// tile's score factor; O is held in units of the current tile's s_v, rescaled by s_v,old / s_v,new
// together with the softmax's α, a power of two, exact). p ∈ [0, 1] is rounded unscaled (p < 2^-14
// becomes subnormal: absolute error <= 2^-25 against a row sum >= 1), and the row sum adds the rounded
// p, so each output row is a convex combination of the rounded values. Each operand's rounding is <=
// 2^-11 relative; emulating these roundings in double at the op tests' inputs (q, k ~ N(0, 4), v ~
// N(0, 1), hd 64 and 256, 40 to 2,049 keys) gives NMSE 2.5e-7 to 4.2e-7 against exact attention
// (3xTF32: 1e-13).
// Conversion. Every query tile of a KV head reads all its key tiles, so K and V are converted once per
// op by a pre-pass (attention_keys_f16_kernel: one 256-thread block per key tile and KV head, block
// max, f16_rows.cuh's rule) into workspace copies [L, Hkv, hd] FP16 of the unified key list (prefix
// keys, then the pass's; L rounded up to 32 with zero keys) plus (s_k, s_v) per tile and KV head. The
// kernel then streams FP16 tiles with cp.async: converting in the kernel would need the tile in
// registers (32 keys × hd 256 × K and V = 128 floats a thread) or an FP32 staging area that halves the
// blocks per SM. The pre-pass moves 6 bytes per key element (4B long prefill: 27 MB; not timed on
// its own: the whole op went from 1.29 to 0.37 ms there on the H200). Q is converted as it is loaded,
// once per block, each warp its own 16 rows (row max over the warp), eight rows' loads in flight.
// Key tiles sit at multiples of 32 of the unified list, so a tile's scales are shared by all blocks:
// a block visits every prefix tile, then those holding its own keys (the first may overlap the last
// prefix tile or start in an earlier sequence; the masks hide those keys).
// Launch. Grid as above, 128 threads (4 warps): warp w owns rows 16w..16w+15 and the whole key tile.
// S (16 × 32 per warp, two accumulator sets over alternating k-steps), masking and the online softmax
// stay in registers (row max and sum over a quad's 4 lanes; exp2 of log2(e)-scaled scores); p is
// rounded to FP16 straight into P·V's A fragments (the m16n8 accumulator layout is the m16n8k16 A
// layout), and O (16 × hd per warp, hd/2 floats a thread) accumulates in registers. Shared memory
// holds Q and two buffers each of K and V tiles as FP16 rows whose 16-byte chunks are XOR-swizzled by
// row % 8, so the 8 rows an ldmatrix phase reads hit distinct banks; tile i+1 copies during tile i's
// products, one barrier per tile. 384·hd bytes + row data (hd 256: 97 KiB; two blocks per SM on
// sm_90, one on sm_86/89); compiled for two blocks per SM (255 registers at hd 256), four at hd 64.
// Cluster merge (FP16 products, sm_90). The S key splits of a query tile are one thread block cluster
// (1 × 1 × S, S <= 8, the portable size): after its key loop each block writes its unnormalised rows
// (times s_v) and (m, l) into its own shared memory, over Q and the K/V tiles; after a cluster barrier
// block `rank` merges rows rank, rank + S, ... (a warp per row) reading all S blocks' rows through
// distributed shared memory, and writes them to out; a second barrier keeps every block's shared
// memory alive until the others have read it. No partial rows go through global memory and no combine
// kernel runs: in Kev's small passes the combine (4B 6 × 37 rows: 4,000 64-thread blocks) had cost
// about as much as the attention kernel. A cluster occupies a GPC's SMs whole, so fewer blocks may be
// resident than without clusters: waves count the clusters cudaOccupancyMaxActiveClusters reports
// (5-block clusters at 4B 5 × 40 rows over 2,187 keys, where the plain count had picked S = 5, timed
// 0.13 ms against 0.09 unclustered). The 3xTF32 kernel keeps the combine kernel: at hd 256 it runs
// one block per SM, so an S-block cluster needs S SMs of one GPC, and merged in clusters it timed
// slower (4B 5 × 40 rows over 2,187 keys 0.281 → 0.322 ms, 0.8B 250-token prefill 34.6 → 39.5 µs;
// faster only at 4B 6 × 37 rows over 250 keys, 66.3 → 58.4 µs). H200, `CudaAttention.DISABLED_Timing`,
// FP16, 2026-12-01, against the combine kernel in the same run: 4B 6 × 37 rows over 250 keys 44.3 →
// 35.7 µs, 0.8B 40.8 → 30.4, 0.8B 250-token prefill 31.0 → 29.8, the 2,187-token prefill (no splits)
// 372 → 368; with the occupancy-counted waves (next run) 35.2, 30.9, 28.8 µs, 4B 5 × 40 rows over
// 2,187 keys 90.9 µs (91.9 with the combine kernel), 4B 250-token prefill 33.8 µs (45.2 with the
// plain count).
#include "backend/cuda/attention.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/f16_rows.cuh"
#include "backend/cuda/mma_f16.cuh"
#include "backend/cuda/mma_tf32.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention.cu needs sm_80 or newer (mma.sync .tf32 / .f16, ldmatrix, cp.async): set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

namespace kev::cuda {

namespace {

constexpr int kRows = 64;     // query rows per block
constexpr int kKeys = 32;     // keys per tile
constexpr int kCols = 64;     // K / V columns per staged chunk; also the scores' tensor-core sum length
constexpr int kThreads = 256;
constexpr int kWarpRows = 16;  // one m16 tile of rows per warp; kRows / kWarpRows = 4 row groups
constexpr int kMaxGridY = 65535;
constexpr int kMaxSplits = 16;
constexpr int kMaxClusterSplits = 8;  // the portable cluster size
constexpr int kCombineThreads = 64;
static_assert(kThreads / 32 == 2 * (kRows / kWarpRows), "two warps per row group (keys or columns halved)");
static_assert(kThreads == 8 * kKeys, "the softmax maps 8 threads to a row pair of one tile");

template <int HD>
struct AttnLayout {
  // Row strides ≡ 4 (mod 32) make a fragment read (lane: row g = lane/4, column t = lane%4) touch 32
  // distinct banks; V is read with rows and columns swapped (row t, column g), hence ≡ 8.
  static constexpr int kLdQ = HD + 4;
  static constexpr int kLdK = kCols + 4;
  static constexpr int kLdV = kCols + 8;
  static constexpr int kLdP = kKeys + 4;
  static constexpr int kChunk = kKeys * kLdV;  // one staging buffer (K chunks use the first 32×68)
  static constexpr int kQ = 0;
  static constexpr int kKV = kQ + kRows * kLdQ;
  static constexpr int kP = kKV + 2 * kChunk;
  static constexpr int kAlpha = kP + kRows * kLdP;
  static constexpr int kL = kAlpha + kRows;
  static constexpr int kFloats = kL + kRows;
  static constexpr size_t kBytes = kFloats * sizeof(float) + 2 * kRows * sizeof(int);  // + row_lo, row_hi
  static_assert(kKV % 4 == 0 && kChunk % 4 == 0 && kP % 4 == 0 && kLdK % 4 == 0 && kLdV % 4 == 0,
                "16-byte cp.async destinations, float2 score stores");
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Four consecutive floats: one 16-byte load when vec (p 16-byte aligned), else four scalar loads.
__device__ __forceinline__ float4 load4(const float* p, bool vec) {
  return vec ? ld4(p) : make_float4(p[0], p[1], p[2], p[3]);
}

// Copies `rows` rows of W floats into shared rows of stride ld; src(i) is row i's global address
// (already offset to the first column) or null for a zero row.
template <int W, typename Src>
__device__ __forceinline__ void load_rows(float* dst, int ld, int rows, bool vec, Src src) {
  if (vec) {
    for (int idx = threadIdx.x; idx < rows * (W / 4); idx += kThreads) {
      const int i = idx / (W / 4), d = 4 * (idx % (W / 4));
      const float* p = src(i);
      *reinterpret_cast<float4*>(dst + i * ld + d) = p != nullptr ? ld4(p + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * W; idx += kThreads) {
      const int i = idx / W, d = idx % W;
      const float* p = src(i);
      dst[i * ld + d] = p != nullptr ? p[d] : 0.0f;
    }
  }
}

// Stores an accumulator pair (two adjacent columns of one row).
__device__ __forceinline__ void store2(float* dst, float x, float y, bool vec) {
  if (vec) {
    *reinterpret_cast<float2*>(dst) = make_float2(x, y);
  } else {
    dst[0] = x;
    dst[1] = y;
  }
}

// A split's partial rows as a cluster merges them (merge_cluster_splits): its unnormalised O rows
// (pitch HD + 8: an accumulator pair store, row g and column 8j + 2t, meets each bank twice, the least
// for 64 floats), then (m, l) per row in natural-log units. It reuses the block's Q and K/V space.
template <int HD>
struct ClusterPart {
  static constexpr int kLd = HD + 8;
  static constexpr int kML = kRows * kLd;
  static constexpr size_t kBytes = (kML + 2 * kRows) * sizeof(float);
};

// The key splits of one query tile, launched as one thread block cluster (header: "Cluster merge"),
// merge in distributed shared memory: each block has left its partial rows in its own shared memory
// (ClusterPart); block `rank` merges rows rank, rank + S, ... (a warp per row) from all S blocks as
// the combine kernel does and writes them to out.
template <int HD>
__device__ __forceinline__ void merge_cluster_splits(const AttentionArgs& a, const float* part, int q0, int kvh,
                                                     int n_rows, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's rows are in its shared memory
  const int n_splits = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int G = a.H / a.Hkv, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float* src[kMaxClusterSplits];
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) src[s] = cluster.map_shared_rank(part, s < n_splits ? s : rank);
  for (int row = rank + n_splits * static_cast<int>(threadIdx.x >> 5); row < n_rows; row += n_splits * warps) {
    float2 ml[kMaxClusterSplits];
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      ml[s] = s < n_splits ? *reinterpret_cast<const float2*>(src[s] + ClusterPart<HD>::kML + 2 * row)
                           : make_float2(-INFINITY, 0.0f);
      m = fmaxf(m, ml[s].x);
    }
    // m is finite: the split holding the row's own token saw at least that key.
    float w[kMaxClusterSplits], l = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      w[s] = ml[s].x == -INFINITY ? 0.0f : expf(ml[s].x - m);
      l += w[s] * ml[s].y;
    }
    const float inv = 1.0f / l;
    const int64_t t = q0 + row / G, h = kvh * G + row % G;
    float* dst = a.out + t * a.out_token_stride + h * a.out_head_stride;
#pragma unroll
    for (int c = 4 * lane; c < HD; c += 128) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < n_splits) {
          const float4 x = *reinterpret_cast<const float4*>(src[s] + row * ClusterPart<HD>::kLd + c);
          acc = make_float4(fmaf(w[s], x.x, acc.x), fmaf(w[s], x.y, acc.y), fmaf(w[s], x.z, acc.z),
                            fmaf(w[s], x.w, acc.w));
        }
      }
      store2(dst + c, acc.x * inv, acc.y * inv, vec);
      store2(dst + c + 2, acc.z * inv, acc.w * inv, vec);
    }
  }
  cluster.sync();
#endif
}

// The keys of key tile kt: prefix keys s0.. (< s_end = prefix_len) or own keys s0.. (<= the block's
// last token).
struct KeyTile {
  int64_t s0, s_end;
  bool prefix;
};

__device__ __forceinline__ KeyTile key_tile(int64_t kt, int64_t n_prefix_tiles, int64_t prefix_len, int own_lo,
                                            int own_hi) {
  if (kt < n_prefix_tiles) return {kt * kKeys, prefix_len, true};
  return {own_lo + (kt - n_prefix_tiles) * kKeys, static_cast<int64_t>(own_hi) + 1, false};
}

// Starts the copy of chunk c of `tile` (c < HD/kCols: K's columns kCols·c.., else V's) into buf and
// commits it as one cp.async group.
template <int HD>
__device__ __forceinline__ void stage_chunk(const AttentionArgs& a, int kvh, const KeyTile& tile, int c, float* buf,
                                            bool vec) {
  constexpr int NC = HD / kCols;
  const bool is_v = c >= NC;
  const int col = (is_v ? c - NC : c) * kCols, ld = is_v ? AttnLayout<HD>::kLdV : AttnLayout<HD>::kLdK;
  const float* pbase = is_v ? a.prefix_v : a.prefix_k;
  const float* obase = is_v ? a.v : a.k;
  auto row = [&](int i) -> const float* {
    const int64_t s = tile.s0 + i;
    if (s >= tile.s_end) return nullptr;
    if (tile.prefix) return pbase + s * (static_cast<int64_t>(a.Hkv) * HD) + static_cast<int64_t>(kvh) * HD + col;
    return obase + s * a.kv_token_stride + static_cast<int64_t>(kvh) * a.kv_head_stride + col;
  };
  if (vec) {
#pragma unroll
    for (int idx = threadIdx.x; idx < kKeys * (kCols / 4); idx += kThreads) {
      const int i = idx / (kCols / 4), d = 4 * (idx % (kCols / 4));
      const float* p = row(i);
      cp_async<16>(buf + i * ld + d, p != nullptr ? p + d : obase, p != nullptr);
    }
  } else {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < kKeys * kCols; idx += kThreads) {
      const int i = idx / kCols, d = idx % kCols;
      const float* p = row(i);
      cp_async<4>(buf + i * ld + d, p != nullptr ? p + d : obase, p != nullptr);
    }
  }
  cp_async_commit();
}

// A block's share of either attention kernel: query tile blockIdx.x, numbered from the last (the
// tiles with the most keys start first), of tokens_per_tile tokens × the G query heads of KV head
// blockIdx.y, and key split blockIdx.z of gridDim.z.
struct QueryTile {
  int G, kvh, q0, n_rows;
  int own_lo, own_hi;  // the tile's own keys: its first token's sequence start .. its last token
  int64_t n_prefix_tiles;

  __device__ QueryTile(const AttentionArgs& a, int tokens_per_tile)
      : G(a.H / a.Hkv), kvh(blockIdx.y), q0((gridDim.x - 1 - blockIdx.x) * tokens_per_tile) {
    const int n_tokens = min(tokens_per_tile, a.n_tokens - q0);
    n_rows = n_tokens * G;
    own_lo = seq_start(a.offsets, a.n_seqs, q0);
    own_hi = q0 + n_tokens - 1;
    n_prefix_tiles = (a.prefix_len + kKeys - 1) / kKeys;
  }
  // This split's key tiles [split_begin, split_end) of the tile's n_tiles.
  __device__ int64_t split_begin(int64_t n_tiles) const { return n_tiles * blockIdx.z / gridDim.z; }
  __device__ int64_t split_end(int64_t n_tiles) const { return n_tiles * (blockIdx.z + 1) / gridDim.z; }
  // Row r's visible own keys [row_lo[r], row_hi[r]] (its sequence start .. its token; lo > hi: no
  // row), written by threads r < kRows.
  __device__ void store_row_ranges(const AttentionArgs& a, int* row_lo, int* row_hi) const {
    const int r = threadIdx.x;
    if (r >= kRows) return;
    int lo = 1, hi = 0;
    if (r < n_rows) {
      const int t = q0 + r / G;
      lo = seq_start(a.offsets, a.n_seqs, t);
      hi = t;
    }
    row_lo[r] = lo;
    row_hi[r] = hi;
  }
};

// Resident blocks per SM the kernel is compiled for. At hd 256 the 64 output accumulators per thread
// spill under the 128-register cap of two blocks; one block with up to 255 registers measured faster
// on the H200 (docs/backends.md).
constexpr int blocks_per_sm(int hd) { return hd > 128 ? 1 : 2; }

template <int HD>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(HD))
    attention_kernel(AttentionArgs a, int tokens_per_tile, bool vec, float* part_o, float2* part_ml) {
  using Lay = AttnLayout<HD>;
  constexpr int LDQ = Lay::kLdQ, LDK = Lay::kLdK, LDV = Lay::kLdV, LDP = Lay::kLdP;
  constexpr int NC = HD / kCols;   // column chunks of K and of V per key tile
  constexpr int NT = kCols / 16;   // m16n8 output tiles per warp per V chunk (half of its columns)
  // The score loop's k-steps in flight: all 8 at hd 256 (registers to spare); 4 below, where the
  // 128-register cap of two blocks per SM would spill more.
  constexpr int kUnrollS = HD > 128 ? 8 : 4;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* base = reinterpret_cast<float*>(smem_raw);
  float* Qs = base + Lay::kQ;
  float* KVs = base + Lay::kKV;
  float* Ps = base + Lay::kP;
  float* alpha_s = base + Lay::kAlpha;
  float* l_s = base + Lay::kL;
  int* row_lo = reinterpret_cast<int*>(base + Lay::kFloats);  // first visible own key (sequence start)
  int* row_hi = row_lo + kRows;                               // last visible own key (the token); lo > hi: no row

  const int tid = threadIdx.x;
  const QueryTile qt(a, tokens_per_tile);
  const int G = qt.G, kvh = qt.kvh, q0 = qt.q0, n_rows = qt.n_rows, own_lo = qt.own_lo, own_hi = qt.own_hi;
  const int64_t Ls = a.prefix_len, n_prefix_tiles = qt.n_prefix_tiles;
  const int64_t n_tiles = n_prefix_tiles + (own_hi - own_lo + kKeys) / kKeys;
  const int64_t kt_begin = qt.split_begin(n_tiles), kt_end = qt.split_end(n_tiles);
  // The first chunk's copy overlaps the Q load.
  if (kt_begin < kt_end) stage_chunk<HD>(a, kvh, key_tile(kt_begin, n_prefix_tiles, Ls, own_lo, own_hi), 0, KVs, vec);
  qt.store_row_ranges(a, row_lo, row_hi);
  load_rows<HD>(Qs, LDQ, kRows, vec, [&](int i) -> const float* {
    if (i >= n_rows) return nullptr;
    const int64_t t = q0 + i / G, h = kvh * G + i % G;
    return a.q + t * a.q_token_stride + h * a.q_head_stride;
  });

  // Tensor-core mapping: warp w owns rows rb..rb+15; for S the keys kb..kb+15, for O the columns
  // cb..cb+kCols/2−1 of each V chunk. Lane (g, t) holds rows rb+g and rb+g+8.
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int rb = kWarpRows * (warp & 3), kb = 16 * (warp >> 2), cb = (kCols / 2) * (warp >> 2);
  // Softmax mapping: rows sr, sr + 1; keys skey + 8m. The 8 lanes of a row pair are adjacent.
  const int sr = 2 * (tid >> 3), skey = tid & 7;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float o[NC][NT][4] = {};

  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const KeyTile tile = key_tile(kt, n_prefix_tiles, Ls, own_lo, own_hi);
    float sacc[2][4] = {};
    // The warp's P fragments (its 16 rows × the tile's 32 keys), split at the first V chunk and kept
    // for the others.
    uint32_t p_hi[kKeys / 8][4], p_lo[kKeys / 8][4];
    // Chunk c sits in buffer c % 2 (2·NC chunks per tile, an even count, so the parity continues
    // into the next tile).
#pragma unroll
    for (int c = 0; c < 2 * NC; ++c) {
      cp_async_wait_all();
      // Chunk c is visible to every thread; chunk c−1's buffer is consumed (at c = 0 so are the
      // previous tile's P and rescale factors; at c = NC this tile's are written).
      __syncthreads();
      if (c + 1 < 2 * NC) {
        stage_chunk<HD>(a, kvh, tile, c + 1, KVs + ((c + 1) % 2) * Lay::kChunk, vec);
      } else if (kt + 1 < kt_end) {
        stage_chunk<HD>(a, kvh, key_tile(kt + 1, n_prefix_tiles, Ls, own_lo, own_hi), 0, KVs, vec);
      }
      const float* buf = KVs + (c % 2) * Lay::kChunk;
      if (c < NC) {
        // ---- S += Q·Kᵀ over this chunk's kCols dimensions, summed from zero by the tensor cores ----
        float big[2][4] = {}, lo_hi[2][4] = {}, hi_lo[2][4] = {};
        const float* qa = Qs + rb * LDQ + c * kCols;
#pragma unroll kUnrollS
        for (int k0 = 0; k0 < kCols; k0 += 8) {
          uint32_t a_hi[4], a_lo[4];
          load_a(qa + k0, LDQ, g, t4, a_hi, a_lo);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            uint32_t b_hi[2], b_lo[2];
            load_b(buf + (kb + 8 * j + g) * LDK + k0 + t4, 4, b_hi, b_lo);
            mma_3xtf32(big[j], lo_hi[j], hi_lo[j], a_hi, a_lo, b_hi, b_lo);
          }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[j][e] += big[j][e] + (lo_hi[j][e] + hi_lo[j][e]);
        }
        if (c == NC - 1) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            float* ps = Ps + (rb + g) * LDP + kb + 8 * j + 2 * t4;
            store2(ps, sacc[j][0] * a.scale, sacc[j][1] * a.scale, true);
            store2(ps + 8 * LDP, sacc[j][2] * a.scale, sacc[j][3] * a.scale, true);
          }
          __syncthreads();  // the scores are complete
          // ---- masking and the online-softmax update ----
#pragma unroll
          for (int ii = 0; ii < 2; ++ii) {
            // Read from shared memory per tile rather than held in registers across the loop (spills).
            const int lo = row_lo[sr + ii], hi = row_hi[sr + ii];
            float* prow = Ps + (sr + ii) * LDP;
            float sc[4], mx = -INFINITY;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const int64_t s = tile.s0 + skey + 8 * m;
              const bool visible = lo <= hi && s < tile.s_end && (tile.prefix || (s >= lo && s <= hi));
              sc[m] = visible ? prow[skey + 8 * m] : -INFINITY;
              mx = fmaxf(mx, sc[m]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            const float m_new = fmaxf(m_run[ii], mx);
            // A row with no visible key so far keeps m = −inf: its p and rescale must not become NaN.
            const bool none = m_new == -INFINITY;
            const float alpha = none ? 1.0f : expf(m_run[ii] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const float p = none ? 0.0f : expf(sc[m] - m_new);
              prow[skey + 8 * m] = p;
              sum += p;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            l_run[ii] = l_run[ii] * alpha + sum;
            m_run[ii] = m_new;
            if (skey == 0) alpha_s[sr + ii] = alpha;
          }
          // P and alpha are read after the next chunk's barrier.
        }
      } else {
        // ---- O[:, this chunk's columns] = diag(alpha) O + P V ----
        const int cv = c - NC;  // a constant: the chunk loop is unrolled
        const float al0 = alpha_s[rb + g], al1 = alpha_s[rb + g + 8];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          o[cv][j][0] *= al0;
          o[cv][j][1] *= al0;
          o[cv][j][2] *= al1;
          o[cv][j][3] *= al1;
        }
        // The cross terms sum the tile's 32 keys from zero, the main products 8 keys at a time.
        float lo_hi[NT][4] = {}, hi_lo[NT][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < kKeys; k0 += 8) {
          if (cv == 0) load_a(Ps + rb * LDP + k0, LDP, g, t4, p_hi[k0 / 8], p_lo[k0 / 8]);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            uint32_t b_hi[2], b_lo[2];
            load_b(buf + (k0 + t4) * LDV + cb + 8 * j + g, 4 * LDV, b_hi, b_lo);
            float big[4] = {};
            mma_3xtf32(big, lo_hi[j], hi_lo[j], p_hi[k0 / 8], p_lo[k0 / 8], b_hi, b_lo);
#pragma unroll
            for (int e = 0; e < 4; ++e) o[cv][j][e] += big[e];
          }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[cv][j][e] += lo_hi[j][e] + hi_lo[j][e];
        }
      }
    }
  }

  // Lane (g, t) holds, per V chunk c and tile j, columns c·kCols + cb + 8j + 2t (+1) of rows rb + g
  // (o[..][0..1]) and rb + g + 8 (o[..][2..3]).
  if (part_o != nullptr) {
    // A partial result: unnormalised rows and their (max, sum), merged by the combine kernel.
    const int64_t split_base = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.H;
    if (skey == 0) {
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int row = sr + ii;
        if (row >= n_rows) continue;
        const int64_t t = q0 + row / G, h = kvh * G + row % G;
        part_ml[split_base + t * a.H + h] = make_float2(m_run[ii], l_run[ii]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = rb + g + 8 * half;
      if (row >= n_rows) continue;
      const int64_t t = q0 + row / G, h = kvh * G + row % G;
      float* dst = part_o + (split_base + t * a.H + h) * HD + cb + 2 * t4;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
#pragma unroll
        for (int j = 0; j < NT; ++j) store2(dst + c * kCols + 8 * j, o[c][j][2 * half], o[c][j][2 * half + 1], true);
      }
    }
    return;
  }
  if (skey == 0) {
    l_s[sr] = l_run[0];
    l_s[sr + 1] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = rb + g + 8 * half;
    if (row >= n_rows) continue;
    const float inv = 1.0f / l_s[row];  // > 0: a valid row always sees its own token
    const int64_t t = q0 + row / G, h = kvh * G + row % G;
    float* dst = a.out + t * a.out_token_stride + h * a.out_head_stride + cb + 2 * t4;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        store2(dst + c * kCols + 8 * j, o[c][j][2 * half] * inv, o[c][j][2 * half + 1] * inv, vec);
      }
    }
  }
}

// One block per (token, head): merges the splits' partial rows (see the header comment).
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_kernel(AttentionArgs a, const float* part_o, const float2* part_ml, int n_splits) {
  const int64_t pair = blockIdx.x, t = pair / a.H, h = pair % a.H;
  const int64_t split_stride = static_cast<int64_t>(a.n_tokens) * a.H;
  float m = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) m = fmaxf(m, part_ml[sp * split_stride + pair].x);
  // m is finite: the split holding a row's own token saw at least that key.
  float w[kMaxSplits], l = 0.0f;
#pragma unroll
  for (int sp = 0; sp < kMaxSplits; ++sp) {
    w[sp] = 0.0f;
    if (sp < n_splits) {
      const float2 ml = part_ml[sp * split_stride + pair];
      w[sp] = ml.x == -INFINITY ? 0.0f : expf(ml.x - m);
      l += w[sp] * ml.y;
    }
  }
  const float inv = 1.0f / l;
  float* dst = a.out + t * a.out_token_stride + h * a.out_head_stride;
  for (int j = threadIdx.x; j < a.hd; j += kCombineThreads) {
    float acc = 0.0f;
#pragma unroll
    for (int sp = 0; sp < kMaxSplits; ++sp) {
      if (sp < n_splits) acc = fmaf(w[sp], part_o[(sp * split_stride + pair) * a.hd + j], acc);
    }
    dst[j] = acc * inv;
  }
}

// ---- FP16 products (header: "FP16 products") ----

constexpr int kThreadsF16 = 128;    // 4 warps, one m16 row group each
constexpr int kConvertThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kThreadsF16 / 32 * kWarpRows == kRows, "the FP16 kernel's warps cover the query tile");

// Resident blocks per SM the FP16 kernel is compiled for: each thread holds hd/2 output accumulators;
// at hd 128 four blocks (128 registers) would spill, and at hd 256 shared memory (97 KiB) allows two.
constexpr int f16_blocks_per_sm(int hd) { return hd > 64 ? 2 : 4; }

template <int HD>
struct F16Layout {
  // In halves: Q [kRows][HD], then two K tiles and two V tiles [kKeys][HD]; then s_q and the row ranges.
  static constexpr int kTile = kKeys * HD;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kRows * HD;
  static constexpr int kV = kK + 2 * kTile;
  static constexpr int kHalves = kV + 2 * kTile;
  static constexpr size_t kBytes = kHalves * sizeof(__half) + kRows * sizeof(float) + 2 * kRows * sizeof(int);
  static_assert(kHalves % 8 == 0, "16-byte aligned row data");
  static_assert(kBytes <= 99 * 1024, "shared memory exceeds the smallest supported per-block limit");
};

// Offset in halves of 16-byte chunk c (halves 8c..8c+7) of row r of an FP16 [rows][HD] tile; the chunks
// are XOR-swizzled by r % 8 (HD >= 64: a row has at least 8 chunks).
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HD + ((c ^ (r & 7)) << 3);
}

// The FP16 copies in the workspace: K and V [L, Hkv, hd] with L = tiles·kKeys, (s_k, s_v) per (tile,
// KV head), then the splits' partial rows (none where the splits merge in a cluster).
struct F16Copies {
  int64_t tiles = 0;
  size_t kv_halves = 0;  // of K, and of V
  size_t bytes = 0;      // K, V and scales, a multiple of 16
};

F16Copies f16_copies(const AttentionArgs& a) {
  F16Copies c;
  c.tiles = (a.prefix_len + a.n_tokens + kKeys - 1) / kKeys;
  c.kv_halves = static_cast<size_t>(c.tiles) * kKeys * static_cast<size_t>(a.Hkv) * static_cast<size_t>(a.hd);
  const size_t scale_bytes = static_cast<size_t>(c.tiles) * static_cast<size_t>(a.Hkv) * sizeof(float2);
  c.bytes = 2 * c.kv_halves * sizeof(__half) + (scale_bytes + 15) / 16 * 16;
  return c;
}

// One block per (key tile, KV head): the tile's keys of the unified list (prefix keys, then the pass's)
// as FP16 K and V, each under its own power-of-two scale (f16_rows.cuh's rule over the tile's 32 × HD
// values), zeros past the last key; scales[tile·Hkv + kvh] = (s_k, s_v), the factors that undo them.
template <int HD>
__global__ void __launch_bounds__(kConvertThreads)
    attention_keys_f16_kernel(AttentionArgs a, bool vec, __half* kh, __half* vh, float2* scales) {
  constexpr int kPer = kKeys * HD / 4 / kConvertThreads;  // float4s per thread, of K and of V
  __shared__ float part_k[kConvertThreads / 32], part_v[kConvertThreads / 32];
  const int kvh = blockIdx.y;
  const int64_t u0 = static_cast<int64_t>(blockIdx.x) * kKeys, n_keys = a.prefix_len + a.n_tokens;
  float4 kx[kPer], vx[kPer];
  float mk = 0.0f, mv = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int f = threadIdx.x + i * kConvertThreads, key = f / (HD / 4), col = 4 * (f % (HD / 4));
    const int64_t u = u0 + key;
    kx[i] = vx[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (u < n_keys) {
      const bool prefix = u < a.prefix_len;
      const int64_t off = prefix ? (u * a.Hkv + kvh) * HD + col
                                 : (u - a.prefix_len) * a.kv_token_stride + kvh * a.kv_head_stride + col;
      kx[i] = load4((prefix ? a.prefix_k : a.k) + off, vec);
      vx[i] = load4((prefix ? a.prefix_v : a.v) + off, vec);
    }
    mk = fmaxf(mk, abs_max(kx[i]));
    mv = fmaxf(mv, abs_max(vx[i]));
  }
  const float inv_k = f16_row_inverse_scale(block_max(mk, part_k));
  const float inv_v = f16_row_inverse_scale(block_max(mv, part_v));
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int f = threadIdx.x + i * kConvertThreads, key = f / (HD / 4), col = 4 * (f % (HD / 4));
    const int64_t off = ((u0 + key) * a.Hkv + kvh) * HD + col;
    store_f16(kh + off, kx[i], inv_k);
    store_f16(vh + off, vx[i], inv_v);
  }
  if (threadIdx.x == 0) scales[static_cast<int64_t>(blockIdx.x) * a.Hkv + kvh] = make_float2(1.0f / inv_k, 1.0f / inv_v);
}

template <int HD>
__global__ void __launch_bounds__(kThreadsF16, f16_blocks_per_sm(HD))
    attention_f16_kernel(AttentionArgs a, const __half* kh, const __half* vh, const float2* scales,
                         int tokens_per_tile, bool vec, float* part_o, float2* part_ml, bool cluster) {
  using Lay = F16Layout<HD>;
  static_assert(ClusterPart<HD>::kBytes <= Lay::kHalves * sizeof(__half), "a split's rows fit its shared memory");
  constexpr int NK = HD / 16;            // k-steps of the scores
  constexpr int NO = HD / 8;             // m16n8 output tiles per warp
  constexpr int NS = kKeys / 8;          // m16n8 score tiles per warp
  constexpr int kChunks = kKeys * HD / 8;  // 16-byte chunks of one K or V tile
  constexpr int kQv = (HD / 4 + 31) / 32;  // float4s per lane of a q row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* Qs = reinterpret_cast<__half*>(smem_raw) + Lay::kQ;
  __half* Ks = reinterpret_cast<__half*>(smem_raw) + Lay::kK;
  __half* Vs = reinterpret_cast<__half*>(smem_raw) + Lay::kV;
  float* q_scale = reinterpret_cast<float*>(reinterpret_cast<__half*>(smem_raw) + Lay::kHalves);
  int* row_lo = reinterpret_cast<int*>(q_scale + kRows);  // first visible own key (sequence start)
  int* row_hi = row_lo + kRows;                           // last visible own key (the token); lo > hi: no row

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const QueryTile qt(a, tokens_per_tile);
  const int G = qt.G, kvh = qt.kvh, q0 = qt.q0, n_rows = qt.n_rows, own_lo = qt.own_lo, own_hi = qt.own_hi;
  const int64_t Ls = a.prefix_len, n_prefix_tiles = qt.n_prefix_tiles;

  // Key tiles: all prefix tiles, then the tiles of the unified list holding keys prefix_len + own_lo ..
  // prefix_len + own_hi (from the last prefix tile on, which the first may overlap).
  const int64_t own_first = max(n_prefix_tiles, (Ls + own_lo) / kKeys), own_last = (Ls + own_hi) / kKeys;
  const int64_t n_tiles = n_prefix_tiles + (own_last - own_first + 1);
  const int64_t kt_begin = qt.split_begin(n_tiles), kt_end = qt.split_end(n_tiles);
  auto tile_of = [&](int64_t kt) { return kt < n_prefix_tiles ? kt : own_first + (kt - n_prefix_tiles); };
  // Copies key tile tb's K and V into buffer buf (one cp.async group); its scales come with a plain load.
  auto stage = [&](int64_t tb, int buf) {
#pragma unroll
    for (int idx = tid; idx < kChunks; idx += kThreadsF16) {
      const int i = idx / (HD / 8), c = idx % (HD / 8);
      const int64_t src = ((tb * kKeys + i) * a.Hkv + kvh) * HD + 8 * c;
      cp_async<16>(Ks + buf * Lay::kTile + swz<HD>(i, c), kh + src, true);
      cp_async<16>(Vs + buf * Lay::kTile + swz<HD>(i, c), vh + src, true);
    }
    cp_async_commit();
    return scales[tb * a.Hkv + kvh];
  };
  float2 sc_next = make_float2(1.0f, 1.0f);
  if (kt_begin < kt_end) sc_next = stage(tile_of(kt_begin), 0);  // overlaps the Q load
  qt.store_row_ranges(a, row_lo, row_hi);
  const int rb = kWarpRows * warp;
  // The warp's q rows as FP16 under a power-of-two scale per row (f16_rows.cuh's rule), eight rows'
  // loads in flight at a time.
#pragma unroll 8
  for (int rr = 0; rr < kWarpRows; ++rr) {
    const int r = rb + rr;
    const float* src = nullptr;
    if (r < n_rows) {
      const int64_t t = q0 + r / G, h = kvh * G + r % G;
      src = a.q + t * a.q_token_stride + h * a.q_head_stride;
    }
    float4 x[kQv];
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < kQv; ++j) {
      const int f = lane + 32 * j;
      x[j] = src != nullptr && f < HD / 4 ? load4(src + 4 * f, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      mx = fmaxf(mx, abs_max(x[j]));
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float inv = f16_row_inverse_scale(mx);
#pragma unroll
    for (int j = 0; j < kQv; ++j) {
      const int f = lane + 32 * j;  // float4 f: halves 4f..4f+3, the low or high half of chunk f / 2
      if (f < HD / 4) store_f16(Qs + swz<HD>(r, f >> 1) + 4 * (f & 1), x[j], inv);
    }
    if (lane == 0) q_scale[r] = 1.0f / inv;
  }
  __syncthreads();

  // Lane (g, t4) holds rows rb + g (accumulator elements 0, 1) and rb + g + 8 (elements 2, 3).
  const int lo0 = row_lo[rb + g], hi0 = row_hi[rb + g], lo1 = row_lo[rb + g + 8], hi1 = row_hi[rb + g + 8];
  // Score factors: scale · s_q · log2(e), so that exp2 of a score difference is e^(difference).
  const float fq0 = a.scale * kLog2e * q_scale[rb + g], fq1 = a.scale * kLog2e * q_scale[rb + g + 8];
  const int mat = lane >> 3, mrow = lane & 7;  // ldmatrix: this lane's matrix and row
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // m in log2 units; l per lane
  float o[NO][4] = {};
  float sv = 1.0f;  // O is held in units of this V scale

  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait_all();
    // Tile kt is visible to every thread, and the other buffer (tile kt−1's) is consumed.
    __syncthreads();
    const int64_t tb = tile_of(kt);
    const float2 sc = sc_next;
    const int buf = static_cast<int>((kt - kt_begin) & 1);
    if (kt + 1 < kt_end) sc_next = stage(tile_of(kt + 1), buf ^ 1);
    const __half* Kt = Ks + buf * Lay::kTile;
    const __half* Vt = Vs + buf * Lay::kTile;

    // ---- S = Q·Kᵀ: 16 rows × 32 keys per warp ----
    float sacc[2][NS][4] = {};
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      uint32_t qa[4];
      ldmatrix_x4(qa, Qs + swz<HD>(rb + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        // Matrices: keys 16np.. (dims low, high), keys 16np + 8.. (dims low, high).
        uint32_t kb[4];
        ldmatrix_x4(kb, Kt + swz<HD>(16 * np + mrow + 8 * (mat >> 1), 2 * kk + (mat & 1)));
        mma_f16(sacc[kk & 1][2 * np], qa, kb[0], kb[1]);
        mma_f16(sacc[kk & 1][2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    // ---- masking and the online softmax (log2 units) ----
    const float f0 = fq0 * sc.x, f1 = fq1 * sc.x;
    const int64_t d0 = tb * kKeys - Ls;  // the tile's first key relative to the pass's first key
    float sc2[NS][4], mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool second = e >= 2;
        const int lo = second ? lo1 : lo0, hi = second ? hi1 : hi0;
        const int64_t d = d0 + 8 * j + 2 * t4 + (e & 1);
        const bool visible = lo <= hi && (d < 0 || (d >= lo && d <= hi));
        sc2[j][e] = visible ? (sacc[0][j][e] + sacc[1][j][e]) * (second ? f1 : f0) : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(sc2[j][0], sc2[j][1]));
      mx1 = fmaxf(mx1, fmaxf(sc2[j][2], sc2[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m_run[0], mx0), mn1 = fmaxf(m_run[1], mx1);
    // A row with no visible key so far keeps m = −inf: its p and rescale must not become NaN.
    const bool none0 = mn0 == -INFINITY, none1 = mn1 == -INFINITY;
    const float al0 = none0 ? 1.0f : exp2f(m_run[0] - mn0), al1 = none1 ? 1.0f : exp2f(m_run[1] - mn1);
    // P's A fragments for the tile's two k-steps of 16 keys: score tiles 2kk and 2kk + 1.
    uint32_t pa[kKeys / 16][4];
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const uint32_t r0 = none0 ? 0u : pack_f16x2(exp2f(sc2[j][0] - mn0), exp2f(sc2[j][1] - mn0));
      const uint32_t r1 = none1 ? 0u : pack_f16x2(exp2f(sc2[j][2] - mn1), exp2f(sc2[j][3] - mn1));
      pa[j >> 1][2 * (j & 1)] = r0;
      pa[j >> 1][2 * (j & 1) + 1] = r1;
      sum0 += sum_f16x2(r0);
      sum1 += sum_f16x2(r1);
    }
    l_run[0] = l_run[0] * al0 + sum0;
    l_run[1] = l_run[1] * al1 + sum1;
    m_run[0] = mn0;
    m_run[1] = mn1;

    // ---- O = diag(α) O + P·V, O in units of this tile's s_v ----
    const float ratio = sv / sc.y, r0 = al0 * ratio, r1 = al1 * ratio;
    sv = sc.y;
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      o[j][0] *= r0;
      o[j][1] *= r0;
      o[j][2] *= r1;
      o[j][3] *= r1;
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < NO / 2; ++np) {
        // Matrices (transposed): keys 16kk.., 16kk + 8.. of dims 16np.., then of dims 16np + 8...
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vt + swz<HD>(16 * kk + mrow + 8 * (mat & 1), 2 * np + (mat >> 1)));
        mma_f16(o[2 * np], pa[kk], vb[0], vb[1]);
        mma_f16(o[2 * np + 1], pa[kk], vb[2], vb[3]);
      }
    }
  }

  float l[2] = {l_run[0], l_run[1]};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
  // Lane (g, t4) holds columns 8j + 2t4 (+1) of rows rb + g (o[j][0..1]) and rb + g + 8 (o[j][2..3]).
  if (cluster) {
    // A split of a cluster: its partial rows (O in units of 1, m in natural units) into its own shared
    // memory, merged there.
    __syncthreads();  // every warp is done with Q and the K/V tiles, which the rows overwrite
    using Part = ClusterPart<HD>;
    float* part = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = rb + g + 8 * half;
      if (t4 == 0) store2(part + Part::kML + 2 * row, m_run[half] * kLn2, l[half], true);
      float* prow = part + row * Part::kLd + 2 * t4;
#pragma unroll
      for (int j = 0; j < NO; ++j) store2(prow + 8 * j, o[j][2 * half] * sv, o[j][2 * half + 1] * sv, true);
    }
    merge_cluster_splits<HD>(a, part, q0, kvh, n_rows, vec);
    return;
  }
  if (part_o != nullptr) {
    // A partial result: unnormalised rows and their (max, sum), m in natural units as the combine
    // kernel expects.
    const int64_t split_base = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.H;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = rb + g + 8 * half;
      if (row >= n_rows) continue;
      const int64_t t = q0 + row / G, h = kvh * G + row % G;
      if (t4 == 0) part_ml[split_base + t * a.H + h] = make_float2(m_run[half] * kLn2, l[half]);
      float* dst = part_o + (split_base + t * a.H + h) * HD + 2 * t4;
#pragma unroll
      for (int j = 0; j < NO; ++j) store2(dst + 8 * j, o[j][2 * half] * sv, o[j][2 * half + 1] * sv, true);
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = rb + g + 8 * half;
    if (row >= n_rows) continue;
    const float f = sv / l[half];  // l > 0: a valid row always sees its own token
    const int64_t t = q0 + row / G, h = kvh * G + row % G;
    float* dst = a.out + t * a.out_token_stride + h * a.out_head_stride + 2 * t4;
#pragma unroll
    for (int j = 0; j < NO; ++j) store2(dst + 8 * j, o[j][2 * half] * f, o[j][2 * half + 1] * f, vec);
  }
}

int query_tiles(const AttentionArgs& a) {
  const int tokens_per_tile = kRows / (a.H / a.Hkv);
  return (a.n_tokens + tokens_per_tile - 1) / tokens_per_tile;
}

// The FP16 kernel for a.hd, its block size and shared memory, opted into that memory once per process
// (the first call comes before any graph capture that launches it).
struct KernelShape {
  const void* fn;
  int threads;
  size_t bytes;
  cudaError_t opt_in;
};

template <int HD>
KernelShape f16_kernel() {
  constexpr size_t bytes = F16Layout<HD>::kBytes;
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      attention_f16_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return {reinterpret_cast<const void*>(attention_f16_kernel<HD>), kThreadsF16, bytes, opt_in};
}

KernelShape f16_kernel_shape(int hd) {
  switch (hd) {
    case 64:
      return f16_kernel<64>();
    case 128:
      return f16_kernel<128>();
    default:
      return f16_kernel<256>();
  }
}

// Clusters of `splits` blocks of a's kernel resident on the current device at once, or 0 when its
// splits do not merge in a cluster (header: "Cluster merge"): the 3xTF32 products, a device that
// launches no clusters, kernel code built for an architecture before sm_90 (an sm_80 build running
// there has no cluster merge compiled in), or splits outside 2..kMaxClusterSplits. Asked of the
// driver once per (device, hd, splits): the op is recorded on every pass.
int resident_clusters(const AttentionArgs& a, int splits) {
  if (!a.f16 || splits < 2 || splits > kMaxClusterSplits) return 0;
  const KernelShape k = f16_kernel_shape(a.hd);
  int device = 0;
  if (k.opt_in != cudaSuccess || cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, k.fn, splits);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int launches = 0, n = 0;
  cudaFuncAttributes attr = {};
  cudaLaunchAttribute cluster[1] = {};
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = 1;
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = splits;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, 1, splits);
  cfg.blockDim = dim3(k.threads);
  cfg.dynamicSmemBytes = k.bytes;
  cfg.attrs = cluster;
  cfg.numAttrs = 1;
  if (cudaDeviceGetAttribute(&launches, cudaDevAttrClusterLaunch, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, k.fn) != cudaSuccess || launches == 0 || attr.binaryVersion < 90 ||
      cudaOccupancyMaxActiveClusters(&n, k.fn, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  known.emplace(key, n);
  return n;
}

bool cluster_merge(const AttentionArgs& a) { return resident_clusters(a, a.splits) > 0; }

// Launches `kernel` on grid (tiles, Hkv, S) with each query tile's S key splits as one cluster.
template <typename... Params, typename... Args>
cudaError_t launch_clustered(void (*kernel)(Params...), dim3 grid, int threads, size_t bytes, cudaStream_t stream,
                             Args... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = grid.z;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

// Key splits per query tile. None when the query tiles alone give two blocks per SM. Otherwise the S
// that minimises the pass's time in units of a key tile: waves of resident blocks × (the longest
// query tile's key tiles per split + 1, the split's Q load), among S = 1..16 (1..8 where the splits
// merge in a cluster) with at least two key tiles a split (each split reloads its Q tile); the
// largest such S on ties (shorter blocks).
int attention_split_count(const AttentionArgs& a) {
  if (!attention_supported(a.H, a.Hkv, a.hd)) return 1;
  if (a.n_tokens <= 0) return 1;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  const int64_t base = static_cast<int64_t>(query_tiles(a)) * a.Hkv;
  if (base >= 2 * static_cast<int64_t>(sms)) return 1;
  const int64_t resident = static_cast<int64_t>(sms) * (a.f16 ? f16_blocks_per_sm(a.hd) : blocks_per_sm(a.hd));
  // The most key tiles any block can visit: all prefix tiles and, within the pass, up to n_tokens keys.
  const int64_t max_tiles = (a.prefix_len + kKeys - 1) / kKeys + (a.n_tokens + kKeys - 1) / kKeys + 1;
  const bool clusters = resident_clusters(a, 2) > 0;
  const int64_t cap = clusters ? kMaxClusterSplits : kMaxSplits;
  const int64_t most = max_tiles / 2 < cap ? max_tiles / 2 : cap;
  int64_t best = 1, best_cost = ((base + resident - 1) / resident) * (max_tiles + 1);
  for (int64_t s = 2; s <= most; ++s) {
    // With clusters (one per query tile and KV head), a wave is the clusters resident at once.
    const int64_t in_wave = clusters ? resident_clusters(a, static_cast<int>(s)) : resident;
    const int64_t units = clusters ? base : base * s;
    if (in_wave == 0) continue;
    const int64_t cost = ((units + in_wave - 1) / in_wave) * ((max_tiles + s - 1) / s + 1);
    if (cost <= best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

namespace {

template <int HD>
cudaError_t launch_hd(const AttentionArgs& a, void* workspace, cudaStream_t stream) {
  constexpr size_t bytes = AttnLayout<HD>::kBytes;
  // Opted in once per process; the first launch happens before any graph capture that replays it.
  static const cudaError_t attr =
      cudaFuncSetAttribute(attention_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  const int G = a.H / a.Hkv, tokens_per_tile = kRows / G;
  const bool vec = aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) &&
                   (a.prefix_len == 0 || (aligned16(a.prefix_k) && aligned16(a.prefix_v))) &&
                   a.q_token_stride % 4 == 0 && a.q_head_stride % 4 == 0 && a.kv_token_stride % 4 == 0 &&
                   a.kv_head_stride % 4 == 0 && a.out_token_stride % 4 == 0 && a.out_head_stride % 4 == 0;
  const int splits = a.splits;
  const dim3 grid(query_tiles(a), a.Hkv, splits);
  if (splits == 1) {
    attention_kernel<HD><<<grid, kThreads, bytes, stream>>>(a, tokens_per_tile, vec, nullptr, nullptr);
    return cudaGetLastError();
  }
  if (workspace == nullptr) return cudaErrorInvalidValue;
  float* part_o = static_cast<float*>(workspace);
  float2* part_ml = reinterpret_cast<float2*>(part_o + static_cast<int64_t>(splits) * a.n_tokens * a.H * HD);
  attention_kernel<HD><<<grid, kThreads, bytes, stream>>>(a, tokens_per_tile, vec, part_o, part_ml);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const unsigned pairs = static_cast<unsigned>(static_cast<int64_t>(a.n_tokens) * a.H);
  attention_combine_kernel<<<pairs, kCombineThreads, 0, stream>>>(a, part_o, part_ml, splits);
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_f16_hd(const AttentionArgs& a, void* workspace, cudaStream_t stream) {
  const KernelShape k = f16_kernel<HD>();
  if (k.opt_in != cudaSuccess) return k.opt_in;
  const size_t bytes = k.bytes;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const F16Copies copies = f16_copies(a);
  __half* kh = static_cast<__half*>(workspace);
  __half* vh = kh + copies.kv_halves;
  float2* scales = reinterpret_cast<float2*>(vh + copies.kv_halves);
  const bool kv_vec = aligned16(a.k) && aligned16(a.v) &&
                      (a.prefix_len == 0 || (aligned16(a.prefix_k) && aligned16(a.prefix_v))) &&
                      a.kv_token_stride % 4 == 0 && a.kv_head_stride % 4 == 0;
  attention_keys_f16_kernel<HD><<<dim3(static_cast<unsigned>(copies.tiles), a.Hkv), kConvertThreads, 0, stream>>>(
      a, kv_vec, kh, vh, scales);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int G = a.H / a.Hkv, tokens_per_tile = kRows / G;
  const bool vec = aligned16(a.q) && aligned16(a.out) && a.q_token_stride % 4 == 0 && a.q_head_stride % 4 == 0 &&
                   a.out_token_stride % 4 == 0 && a.out_head_stride % 4 == 0;
  const int splits = a.splits;
  const dim3 grid(query_tiles(a), a.Hkv, splits);
  float* part_o = nullptr;
  float2* part_ml = nullptr;
  if (splits > 1 && cluster_merge(a)) {
    return launch_clustered(attention_f16_kernel<HD>, grid, kThreadsF16, bytes, stream, a,
                            static_cast<const __half*>(kh), static_cast<const __half*>(vh),
                            static_cast<const float2*>(scales), tokens_per_tile, vec, part_o, part_ml, true);
  }
  if (splits > 1) {
    part_o = reinterpret_cast<float*>(static_cast<char*>(workspace) + copies.bytes);
    part_ml = reinterpret_cast<float2*>(part_o + static_cast<int64_t>(splits) * a.n_tokens * a.H * HD);
  }
  attention_f16_kernel<HD><<<grid, kThreadsF16, bytes, stream>>>(a, kh, vh, scales, tokens_per_tile, vec, part_o,
                                                                  part_ml, false);
  err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  const unsigned pairs = static_cast<unsigned>(static_cast<int64_t>(a.n_tokens) * a.H);
  attention_combine_kernel<<<pairs, kCombineThreads, 0, stream>>>(a, part_o, part_ml, splits);
  return cudaGetLastError();
}

}  // namespace

bool attention_supported(int H, int Hkv, int hd) {
  return Hkv >= 1 && Hkv <= kMaxGridY && H >= Hkv && H % Hkv == 0 && H / Hkv <= kRows &&
         (hd == 64 || hd == 128 || hd == 256);
}

size_t attention_workspace_bytes(const AttentionArgs& a) {
  if (!attention_supported(a.H, a.Hkv, a.hd) || a.n_tokens <= 0) return 0;
  const size_t partials = a.splits <= 1 || cluster_merge(a) ? 0
                                        : static_cast<size_t>(a.splits) * static_cast<size_t>(a.n_tokens) *
                                              static_cast<size_t>(a.H) * static_cast<size_t>(a.hd + 2) * sizeof(float);
  return (a.f16 ? f16_copies(a).bytes : 0) + partials;
}

cudaError_t launch_attention(const AttentionArgs& a, void* workspace, cudaStream_t stream) {
  if (!attention_supported(a.H, a.Hkv, a.hd) || a.n_seqs < 1 || a.prefix_len < 0 || a.splits < 1 ||
      a.splits > kMaxSplits ||
      (a.prefix_len > 0 && (a.prefix_k == nullptr || a.prefix_v == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (a.n_tokens == 0) return cudaSuccess;
  switch (a.hd) {
    case 64:
      return a.f16 ? launch_f16_hd<64>(a, workspace, stream) : launch_hd<64>(a, workspace, stream);
    case 128:
      return a.f16 ? launch_f16_hd<128>(a, workspace, stream) : launch_hd<128>(a, workspace, stream);
    default:
      return a.f16 ? launch_f16_hd<256>(a, workspace, stream) : launch_hd<256>(a, workspace, stream);
  }
}

}  // namespace kev::cuda
