// WebGpuBackend's ops: each validates its operands (the CPU backend's shape rules plus the WebGPU
// kernel limits), binds them, fills the kernel's params struct (mirroring the WGSL `Params` field for
// field; sizes are static_asserted) and records its dispatches. Kernel maths and launch shapes are
// described at the top of each .wgsl file.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/webgpu/backend_impl.h"
#include "common/check.h"

namespace kev::webgpu {

namespace {

constexpr uint64_t kGroup = 256;  // invocations per workgroup of the element-wise kernels
constexpr uint32_t kChunk = 64;   // GDN chunk length (gated_delta_net*.wgsl)
constexpr uint32_t kRecurSlice = 8;  // GDN state columns per recurrence workgroup (gated_delta_net.wgsl)
constexpr uint32_t kOutSlice = 64;   // GDN output columns per workgroup (gated_delta_net_out.wgsl)
constexpr uint32_t kWuSlice = 64;    // GDN [K | V] columns per W/U workgroup (gated_delta_net_wu.wgsl)
constexpr uint32_t kShortSlice = 64;  // GDN state columns per question-rows workgroup (gated_delta_net_short.wgsl)
constexpr int64_t kAttnRows = 64;  // query rows (tokens × heads of a KV group) per attention workgroup
constexpr int64_t kAttnKeys = 64;  // keys per attention key tile (attention.wgsl)
// Key splits (flash-decoding): a pass's key tiles spread over at least about two workgroups per
// multiprocessor of a large GPU (an H200 has 132), at most 16 splits a tile and at least one key tile
// (64 keys) a split. Estimated from occupancy, not measured: tune on the GPU.
constexpr int64_t kAttnTargetGroups = 264;
constexpr int64_t kAttnMaxSplits = 16;
constexpr int64_t kAttnMinSplitTiles = 1;
constexpr uint64_t kMatmulTile = 128;            // output tile edge of matmul.wgsl's `matmul`
constexpr uint64_t kMatmulWideRows = 64;         // rows of a `matmul_wide` / `matmul_wide_split` tile (128 columns)
constexpr uint64_t kMatmulMinLargeTiles = 264;   // `matmul` from this many 128×128 output tiles
constexpr int64_t kMatmulMaxRows = 8;        // rows of `matmul_rows` (one x row per 16 invocations)
constexpr uint64_t kMatmulRowsColumns = 16;  // output columns per `matmul_rows` workgroup
// Split-K (matmul.wgsl): a weight whose output would have fewer than kMatmulMinLargeTiles 128×128
// tiles in a pass of kMatmulSplitRows rows gets its k cut into pieces, enough for about
// kMatmulSplitTiles tiles in such a pass (about four waves of an H200), each piece at least
// kMatmulMinPieceK long. The 0.8B's m = 1,024 projections (k 3,584 and 2,048) get 8 pieces: the best
// or within noise of the best of 1–10 pieces and either tiled kernel at 2,187, 250 and 222 rows on
// the H200 (docs/backends.md).
constexpr uint64_t kMatmulSplitRows = 2048;
constexpr uint64_t kMatmulSplitTiles = 1024;
constexpr uint64_t kMatmulMinPieceK = 256;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }

const KernelSpec kGatherF32{"gather", "gather_f32", 3};
const KernelSpec kGatherBf16{"gather", "gather_bf16", 3};
const KernelSpec kRmsNorm{"norms", "rms_norm", 4};
const KernelSpec kAddRmsNorm{"norms", "add_rms_norm", 4};
const KernelSpec kL2Norm{"norms", "l2_norm", 4};
const KernelSpec kRmsNormGated{"norms", "rms_norm_gated", 4};
const KernelSpec kL2NormShort{"norms", "l2_norm_short", 4};
const KernelSpec kSigmoidMul{"elementwise", "sigmoid_mul", 3};
const KernelSpec kSwiglu{"elementwise", "swiglu", 3};
const KernelSpec kAdd{"elementwise", "add", 3};
const KernelSpec kCopyToF32{"copy", "copy_to_f32", 2};
const KernelSpec kCopyToBf16{"copy", "copy_to_bf16", 2};
const KernelSpec kGdnGates{"gdn_gates", "gdn_gates", 6};
const KernelSpec kMatmul{"matmul", "matmul", 4};
const KernelSpec kMatmulRows{"matmul", "matmul_rows", 4};
const KernelSpec kMatmulWide{"matmul", "matmul_wide", 4};
const KernelSpec kMatmulWideSplit{"matmul", "matmul_wide_split", 4};
const KernelSpec kMatmulReduce{"matmul_reduce", "matmul_reduce", 3};
const KernelSpec kConv{"causal_conv1d", "conv", 6};
const KernelSpec kConvState{"causal_conv1d", "conv_state", 6};
const KernelSpec kRope{"rope", "rope", 3};
const KernelSpec kAttention{"attention", "attention", 8};
const KernelSpec kAttentionCombine{"attention", "attention_combine", 8};
const KernelSpec kPointer{"pointer_head", "pointer_logits", 4};
const KernelSpec kGdnPrep{"gated_delta_net_prep", "prep", 6};
const KernelSpec kGdnWu{"gated_delta_net_wu", "wu", 5};
const KernelSpec kGdnRecur{"gated_delta_net", "recur", 5};
const KernelSpec kGdnOut{"gated_delta_net_out", "output", 4};
const KernelSpec kGdnShort{"gated_delta_net_short", "short_rows", 8};

// Outer dims of a rank 1..4 tensor folded to (s0, s1, s2), front-padded with 1 (stride 0).
struct Outer {
  uint32_t s1 = 1, s2 = 1;
  uint32_t rows = 1;
};

Outer outer_of(const Tensor& t) {
  uint32_t s[3] = {1, 1, 1};
  for (int i = 0; i + 1 < t.rank; ++i) s[3 - (t.rank - 1) + i] = u32(t.shape[i]);
  return Outer{s[1], s[2], s[0] * s[1] * s[2]};
}

void outer_strides(const Tensor& t, uint32_t out[4]) {
  out[0] = out[1] = out[2] = out[3] = 0;
  for (int i = 0; i + 1 < t.rank; ++i) out[3 - (t.rank - 1) + i] = u32(t.stride[i]);
}

// ---- params (mirroring the WGSL structs) --------------------------------------------------------

struct GatherParams {
  uint32_t n, d, src_off, src_stride, ids_off, out_off, out_stride, row_begin, row_count, total_rows, zero_invalid,
      pad0;
};
static_assert(sizeof(GatherParams) == 48);

struct NormParams {
  uint32_t d, n_rows, s1, s2, x_off, z_off, w_off, o_off;
  uint32_t x_st[4], z_st[4], o_st[4];
  float eps, scale;
  uint32_t pad0, pad1;
};
static_assert(sizeof(NormParams) == 96);

struct BinaryParams {
  uint32_t d, n_rows, s1, s2, x_off, y_off, o_off, pad0;
  uint32_t x_st[4], y_st[4], o_st[4];
};
static_assert(sizeof(BinaryParams) == 80);

struct CopyParams {
  uint32_t d, n_rows, s1, s2, x_off, o_off, x_bf16, n_words;
  uint32_t x_st[4], o_st[4];
};
static_assert(sizeof(CopyParams) == 64);

struct GatesParams {
  uint32_t n, hv, b_off, b_st, a_off, a_st, al_off, dt_off, beta_off, beta_st, g_off, g_st;
};
static_assert(sizeof(GatesParams) == 48);

struct MatmulParams {
  uint32_t n, k, m, tiles_m, x_off, x_st, w_off, o_off, o_st, col0, bias_off, has_bias, k_piece, pieces,
      piece_stride, pad0;
};
static_assert(sizeof(MatmulParams) == 64);

struct MatmulReduceParams {
  uint32_t n, m, pieces, o_off, o_st, col0, bias_off, has_bias, plane, tiles_m, pad0, pad1;
};
static_assert(sizeof(MatmulReduceParams) == 48);

struct ConvParams {
  uint32_t n, c, k, n_seqs, x_off, x_st, w_off, si_off, o_off, o_st, so_off, has_prefix, len, pad0, pad1, pad2;
};
static_assert(sizeof(ConvParams) == 64);

// A 3-D operand in a params struct: its first element in its binding, then its two outer strides
// (the WGSL structs spell the three words out as <name>_off, <name>_st0, <name>_st1).
struct Operand3 {
  uint32_t off, st0, st1;
};
static_assert(sizeof(Operand3) == 12);

Operand3 operand3(const Bound& b, const Tensor& t) { return {b.off, u32(t.stride[0]), u32(t.stride[1])}; }

struct RopeParams {
  uint32_t n, h, half, n_seqs;
  Operand3 x;
  uint32_t pad0;
};
static_assert(sizeof(RopeParams) == 32);

struct AttentionParams {
  uint32_t n_work, h, hkv, hd, ls;
  float scale;
  uint32_t gw, n_hchunks, max_splits, n, work_base, split_base;
  Operand3 q, k, v, pk, pv, o;
  uint32_t pad2, pad3;
};
static_assert(sizeof(AttentionParams) == 128);

struct PointerParams {
  uint32_t m, p_dim, q_rows, u_off, u_st, k_off, k_st, qi_off, o_off;
  float scale;
  uint32_t pad0, pad1;
};
static_assert(sizeof(PointerParams) == 48);

// The gated delta rule's shapes and operands (offsets, strides), first in the prep and short kernels'
// parameters.
struct GdnOperands {
  uint32_t hk, hv, dk, dv;
  Operand3 q, k, v;
  uint32_t g_off, g_st, b_off, b_st;
};

struct GdnPrepParams {
  GdnOperands o;
  uint32_t n_chunks, chunk_base, region;
};
static_assert(sizeof(GdnPrepParams) == 80);

struct GdnRecurParams {
  uint32_t hk, hv, dk, dv;
  Operand3 k;
  uint32_t si_off, so_off, has_state_in, has_state_out, n_seqs, n_slices, region, pad0, pad1;
};
static_assert(sizeof(GdnRecurParams) == 64);

struct GdnShortParams {
  GdnOperands o;
  uint32_t si_off;
  Operand3 out;
  uint32_t has_state_in, n_seqs, n_slices;
};
static_assert(sizeof(GdnShortParams) == 96);

struct GdnOutParams {
  uint32_t hk, hv, dk, dv;
  Operand3 q, o;
  uint32_t n_chunks, chunk_base, n_slices, region, pad0, pad1;
};
static_assert(sizeof(GdnOutParams) == 64);

}  // namespace

// ---- gathers ------------------------------------------------------------------------------------

Status WebGpuBackend::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  constexpr const char* kOp = "embedding";
  KEV_TRY(cpu::check_embedding({kOp, false}, table, ids, out));
  KEV_TRY(check_op(OpKind::Embedding, {table, ids, out}));
  device_->begin_op();
  const int64_t n = out.shape[0], d = out.shape[1];
  if (n == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bi, bind(kOp, "ids", ids, 1));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 2));
  auto* buf = dynamic_cast<GpuBuffer*>(table.buffer);
  KEV_CHECK(buf != nullptr, ErrorCode::InvalidRequest, kOp, ": table lives in a buffer the webgpu backend did not allocate");
  const KernelSpec& kernel = table.dtype == DType::BF16 ? kGatherBf16 : kGatherF32;
  const uint64_t es = dtype_size(table.dtype);
  GatherParams p{};
  p.n = u32(n);
  p.d = u32(d);
  p.src_stride = u32(table.stride[0]);
  p.ids_off = bi.off;
  p.out_off = bo.off;
  p.out_stride = u32(out.stride[0]);
  p.total_rows = u32(table.shape[0]);
  if (buf->pieces().size() <= 1) {
    KEV_ASSIGN_OR_RETURN(Bound bt, bind(kOp, "table", table, 0));
    KEV_TRY(separate(kOp, {&bt, &bi}, {&bo}));
    p.src_off = bt.off;
    p.row_begin = 0;
    p.row_count = u32(table.shape[0]);
    p.zero_invalid = 1;
    return dispatch(kOp, kernel, &p, sizeof p, {bt.b, bi.b, bo.b}, ceil_div(n * d, kGroup));
  }
  // A table split at upload: one dispatch per piece, each writing the rows whose id it holds.
  KEV_TRY(separate(kOp, {&bi}, {&bo}));
  const GpuBuffer::Piece& first = buf->pieces().front();
  KEV_CHECK(table.offset == 0 && table.is_contiguous() &&
                first.row_bytes == static_cast<uint64_t>(table.stride[0]) * es,
            ErrorCode::InvalidRequest, kOp, ": table ", table.describe(),
            " must be the whole split weight it was uploaded as");
  bool first_piece = true;
  for (const GpuBuffer::Piece& piece : buf->pieces()) {
    p.src_off = 0;
    p.row_begin = u32(piece.begin / piece.row_bytes);
    p.row_count = u32(piece.size / piece.row_bytes);
    p.zero_invalid = first_piece ? 1 : 0;
    first_piece = false;
    KEV_TRY(dispatch(kOp, kernel, &p, sizeof p, {Binding{piece.buffer, 0, piece.size}, bi.b, bo.b},
                     ceil_div(n * d, kGroup)));
  }
  return Status::success();
}

Status WebGpuBackend::gather_rows(const Tensor& x, const Tensor& idx, const Tensor& out) {
  constexpr const char* kOp = "gather_rows";
  KEV_TRY(cpu::check_gather_rows({kOp, false}, x, idx, out));
  KEV_TRY(check_op(OpKind::GatherRows, {x, idx, out}));
  device_->begin_op();
  const int64_t n = out.shape[0], d = out.shape[1];
  if (n == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bi, bind(kOp, "idx", idx, 1));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 2));
  KEV_TRY(separate(kOp, {&bx, &bi}, {&bo}));
  GatherParams p{};
  p.n = u32(n);
  p.d = u32(d);
  p.src_off = bx.off;
  p.src_stride = u32(x.stride[0]);
  p.ids_off = bi.off;
  p.out_off = bo.off;
  p.out_stride = u32(out.stride[0]);
  p.row_count = p.total_rows = u32(x.shape[0]);
  p.zero_invalid = 1;
  return dispatch(kOp, kGatherF32, &p, sizeof p, {bx.b, bi.b, bo.b}, ceil_div(n * d, kGroup));
}

// ---- norms --------------------------------------------------------------------------------------

namespace {

// The norm kernels' parameters over the rows of `o` (z's strides only when a z / y operand is bound).
NormParams norm_params(const Outer& o, int64_t d, const Tensor& x, const Bound& bx, const Tensor* z, const Bound& bz,
                       const Bound& bw, const Tensor& out, const Bound& bo, float eps, float scale) {
  NormParams p{};
  p.d = u32(d);
  p.n_rows = o.rows;
  p.s1 = o.s1;
  p.s2 = o.s2;
  p.x_off = bx.off;
  p.z_off = bz.off;
  p.w_off = bw.off;
  p.o_off = bo.off;
  outer_strides(x, p.x_st);
  if (z != nullptr) outer_strides(*z, p.z_st);
  outer_strides(out, p.o_st);
  p.eps = eps;
  p.scale = scale;
  return p;
}

// norms.wgsl's l2_norm_short takes rows of at most kShortRowMax (SHORT_MAX there), eight a workgroup.
constexpr int64_t kShortRowMax = 256;
constexpr uint64_t kShortRowsPerGroup = 8;

}  // namespace

Status WebGpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  KEV_TRY(cpu::check_rms_norm({kOp, false}, x, w, out));
  KEV_TRY(check_op(OpKind::RmsNorm, {x, w, out}));
  device_->begin_op();
  const Outer o = outer_of(x);
  const int64_t d = x.dim(-1);
  if (o.rows == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bw, bind(kOp, "w", w, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  const Bound bz{device_->dummy(1), 0};
  KEV_TRY(separate(kOp, {&bx, &bw}, {&bo}));
  const NormParams p = norm_params(o, d, x, bx, nullptr, bz, bw, out, bo, eps, 1.0f);
  return dispatch(kOp, kRmsNorm, &p, sizeof p, {bx.b, bz.b, bw.b, bo.b}, o.rows);
}

Status WebGpuBackend::add_rms_norm(const Tensor& x, const Tensor& y, const Tensor& w, float eps, const Tensor& out) {
  constexpr const char* kOp = "add_rms_norm";
  KEV_TRY(cpu::check_add_rms_norm({kOp, false}, x, y, w, out));
  KEV_TRY(check_op(OpKind::AddRmsNorm, {x, y, w, out}));
  device_->begin_op();
  const Outer o = outer_of(x);
  const int64_t d = x.dim(-1);
  if (o.rows == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound by, bind(kOp, "y", y, 1));
  KEV_ASSIGN_OR_RETURN(Bound bw, bind(kOp, "w", w, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  KEV_TRY(separate(kOp, {&by, &bw}, {&bx, &bo}));
  const NormParams p = norm_params(o, d, x, bx, &y, by, bw, out, bo, eps, 1.0f);
  return dispatch(kOp, kAddRmsNorm, &p, sizeof p, {bx.b, by.b, bw.b, bo.b}, o.rows);
}

Status WebGpuBackend::l2_norm(const Tensor& x, float eps, float scale, const Tensor& out) {
  constexpr const char* kOp = "l2_norm";
  KEV_TRY(cpu::check_l2_norm({kOp, false}, x, out));
  KEV_TRY(check_op(OpKind::L2Norm, {x, out}));
  device_->begin_op();
  const Outer o = outer_of(x);
  const int64_t d = x.dim(-1);
  if (o.rows == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  KEV_TRY(separate(kOp, {&bx}, {&bo}));
  const Bound bz{device_->dummy(1), 0}, bw{device_->dummy(2), 0};
  const NormParams p = norm_params(o, d, x, bx, nullptr, bz, bw, out, bo, eps, scale);
  if (d <= kShortRowMax) {
    return dispatch(kOp, kL2NormShort, &p, sizeof p, {bx.b, bz.b, bw.b, bo.b}, ceil_div(o.rows, kShortRowsPerGroup));
  }
  return dispatch(kOp, kL2Norm, &p, sizeof p, {bx.b, bz.b, bw.b, bo.b}, o.rows);
}

Status WebGpuBackend::rms_norm_gated(const Tensor& o_in, const Tensor& z, const Tensor& w, float eps,
                                     const Tensor& out) {
  constexpr const char* kOp = "rms_norm_gated";
  KEV_TRY(cpu::check_rms_norm_gated({kOp, false}, o_in, z, w, out));
  KEV_TRY(check_op(OpKind::RmsNormGated, {o_in, z, w, out}));
  device_->begin_op();
  const Outer o = outer_of(o_in);
  const int64_t d = o_in.dim(-1);
  if (o.rows == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "o", o_in, 0));
  KEV_ASSIGN_OR_RETURN(Bound bz, bind(kOp, "z", z, 1));
  KEV_ASSIGN_OR_RETURN(Bound bw, bind(kOp, "w", w, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  KEV_TRY(separate(kOp, {&bx, &bz, &bw}, {&bo}));
  const NormParams p = norm_params(o, d, o_in, bx, &z, bz, bw, out, bo, eps, 1.0f);
  return dispatch(kOp, kRmsNormGated, &p, sizeof p, {bx.b, bz.b, bw.b, bo.b}, o.rows);
}

// ---- element-wise -------------------------------------------------------------------------------

Status WebGpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) {
  KEV_TRY(check_op(OpKind::SigmoidMul, {x, gate, out}));
  return binary("sigmoid_mul", kSigmoidMul, x, gate, out);
}

Status WebGpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  KEV_TRY(check_op(OpKind::Swiglu, {gate, up, out}));
  return binary("swiglu", kSwiglu, gate, up, out);
}

Status WebGpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  KEV_TRY(check_op(OpKind::Add, {a, b, out}));
  return binary("add", kAdd, a, b, out);
}

Status WebGpuBackend::binary(const char* op, const KernelSpec& k, const Tensor& x, const Tensor& y, const Tensor& out) {
  KEV_TRY(cpu::check_binary({op, false}, x, y, out));
  device_->begin_op();
  const Outer o = outer_of(x);
  const int64_t d = x.dim(-1);
  if (o.rows == 0 || d == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(op, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound by, bind(op, "y", y, 1));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(op, "out", out, 2));
  KEV_TRY(separate(op, {&bx, &by}, {&bo}));
  BinaryParams p{};
  p.d = u32(d);
  p.n_rows = o.rows;
  p.s1 = o.s1;
  p.s2 = o.s2;
  p.x_off = bx.off;
  p.y_off = by.off;
  p.o_off = bo.off;
  outer_strides(x, p.x_st);
  outer_strides(y, p.y_st);
  outer_strides(out, p.o_st);
  return dispatch(op, k, &p, sizeof p, {bx.b, by.b, bo.b}, ceil_div(uint64_t{o.rows} * d, kGroup));
}

Status WebGpuBackend::copy(const Tensor& x, const Tensor& out) {
  constexpr const char* kOp = "copy";
  KEV_TRY(cpu::check_copy({kOp, false}, x, out));
  KEV_TRY(check_op(OpKind::Copy, {x, out}));
  device_->begin_op();
  const Outer o = outer_of(x);
  const int64_t d = x.dim(-1);
  const uint64_t total = uint64_t{o.rows} * static_cast<uint64_t>(d);
  if (total == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 1));
  KEV_TRY(separate(kOp, {&bx}, {&bo}));
  CopyParams p{};
  p.d = u32(d);
  p.n_rows = o.rows;
  p.s1 = o.s1;
  p.s2 = o.s2;
  p.x_off = bx.off;
  p.o_off = bo.off;
  p.x_bf16 = x.dtype == DType::BF16 ? 1 : 0;
  outer_strides(x, p.x_st);
  outer_strides(out, p.o_st);
  if (out.dtype == DType::BF16) {
    const uint64_t first_word = bo.off / 2, last_word = (bo.off + total - 1) / 2;
    p.n_words = u32(last_word - first_word + 1);
    return dispatch(kOp, kCopyToBf16, &p, sizeof p, {bx.b, bo.b}, ceil_div(p.n_words, kGroup));
  }
  return dispatch(kOp, kCopyToF32, &p, sizeof p, {bx.b, bo.b}, ceil_div(total, kGroup));
}

Status WebGpuBackend::gdn_gates(const Tensor& b, const Tensor& a, const Tensor& a_log, const Tensor& dt_bias,
                                const Tensor& beta, const Tensor& g) {
  constexpr const char* kOp = "gdn_gates";
  KEV_TRY(cpu::check_gdn_gates({kOp, false}, b, a, a_log, dt_bias, beta, g));
  KEV_TRY(check_op(OpKind::GdnGates, {b, a, a_log, dt_bias, beta, g}));
  device_->begin_op();
  const int64_t n = b.shape[0], hv = b.shape[1];
  if (n == 0 || hv == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bb, bind(kOp, "b", b, 0));
  KEV_ASSIGN_OR_RETURN(Bound ba, bind(kOp, "a", a, 1));
  KEV_ASSIGN_OR_RETURN(Bound bl, bind(kOp, "a_log", a_log, 2));
  KEV_ASSIGN_OR_RETURN(Bound bd, bind(kOp, "dt_bias", dt_bias, 3));
  KEV_ASSIGN_OR_RETURN(Bound bbeta, bind(kOp, "beta", beta, 4));
  KEV_ASSIGN_OR_RETURN(Bound bg, bind(kOp, "g", g, 5));
  KEV_TRY(separate(kOp, {&bb, &ba, &bl, &bd}, {&bbeta, &bg}));
  GatesParams p{};
  p.n = u32(n);
  p.hv = u32(hv);
  p.b_off = bb.off;
  p.b_st = u32(b.stride[0]);
  p.a_off = ba.off;
  p.a_st = u32(a.stride[0]);
  p.al_off = bl.off;
  p.dt_off = bd.off;
  p.beta_off = bbeta.off;
  p.beta_st = u32(beta.stride[0]);
  p.g_off = bg.off;
  p.g_st = u32(g.stride[0]);
  return dispatch(kOp, kGdnGates, &p, sizeof p, {bb.b, ba.b, bl.b, bd.b, bbeta.b, bg.b}, ceil_div(n * hv, kGroup));
}

// ---- matmul -------------------------------------------------------------------------------------

namespace {

// matmul.wgsl's k pieces for a weight of m rows of k: a function of the weight's shape alone, never of
// the pass, so a row gets the same partial sums, added in the same order, in every pass and from every
// entry point. piece_k is a multiple of 16 (k rounded up to 16 for one piece).
struct KSplit {
  uint64_t piece_k, pieces;
};

KSplit matmul_split(int64_t m, int64_t k) {
  const uint64_t blocks = ceil_div(static_cast<uint64_t>(k), 16);
  const uint64_t ref_tiles = ceil_div(kMatmulSplitRows, kMatmulTile) * ceil_div(static_cast<uint64_t>(m), kMatmulTile);
  uint64_t want = 1;
  if (ref_tiles < kMatmulMinLargeTiles) {
    want = std::min(ceil_div(kMatmulSplitTiles, ref_tiles), static_cast<uint64_t>(k) / kMatmulMinPieceK);
  }
  want = std::max<uint64_t>(want, 1);
  const uint64_t piece_k = ceil_div(blocks, want) * 16;
  return {piece_k, piece_k == 0 ? 1 : ceil_div(static_cast<uint64_t>(k), piece_k)};
}

}  // namespace

Status WebGpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  constexpr const char* kOp = "matmul";
  KEV_TRY(cpu::check_matmul({kOp, false}, x, w, bias, out));
  KEV_TRY(check_op(OpKind::Matmul, {x, w, bias, out}));
  device_->begin_op();
  const int64_t n = x.shape[0], k = x.shape[1], m = w.shape[0];
  if (n == 0 || m == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bb, bind(kOp, "bias", bias, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  auto* wbuf = dynamic_cast<GpuBuffer*>(w.buffer);
  KEV_CHECK(wbuf != nullptr, ErrorCode::InvalidRequest, kOp, ": w lives in a buffer the webgpu backend did not allocate");
  // Weight pieces: (binding, first output column, column count).
  struct Part {
    Bound bw;
    int64_t col0, cols;
  };
  std::vector<Part> parts;
  if (wbuf->pieces().size() <= 1) {
    KEV_ASSIGN_OR_RETURN(Bound bw, bind(kOp, "w", w, 1));
    parts.push_back({bw, 0, m});
  } else {
    const GpuBuffer::Piece& first = wbuf->pieces().front();
    KEV_CHECK(w.offset == 0 && first.row_bytes == static_cast<uint64_t>(k) * sizeof(float), ErrorCode::InvalidRequest,
              kOp, ": w ", w.describe(), " must be the whole split weight it was uploaded as");
    for (const GpuBuffer::Piece& piece : wbuf->pieces()) {
      parts.push_back({Bound{Binding{piece.buffer, 0, piece.size}, 0}, static_cast<int64_t>(piece.begin / piece.row_bytes),
                       static_cast<int64_t>(piece.size / piece.row_bytes)});
    }
  }
  for (Part& part : parts) KEV_TRY(separate(kOp, {&bx, &bb, &part.bw}, {&bo}));
  const KSplit split = matmul_split(m, k);
  MatmulParams p{};
  p.n = u32(n);
  p.k = u32(k);
  p.x_off = bx.off;
  p.x_st = u32(n > 1 ? x.stride[0] : k);
  p.o_off = bo.off;
  p.o_st = u32(n > 1 ? out.stride[0] : m);
  p.bias_off = bb.off;
  p.has_bias = bias.empty() ? 0 : 1;
  p.k_piece = u32(split.piece_k);
  p.pieces = 1;
  // Split-K passes of more rows than matmul_rows takes: `matmul_wide_split` writes partial planes
  // [pieces][tiles] (matmul_reduce.wgsl's layout, edge tiles whole) to one scratch binding, taken once
  // for the op and reused by every weight piece, for as many rows at a time as fit the binding limit
  // (a multiple of the tile's 64 rows when not all of them fit).
  const bool split_pass = n > kMatmulMaxRows && split.pieces > 1;
  int64_t chunk_rows = n;
  Binding planes;
  if (split_pass) {
    int64_t max_cols = 0;
    for (const Part& part : parts) max_cols = std::max(max_cols, part.cols);
    auto plane_bytes = [&](uint64_t rows) {
      return split.pieces * ceil_div(rows, kMatmulWideRows) * kMatmulWideRows * ceil_div(max_cols, kMatmulTile) *
             kMatmulTile * sizeof(float);
    };
    if (plane_bytes(n) > limits_.max_binding) {
      const uint64_t fit = limits_.max_binding / plane_bytes(kMatmulWideRows);
      KEV_CHECK(fit >= 1, ErrorCode::Unsupported, kOp, ": the ", split.pieces, " partial sums of ", kMatmulWideRows,
                " rows of ", max_cols, " columns exceed the storage binding limit of ", limits_.max_binding, " bytes");
      chunk_rows = static_cast<int64_t>(fit * kMatmulWideRows);
    }
    KEV_ASSIGN_OR_RETURN(planes, device_->scratch(plane_bytes(chunk_rows)));
  }
  for (const Part& part : parts) {
    p.m = u32(part.cols);
    p.w_off = part.bw.off;
    p.col0 = u32(part.col0);
    if (n <= kMatmulMaxRows) {
      // Folds the k pieces itself.
      p.tiles_m = u32(ceil_div(part.cols, kMatmulRowsColumns));
      KEV_TRY(dispatch(kOp, kMatmulRows, &p, sizeof p, {bx.b, part.bw.b, bb.b, bo.b}, p.tiles_m));
      continue;
    }
    if (!split_pass) {
      // 128×128 tiles where there are enough of them to fill a large GPU (an H200 has 132
      // multiprocessors, each running two such workgroups), else 64-row × 128-column tiles of
      // `matmul_wide` (short's 250 / 220-row gate_up, in_proj and k|v|q products; 64×64 tiles until
      // 2026-12-02). Measured on the H200 (docs/backends.md): long's 2,187 × 1,024 outputs (144 tiles
      // of 128, half the GPU's slots) ran at 13 TFLOP/s as 128×128 tiles, and the prefill took 9 ms
      // less with them as 64×64 tiles (the threshold at 264 instead of 128); a double-buffered 128×128
      // kernel (32 KiB) ran at 13 TFLOP/s against this one's 24 at 4096³, 32×64 tiles for the
      // smallest outputs gained nothing over 64×64, and 64×128 tiles as 128 invocations with 8×8
      // blocks ran slower than 64×64 ones at 250 rows.
      const bool large = ceil_div(n, kMatmulTile) * ceil_div(part.cols, kMatmulTile) >= kMatmulMinLargeTiles;
      p.tiles_m = u32(ceil_div(part.cols, kMatmulTile));
      KEV_TRY(dispatch(kOp, large ? kMatmul : kMatmulWide, &p, sizeof p, {bx.b, part.bw.b, bb.b, bo.b},
                       ceil_div(n, large ? kMatmulTile : kMatmulWideRows) * p.tiles_m));
      continue;
    }
    for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - r0);
      MatmulParams q = p;
      q.n = u32(rows);
      q.x_off = u32(p.x_off + static_cast<uint64_t>(r0) * p.x_st);
      q.o_off = 0;
      q.o_st = p.m;
      q.col0 = 0;
      q.has_bias = 0;
      q.pieces = u32(split.pieces);
      q.tiles_m = u32(ceil_div(part.cols, kMatmulTile));
      const uint64_t tiles = ceil_div(rows, kMatmulWideRows) * q.tiles_m;
      q.piece_stride = u32(tiles * kMatmulWideRows * kMatmulTile);
      KEV_TRY(dispatch(kOp, kMatmulWideSplit, &q, sizeof q, {bx.b, part.bw.b, bb.b, planes}, tiles * split.pieces));
      MatmulReduceParams r{};
      r.n = u32(rows);
      r.m = p.m;
      r.pieces = u32(split.pieces);
      r.o_off = u32(p.o_off + static_cast<uint64_t>(r0) * p.o_st);
      r.o_st = p.o_st;
      r.col0 = p.col0;
      r.bias_off = p.bias_off;
      r.has_bias = p.has_bias;
      r.plane = q.piece_stride;
      r.tiles_m = q.tiles_m;
      KEV_TRY(dispatch(kOp, kMatmulReduce, &r, sizeof r, {planes, bb.b, bo.b},
                       tiles * kMatmulWideRows * kMatmulTile / 4 / kGroup));
    }
  }
  return Status::success();
}

// ---- causal conv, rope, attention, pointer head ---------------------------------------------------

Status WebGpuBackend::causal_conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state_in,
                                         const SeqLayout& layout, const Tensor& out, const Tensor& state_out) {
  constexpr const char* kOp = "causal_conv1d_silu";
  KEV_TRY(cpu::check_causal_conv1d_silu({kOp, false}, x, w, state_in, out, state_out));
  KEV_TRY(check_op(OpKind::CausalConv1dSilu, {x, w, state_in, out, state_out}));
  KEV_TRY(cpu::check_layout(kOp, layout, x.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  device_->begin_op();
  const int64_t n = x.shape[0], C = x.shape[1], K = w.shape[1];
  const Tensor none;
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 0));
  KEV_ASSIGN_OR_RETURN(Bound bw, bind(kOp, "w", w, 1));
  KEV_ASSIGN_OR_RETURN(Bound bs, bind(kOp, "state_in", layout.from_prefix ? state_in : none, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 4));
  KEV_ASSIGN_OR_RETURN(Bound bso, bind(kOp, "state_out", state_out, 5));
  KEV_TRY(separate(kOp, {&bx, &bw, &bs}, {&bo, &bso}));
  KEV_ASSIGN_OR_RETURN(Binding offsets, stage_offsets(layout));
  ConvParams p{};
  p.n = u32(n);
  p.c = u32(C);
  p.k = u32(K);
  p.n_seqs = u32(layout.n_seqs());
  p.x_off = bx.off;
  p.x_st = u32(x.stride[0]);
  p.w_off = bw.off;
  p.si_off = bs.off;
  p.o_off = bo.off;
  p.o_st = u32(out.stride[0]);
  p.so_off = bso.off;
  p.has_prefix = layout.from_prefix ? 1 : 0;
  p.len = u32(n);
  if (n > 0 && C > 0) {
    KEV_TRY(dispatch(kOp, kConv, &p, sizeof p, {bx.b, bw.b, bs.b, offsets, bo.b, bso.b}, ceil_div(n * C, kGroup)));
  }
  if (!state_out.empty() && C > 0) {
    KEV_TRY(dispatch(kOp, kConvState, &p, sizeof p, {bx.b, bw.b, bs.b, offsets, bo.b, bso.b},
                     ceil_div(C * K, kGroup)));
  }
  return Status::success();
}

Status WebGpuBackend::rope(const Tensor& x, const SeqLayout& layout, int64_t n_rot, double theta) {
  constexpr const char* kOp = "rope";
  KEV_TRY(cpu::check_rope({kOp, false}, x));
  KEV_TRY(check_op(OpKind::Rope, {x}));
  KEV_TRY(cpu::check_layout(kOp, layout, x.shape[0]));
  const int64_t H = x.shape[1], hd = x.shape[2], half = n_rot / 2;
  KEV_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= hd, ErrorCode::InvalidRequest, kOp, ": n_rot = ", n_rot,
            " must be even and within [0, head size ", hd, "]");
  KEV_CHECK(theta > 0 && std::isfinite(theta), ErrorCode::InvalidRequest, kOp, ": theta = ", theta,
            " must be positive and finite");
  device_->begin_op();
  if (half == 0 || x.shape[0] == 0 || H == 0) return Status::success();
  const int64_t max_len = layout.longest();
  // Angles in double on the host, as the CPU backend does (see rope.wgsl); computed once for each
  // (positions, n_rot, theta) and staged once per pass.
  if (!rope_table_ || rope_table_->pos0 != layout.pos0 || rope_table_->max_len != max_len ||
      rope_table_->n_rot != n_rot || rope_table_->theta != theta) {
    std::vector<float> table(static_cast<size_t>(max_len * 2 * half));
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
      for (int64_t t = 0; t < max_len; ++t) {
        const double phi = static_cast<double>(layout.pos0 + t) * inv_freq;
        table[t * 2 * half + i] = static_cast<float>(std::cos(phi));
        table[t * 2 * half + half + i] = static_cast<float>(std::sin(phi));
      }
    }
    rope_table_ = RopeTable{layout.pos0, max_len, n_rot, theta, std::move(table), 0, Binding{}};
  }
  if (rope_table_->binding.buffer == nullptr || rope_table_->flushes != device_->flushes()) {
    const std::vector<float>& values = rope_table_->values;
    KEV_ASSIGN_OR_RETURN(rope_table_->binding, device_->stage(values.data(), values.size() * sizeof(float)));
    rope_table_->flushes = device_->flushes();
  }
  const Binding bt = rope_table_->binding;
  KEV_ASSIGN_OR_RETURN(Binding offsets, stage_offsets(layout));
  KEV_ASSIGN_OR_RETURN(Bound bx, bind(kOp, "x", x, 2));
  RopeParams p{};
  p.n = u32(x.shape[0]);
  p.h = u32(H);
  p.half = u32(half);
  p.n_seqs = u32(layout.n_seqs());
  p.x = operand3(bx, x);
  return dispatch(kOp, kRope, &p, sizeof p, {bt, offsets, bx.b}, ceil_div(x.shape[0] * H * half, kGroup));
}

Status WebGpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& prefix_k,
                                const Tensor& prefix_v, const SeqLayout& layout, float scale, const Tensor& out) {
  constexpr const char* kOp = "attention";
  KEV_TRY(cpu::check_attention({kOp, false}, q, k, v, prefix_k, prefix_v, out));
  KEV_TRY(check_op(OpKind::Attention, {q, k, v, prefix_k, prefix_v, out}));
  KEV_TRY(cpu::check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !prefix_k.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but prefix_k / prefix_v are empty");
  device_->begin_op();
  const int64_t n = q.shape[0], H = q.shape[1], hd = q.shape[2];
  if (n == 0 || H == 0) return Status::success();
  const bool use_prefix = layout.from_prefix && prefix_k.shape[0] > 0;
  const Tensor none;
  KEV_ASSIGN_OR_RETURN(Bound bq, bind(kOp, "q", q, 0));
  KEV_ASSIGN_OR_RETURN(Bound bk, bind(kOp, "k", k, 1));
  KEV_ASSIGN_OR_RETURN(Bound bv, bind(kOp, "v", v, 2));
  KEV_ASSIGN_OR_RETURN(Bound bpk, bind(kOp, "prefix_k", use_prefix ? prefix_k : none, 3));
  KEV_ASSIGN_OR_RETURN(Bound bpv, bind(kOp, "prefix_v", use_prefix ? prefix_v : none, 4));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 6));
  KEV_TRY(separate(kOp, {&bq, &bk, &bv, &bpk, &bpv}, {&bo}));
  // A workgroup's 64 rows: `tpw` tokens × `gw` of the G heads sharing a KV head (G > 64: head chunks).
  const int64_t Hkv = k.shape[1], G = H / Hkv, Ls = use_prefix ? prefix_k.shape[0] : 0;
  const int64_t gw = std::min(G, kAttnRows), tpw = kAttnRows / gw;
  // Query tiles of up to tpw consecutive tokens of one sequence, and their key tile counts.
  struct QueryTile {
    int64_t begin, tau0, count, key_tiles;
  };
  std::vector<QueryTile> qtiles;
  int64_t total_key_tiles = 0;
  for (int64_t r = 0; r < layout.n_seqs(); ++r) {
    const int64_t len = layout.offsets[r + 1] - layout.offsets[r];
    for (int64_t tau0 = 0; tau0 < len; tau0 += tpw) {
      const int64_t count = std::min(tpw, len - tau0);
      qtiles.push_back({layout.offsets[r], tau0, count, (Ls + tau0 + count + kAttnKeys - 1) / kAttnKeys});
      total_key_tiles += qtiles.back().key_tiles;
    }
  }
  const int64_t n_hchunks = (G + gw - 1) / gw, per_item = Hkv * n_hchunks;
  // Key splits: a tile's key tiles go in pieces of about `goal` key tiles, so no workgroup carries more
  // than the average load of kAttnTargetGroups workgroups (passes with few tiles, or a causal
  // prefill's long last tiles, still spread over the GPU); at least kAttnMinSplitTiles key tiles a
  // piece, at most kAttnMaxSplits pieces a tile, and every split's partial rows (hd + 2 floats per
  // token and head) within one scratch binding (else the pass runs unsplit).
  const uint64_t split_bytes = static_cast<uint64_t>(n) * H * (hd + 2) * sizeof(float);
  const int64_t fit = std::min<int64_t>(kAttnMaxSplits, static_cast<int64_t>(limits_.max_binding / split_bytes));
  const int64_t goal =
      std::max(kAttnMinSplitTiles, (total_key_tiles * per_item + kAttnTargetGroups - 1) / kAttnTargetGroups);
  struct Work {
    uint32_t tile, kt0, kt1, split;
  };
  std::vector<Work> work;
  // Staged table: per tile (sequence start, τ0, count, splits), then the work items, then per token
  // its tile's split count (attention.wgsl's header).
  std::vector<uint32_t> table;
  std::vector<uint32_t> token_splits(static_cast<size_t>(n), 1);
  int64_t max_splits = 1;
  for (size_t i = 0; i < qtiles.size(); ++i) {
    const QueryTile& t = qtiles[i];
    const int64_t want = fit < 2 ? 1 : std::min(fit, (t.key_tiles + goal - 1) / goal);
    const int64_t piece = (t.key_tiles + want - 1) / want;
    const int64_t splits = (t.key_tiles + piece - 1) / piece;
    for (int64_t s = 0; s < splits; ++s) {
      work.push_back({u32(i), u32(s * piece), u32(std::min(t.key_tiles, (s + 1) * piece)), u32(s)});
    }
    table.insert(table.end(), {u32(t.begin), u32(t.tau0), u32(t.count), u32(splits)});
    std::fill_n(token_splits.begin() + t.begin + t.tau0, t.count, u32(splits));
    max_splits = std::max(max_splits, splits);
  }
  // Longest work items first, so the GPU's last workgroups are short ones.
  std::stable_sort(work.begin(), work.end(),
                   [](const Work& a, const Work& b) { return a.kt1 - a.kt0 > b.kt1 - b.kt0; });
  const size_t work_base = table.size();
  for (const Work& w : work) table.insert(table.end(), {w.tile, w.kt0, w.kt1, w.split});
  const size_t split_base = table.size();
  table.insert(table.end(), token_splits.begin(), token_splits.end());
  KEV_ASSIGN_OR_RETURN(Binding bt, device_->stage(table.data(), table.size() * sizeof(uint32_t)));
  Binding part = device_->dummy(7);
  if (max_splits > 1) {
    KEV_ASSIGN_OR_RETURN(part, device_->scratch(static_cast<uint64_t>(max_splits) * split_bytes));
  }
  AttentionParams p{};
  p.n_work = u32(work.size());
  p.h = u32(H);
  p.hkv = u32(Hkv);
  p.hd = u32(hd);
  p.ls = u32(Ls);
  p.scale = scale;
  p.gw = u32(gw);
  p.n_hchunks = u32(n_hchunks);
  p.max_splits = u32(max_splits);
  p.n = u32(n);
  p.work_base = u32(work_base);
  p.split_base = u32(split_base);
  p.q = operand3(bq, q);
  p.k = operand3(bk, k);
  p.v = operand3(bv, v);
  if (use_prefix) {
    p.pk = operand3(bpk, prefix_k);
    p.pv = operand3(bpv, prefix_v);
  }
  p.o = operand3(bo, out);
  KEV_TRY(dispatch(kOp, kAttention, &p, sizeof p, {bq.b, bk.b, bv.b, bpk.b, bpv.b, bt, bo.b, part},
                   work.size() * static_cast<uint64_t>(per_item)));
  if (max_splits == 1) return Status::success();
  return dispatch(kOp, kAttentionCombine, &p, sizeof p, {bq.b, bk.b, bv.b, bpk.b, bpv.b, bt, bo.b, part},
                  static_cast<uint64_t>(n * H));
}

Status WebGpuBackend::pointer_logits(const Tensor& u, const Tensor& kappa, const Tensor& question, float scale,
                                     const Tensor& out) {
  constexpr const char* kOp = "pointer_logits";
  KEV_TRY(cpu::check_pointer_logits({kOp, false}, u, kappa, question, out));
  KEV_TRY(check_op(OpKind::PointerLogits, {u, kappa, question, out}));
  device_->begin_op();
  const int64_t M = kappa.shape[0];
  if (M == 0) return Status::success();
  KEV_ASSIGN_OR_RETURN(Bound bu, bind(kOp, "u", u, 0));
  KEV_ASSIGN_OR_RETURN(Bound bk, bind(kOp, "kappa", kappa, 1));
  KEV_ASSIGN_OR_RETURN(Bound bq, bind(kOp, "question", question, 2));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 3));
  KEV_TRY(separate(kOp, {&bu, &bk, &bq}, {&bo}));
  PointerParams p{};
  p.m = u32(M);
  p.p_dim = u32(u.shape[1]);
  p.q_rows = u32(u.shape[0]);
  p.u_off = bu.off;
  p.u_st = u32(u.stride[0]);
  p.k_off = bk.off;
  p.k_st = u32(kappa.stride[0]);
  p.qi_off = bq.off;
  p.o_off = bo.off;
  p.scale = scale;
  return dispatch(kOp, kPointer, &p, sizeof p, {bu.b, bk.b, bq.b, bo.b}, static_cast<uint64_t>(M));
}

// ---- gated delta rule ---------------------------------------------------------------------------

Status WebGpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                       const Tensor& beta, const Tensor& state_in, const SeqLayout& layout,
                                       const Tensor& out, const Tensor& state_out) {
  constexpr const char* kOp = "gated_delta_rule";
  KEV_TRY(cpu::check_gated_delta_rule({kOp, false}, q, k, v, g, beta, state_in, out, state_out));
  KEV_TRY(check_op(OpKind::GatedDeltaRule, {q, k, v, g, beta, state_in, out, state_out}));
  KEV_TRY(cpu::check_layout(kOp, layout, q.shape[0]));
  KEV_CHECK(!layout.from_prefix || !state_in.empty(), ErrorCode::InvalidRequest, kOp,
            ": layout.from_prefix is set but state_in is empty");
  KEV_CHECK(state_out.empty() || layout.n_seqs() == 1, ErrorCode::InvalidRequest, kOp,
            ": state_out is only defined for a single-sequence pass; this pass has ", layout.n_seqs(), " sequences");
  device_->begin_op();
  const int64_t Hk = q.shape[1], dk = q.shape[2], Hv = v.shape[1], dv = v.shape[2];
  const int64_t R = layout.n_seqs();
  if (R == 0 || Hv == 0) return Status::success();
  const Tensor none;
  KEV_ASSIGN_OR_RETURN(Bound bq, bind(kOp, "q", q, 0));
  KEV_ASSIGN_OR_RETURN(Bound bk, bind(kOp, "k", k, 1));
  KEV_ASSIGN_OR_RETURN(Bound bv, bind(kOp, "v", v, 2));
  KEV_ASSIGN_OR_RETURN(Bound bg, bind(kOp, "g", g, 3));
  KEV_ASSIGN_OR_RETURN(Bound bbeta, bind(kOp, "beta", beta, 4));
  KEV_ASSIGN_OR_RETURN(Bound bs, bind(kOp, "state_in", layout.from_prefix ? state_in : none, 5));
  KEV_ASSIGN_OR_RETURN(Bound bo, bind(kOp, "out", out, 6));
  KEV_ASSIGN_OR_RETURN(Bound bso, bind(kOp, "state_out", state_out, 7));
  KEV_TRY(separate(kOp, {&bq, &bk, &bv, &bg, &bbeta, &bs}, {&bo, &bso}));

  GdnOperands go{};
  go.hk = u32(Hk);
  go.hv = u32(Hv);
  go.dk = u32(dk);
  go.dv = u32(dv);
  go.q = operand3(bq, q);
  go.k = operand3(bk, k);
  go.v = operand3(bv, v);
  go.g_off = bg.off;
  go.g_st = u32(g.stride[0]);
  go.b_off = bbeta.off;
  go.b_st = u32(beta.stride[0]);

  // Question rows (every sequence within one chunk, no state_out): the token recurrence, one dispatch
  // (gated_delta_net_short.wgsl says why this is not the prefill's trap).
  if (state_out.empty() && layout.longest() <= kChunk) {
    KEV_ASSIGN_OR_RETURN(Binding offsets, stage_offsets(layout));
    GdnShortParams sp{};
    sp.o = go;
    sp.si_off = bs.off;
    sp.out = operand3(bo, out);
    sp.has_state_in = layout.from_prefix ? 1 : 0;
    sp.n_seqs = u32(R);
    sp.n_slices = u32(ceil_div(dv, kShortSlice));
    return dispatch(kOp, kGdnShort, &sp, sizeof sp, {bq.b, bk.b, bv.b, bg.b, bbeta.b, bs.b, offsets, bo.b},
                    uint64_t{sp.n_slices} * Hv * R);
  }

  // Sequences go in groups whose chunk matrices fit one scratch binding (usually all at once):
  // Pᵀ [C×C], Wᵀ [dk×C], U (then Δ) [C×dv], γ and dlast [C] and the starting state [dk×dv] per chunk
  // and value head, the state's slot holding T [C×C] from prep to the W/U kernel first. A sequence
  // with more chunks than one binding holds runs alone in segments of max_chunks chunks, each
  // continuing from the state the previous one left (two state buffers used in turn, as a binding may
  // not be written while another binding of the dispatch reads it).
  const uint64_t region = uint64_t(kChunk) * kChunk + uint64_t(kChunk) * (dk + dv) + 2ull * kChunk +
                          std::max(uint64_t(dk) * dv, uint64_t(kChunk) * kChunk);
  const uint64_t region_bytes = region * sizeof(float) * static_cast<uint64_t>(Hv);
  const uint64_t max_chunks = limits_.max_binding / region_bytes;
  KEV_CHECK(max_chunks > 0, ErrorCode::Unsupported, kOp, ": one 64-token chunk needs ", region_bytes,
            " bytes of chunk matrices (", Hv, " value heads, dk ", dk, ", dv ", dv,
            "); the storage binding limit is ", limits_.max_binding);
  std::vector<int64_t> chunks(R);
  uint64_t group_max = 0, run = 0;
  bool segmented = false;
  for (int64_t r = 0; r < R; ++r) {
    chunks[r] = static_cast<int64_t>(ceil_div(layout.offsets[r + 1] - layout.offsets[r], kChunk));
    segmented = segmented || static_cast<uint64_t>(chunks[r]) > max_chunks;
    if (run + chunks[r] > max_chunks) {
      group_max = std::max(group_max, run);
      run = 0;
    }
    run += chunks[r];
  }
  group_max = std::min(std::max<uint64_t>({group_max, run, 1}), max_chunks);
  KEV_ASSIGN_OR_RETURN(Binding scratch, device_->scratch(group_max * region_bytes));
  const uint64_t state_bytes = static_cast<uint64_t>(Hv * dk * dv) * sizeof(float);
  std::array<Bound, 2> carried{};
  if (segmented) {
    for (Bound& c : carried) {
      KEV_ASSIGN_OR_RETURN(c.b, device_->scratch(state_bytes));
    }
  }

  GdnPrepParams pp{};
  pp.o = go;
  pp.region = u32(region);
  GdnRecurParams rp{};
  rp.hk = u32(Hk);
  rp.hv = u32(Hv);
  rp.dk = u32(dk);
  rp.dv = u32(dv);
  rp.k = go.k;
  rp.n_slices = u32(ceil_div(dv, kRecurSlice));
  rp.region = u32(region);
  GdnOutParams op{};
  op.hk = u32(Hk);
  op.hv = u32(Hv);
  op.dk = u32(dk);
  op.dv = u32(dv);
  op.q = go.q;
  op.o = operand3(bo, out);
  op.n_slices = u32(ceil_div(dv, kOutSlice));
  op.region = u32(region);

  // One group's table: per sequence (first chunk, chunk count, first token, length), then per chunk
  // (t0, cn, whether its starting state can be nonzero).
  struct Group {
    std::vector<uint32_t> seqs, chunk_list;
    uint64_t n_chunks = 0;
    void add(int64_t begin, int64_t len, bool from_state) {
      const int64_t n = static_cast<int64_t>(ceil_div(len, kChunk));
      seqs.insert(seqs.end(), {u32(n_chunks), u32(n), u32(begin), u32(len)});
      for (int64_t c = 0; c < n; ++c) {
        chunk_list.insert(chunk_list.end(), {u32(begin + c * kChunk), u32(std::min<int64_t>(kChunk, len - c * kChunk)),
                                             c > 0 || from_state ? 1u : 0u});
      }
      n_chunks += static_cast<uint64_t>(n);
    }
  };
  // The group's four dispatches.
  auto run_group = [&](const Group& g, const Bound& s_in, bool has_in, const Bound& s_out, bool has_out) -> Status {
    const std::vector<uint32_t>& seqs = g.seqs;
    const uint64_t n_chunks = g.n_chunks;
    std::vector<uint32_t> table(seqs);
    table.insert(table.end(), g.chunk_list.begin(), g.chunk_list.end());
    KEV_ASSIGN_OR_RETURN(Binding bt, device_->stage(table.data(), table.size() * sizeof(uint32_t)));
    pp.n_chunks = u32(n_chunks);
    pp.chunk_base = u32(seqs.size());
    KEV_TRY(dispatch(kOp, kGdnPrep, &pp, sizeof pp, {bq.b, bk.b, bg.b, bbeta.b, bt, scratch},
                     n_chunks * static_cast<uint64_t>(Hv)));
    KEV_TRY(dispatch(kOp, kGdnWu, &pp, sizeof pp, {bk.b, bv.b, bbeta.b, bt, scratch},
                     ceil_div(static_cast<uint64_t>(dk + dv), kWuSlice) * static_cast<uint64_t>(Hv) * n_chunks));
    rp.n_seqs = u32(seqs.size() / 4);
    rp.si_off = s_in.off;
    rp.so_off = s_out.off;
    rp.has_state_in = has_in ? 1 : 0;
    rp.has_state_out = has_out ? 1 : 0;
    KEV_TRY(dispatch(kOp, kGdnRecur, &rp, sizeof rp, {bk.b, s_in.b, bt, scratch, s_out.b},
                     uint64_t{rp.n_slices} * Hv * rp.n_seqs));
    op.n_chunks = pp.n_chunks;
    op.chunk_base = pp.chunk_base;
    return dispatch(kOp, kGdnOut, &op, sizeof op, {bq.b, bt, scratch, bo.b}, uint64_t{op.n_slices} * Hv * n_chunks);
  };

  for (int64_t r0 = 0; r0 < R;) {
    if (static_cast<uint64_t>(chunks[r0]) > max_chunks) {  // segments of one long sequence
      const int64_t begin = layout.offsets[r0], len = layout.offsets[r0 + 1] - begin;
      const int64_t seg_tokens = static_cast<int64_t>(max_chunks) * kChunk;
      const int64_t n_segs = static_cast<int64_t>(ceil_div(len, seg_tokens));
      for (int64_t sg = 0; sg < n_segs; ++sg) {
        const bool from_state = sg > 0 || layout.from_prefix, last = sg + 1 == n_segs;
        Group g;
        g.add(begin + sg * seg_tokens, std::min(seg_tokens, len - sg * seg_tokens), from_state);
        const Bound& s_in = sg == 0 ? bs : carried[(sg - 1) % 2];
        const Bound& s_out = last ? bso : carried[sg % 2];
        KEV_TRY(run_group(g, s_in, from_state, s_out, last ? !state_out.empty() : true));
      }
      ++r0;
      continue;
    }
    Group g;
    int64_t r1 = r0;
    for (; r1 < R && static_cast<uint64_t>(chunks[r1]) <= max_chunks && g.n_chunks + chunks[r1] <= max_chunks; ++r1) {
      g.add(layout.offsets[r1], layout.offsets[r1 + 1] - layout.offsets[r1], layout.from_prefix);
    }
    KEV_TRY(run_group(g, bs, layout.from_prefix, bso, !state_out.empty()));
    r0 = r1;
  }
  return Status::success();
}

}  // namespace kev::webgpu
