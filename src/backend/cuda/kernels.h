// Launchers of the CUDA backend's own kernels (the .cu file of each family documents its math, layout
// and launch shape). Plain C++ so the backend's .cpp files can call them; every launcher enqueues on
// `stream` and returns cudaGetLastError() after its launches. Launch configurations depend only on
// shapes, n_tokens and n_seqs (and on pointer alignment, which a recorded pass's signature pins), never
// on the values of ids or offsets, so a captured graph stays valid for new inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kev::cuda {

// The innermost rows of a strided tensor of rank 1..4: row r (row-major over the outer dims) starts at
// element offset Σ idx_i · stride[i].
struct Rows {
  int n_outer = 0;  // rank - 1
  int64_t shape[3] = {1, 1, 1};
  int64_t stride[3] = {0, 0, 0};
  int64_t count() const { return shape[0] * shape[1] * shape[2]; }
};

// gather.cu. src F32 or BF16 rows [V, d] (row stride src_stride); out[i,:] = src[ids[i],:] as F32.
cudaError_t launch_gather_rows(const void* src, bool src_bf16, int64_t V, int64_t src_stride, const int32_t* ids,
                               int64_t n, int64_t d, float* out, int64_t out_stride, cudaStream_t stream);

// The most k slices of a k-split matmul (matmul.h, GemmShape::splits; its planes are read by
// launch_planes_sum_rows and by add_rms_norm through NormArgs::z_planes).
constexpr int kMaxKSplits = 4;

// norms.cu. Row-wise over d = innermost length.
enum class NormKind { Rms, L2, RmsGated, AddRms };
struct NormArgs {
  NormKind kind = NormKind::Rms;
  const float* x = nullptr;  // rms/l2/add_rms: x; gated: o
  Rows x_rows;
  const float* z = nullptr;  // gated: z; add_rms: y
  Rows z_rows;
  // add_rms: y as the F16-weight matmul recorded right before left it, its rows still to be multiplied
  // by these row scales ([rows], f16_rows.cuh); the kernel uses y · scale and writes that back into y
  // (z) where the scale is not 1. Null: y as is.
  const float* z_scales = nullptr;
  // add_rms with z_scales: y as the planes of a k-split matmul (matmul.h, GemmShape::splits), z_planes
  // [z_n_planes, rows, d] contiguous; the kernel adds them in plane order, rescales the sum and writes it
  // into y (z), as launch_planes_sum_rows would. Only on the row kernel (norm_takes_planes). Null: none.
  const float* z_planes = nullptr;
  int z_n_planes = 0;
  float* sum = nullptr;      // add_rms: receives x + y (rows x_rows); the op passes x itself (in place)
  const float* w = nullptr;  // rms/add_rms: gain 1 + w; gated: gain w; l2: unused
  float* out = nullptr;
  Rows out_rows;
  int64_t d = 0;
  float eps = 0.0f, scale = 1.0f;
  // Optional FP16 copy of out for the F16-weight matmul recorded right after the norm (f16_rows.cuh's
  // rule, bit-identical to launch_f32_to_f16_rows_scaled of out): each half_group consecutive rows of
  // out form one GEMM row of half_group·d values; half [rows / half_group, half_group·d] contiguous,
  // half_scales [rows / half_group]. Null: none.
  uint16_t* half = nullptr;
  float* half_scales = nullptr;
  int half_group = 1;
  // With half: false when only the copy is read after (the backend's next_op_is_last_reader). The
  // kernels then leave out unwritten where they make the copy from registers: the wide-row kernel in
  // every pass, the warp-per-row ones (the last chunk of each row) in passes under
  // kOptimisticMinGemmRows GEMM rows; longer passes' warp-per-row kernels store it for their fix-up.
  bool store_out = true;
};
cudaError_t launch_norm(const NormArgs& a, cudaStream_t stream);
// Whether launch_norm can write a's half copy (float4 paths, half_group dividing the rows, at most 32).
bool norm_writes_half(const NormArgs& a);
// Whether launch_norm can read a's y from z_planes (add_rms_norm on the wide-row kernel).
bool norm_takes_planes(const NormArgs& a);

// elementwise.cu: beta = σ(b), g = −exp(a_log)·softplus(a + dt_bias); b, a, beta, g [n, Hv] with row
// strides, a_log and dt_bias [Hv].
struct GatesArgs {
  const float* b = nullptr;
  int64_t b_stride = 0;
  const float* a = nullptr;
  int64_t a_stride = 0;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
  float* beta = nullptr;
  int64_t beta_stride = 0;
  float* g = nullptr;
  int64_t g_stride = 0;
  int64_t n = 0, Hv = 0;
};
cudaError_t launch_gdn_gates(const GatesArgs& a, cudaStream_t stream);

// norms.cu: a Gated DeltaNet layer's small ops before the delta rule (its q and k l2 norms, its gates)
// in one launch when they are recorded back to back and independent of each other: up to two l2 norms,
// each computed exactly as launch_norm computes it (float4 path, no half copy), and the gates (n = 0:
// none) exactly as launch_gdn_gates computes them.
struct GdnPrepArgs {
  NormArgs norms[2];
  int n_norms = 0;
  GatesArgs gates;
};
// Whether launch_gdn_prep takes these ops (every norm an l2 norm on launch_norm's float4 path without
// a half copy; the grid within limits).
bool gdn_prep_fusable(const GdnPrepArgs& a);
cudaError_t launch_gdn_prep(const GdnPrepArgs& a, cudaStream_t stream);

// elementwise.cu. Binary maps and copy index the flattened [rows, d] space with 32 bits, so they take
// fewer than kMaxElementwise elements (a launch with more returns cudaErrorInvalidValue).
constexpr int64_t kMaxElementwise = (int64_t{1} << 32) - 256;
enum class BinaryKind { SigmoidMul, Swiglu, Add };
// in_scales (null: none): x and y as the F16-weight matmul recorded right before left them (swiglu's gate
// and up, the halves of one GEMM row), their row r still to be multiplied by in_scales[r] (f16_rows.cuh);
// the kernels use x · s and y · s and write those back into x and y where s is not 1.
cudaError_t launch_binary(BinaryKind kind, const float* x, const Rows& xr, const float* y, const Rows& yr,
                          const float* in_scales, float* out, const Rows& outr, int64_t d, cudaStream_t stream);
// launch_binary that also writes out's FP16 copy for the F16-weight matmul recorded right after it (as
// NormArgs::half): each `group` consecutive rows of out form one GEMM row; half [rows / group, group·d]
// contiguous, scales [rows / group]. Only where binary_writes_half holds (float4 access, group divides
// the rows, the flattened index within 32 bits). A pass of kOptimisticMinGemmRows GEMM rows or more
// takes three launches: the scales zeroed, the map writing the copy optimistically,
// launch_f16_rows_fixup (f16_rows.cuh); a shorter one a block per GEMM row. Without store_out, out is
// left unwritten (all of it, or all but the chunks a long row's block reads back): the copy is made
// from registers, and the fix-up maps x and y again.
bool binary_writes_half(const float* x, const Rows& xr, const float* y, const Rows& yr, const float* out,
                        const Rows& outr, int64_t d, int group);
cudaError_t launch_binary_half(BinaryKind kind, const float* x, const Rows& xr, const float* y, const Rows& yr,
                               const float* in_scales, float* out, const Rows& outr, int64_t d, uint16_t* half,
                               float* scales, int group, bool store_out, cudaStream_t stream);
// The end of an optimistic FP16 copy (f16_rows.cuh): scales[r] holds the max |value| of GEMM row r
// (group consecutive rows of out, d % 4 == 0, float4-aligned) and becomes its scale; the rows whose
// scale is not 1 are converted again from out into half [rows / group, group·d].
cudaError_t launch_f16_rows_fixup(const float* out, const Rows& outr, int64_t d, int group, uint16_t* half,
                                  float* scales, cudaStream_t stream);
// out = x with F32/BF16 on either side (BF16 rounds to nearest even, NaN kept quiet).
cudaError_t launch_copy(const void* x, bool x_bf16, const Rows& xr, void* out, bool out_bf16, const Rows& outr,
                        int64_t d, cudaStream_t stream);
// out [n, m] (row stride ld): out[i, j] += bias[j], or with `overwrite` out[i, j] = bias[j] (0 when
// bias is null; matmul with k = 0).
cudaError_t launch_bias_rows(float* out, int64_t ld, const float* bias, bool overwrite, int64_t n, int64_t m,
                             cudaStream_t stream);
// trace_gate.cu. Holds `stream` until the (mapped host) word reaches `value`; tracing only.
cudaError_t launch_wait_gate(const uint32_t* word, uint32_t value, cudaStream_t stream);
// Launch-free check that this binary holds code for the current device (cudaErrorNoKernelImageForDevice
// otherwise).
cudaError_t probe_kernel_image();

// matmul input conversion (elementwise.cu): dst[n, k] BF16 contiguous = round(x[n, k]) (row stride ldx);
// with `split`, dst[2n, k] holds hi = round(x) in rows [0, n) and lo = round(x − hi) in rows [n, 2n).
cudaError_t launch_f32_to_bf16_rows(const float* x, int64_t ldx, uint16_t* dst, int64_t n, int64_t k, bool split,
                                    cudaStream_t stream);
// matmul input conversion for F16 weights (elementwise.cu): dst[n, k] F16 contiguous = round(x[i, :] / s_i)
// with s_i a power of two (1 unless max|x[i, :]| is outside [2^-10, 2^15]); scales[n] = s_i.
cudaError_t launch_f32_to_f16_rows_scaled(const float* x, int64_t ldx, uint16_t* dst, float* scales, int64_t n,
                                          int64_t k, cudaStream_t stream);
// out[i, :] (row stride ldo) = out[i, :] · scales[i] (+ bias): the GEMM on scaled F16 inputs, rescaled
// (skipped without bias where the op recorded next takes the scales: NormArgs::z_scales, launch_binary).
cudaError_t launch_scale_bias_rows(float* out, int64_t ldo, const float* scales, const float* bias, int64_t n, int64_t m,
                                   cudaStream_t stream);
// out[i, :] (row stride ldo) = (planes[0][i, :] + planes[1][i, :] + ...) · scales[i] (+ bias), the planes
// [n_planes, n, m] contiguous and added in order: a k-split GEMM's (matmul.h, GemmShape::splits), or a
// split-input GEMM's hi and lo halves [2n, m] (scales null: 1).
cudaError_t launch_planes_sum_rows(const float* planes, int n_planes, int64_t n, int64_t m, const float* scales,
                                   const float* bias, float* out, int64_t ldo, cudaStream_t stream);

// causal_conv1d.cu. prefix (= state_in or null), state_out optional (single sequence).
struct ConvArgs {
  const float* x = nullptr;
  int64_t x_stride = 0;
  const float* w = nullptr;       // [C, K]
  const float* prefix = nullptr;  // [C, K] or null (zeros)
  float* out = nullptr;
  int64_t out_stride = 0;
  float* state_out = nullptr;       // [C, K] or null
  const int32_t* offsets = nullptr;  // device [n_seqs + 1]
  int64_t n_tokens = 0, C = 0, K = 0;
  int n_seqs = 0;
};
cudaError_t launch_causal_conv1d_silu(const ConvArgs& a, cudaStream_t stream);
// Conv commands joined into one launch (cuda_backend.cpp): a conv, or two whose second continues the
// first's rows from its final state (seg[1]: x and out rows right after seg[0]'s in the same views,
// prefix = seg[0].state_out, no state_out; seg[0]'s prefix, if any, apart from its state_out, which is
// written first: a fused state + score pass's state and question rows), and the Gated DeltaNet prep
// recorded right after them (a launch_gdn_prep's ops, whose norms read the conv's out): one launch and
// the conv state's, the bits of the separate ones. Takes them when every segment runs 4-token runs on
// the float4 path and, with norms, C % 128 == 0 and each norm is an l2 norm without a half copy over
// all rows of [n, H, 128] heads in 128-aligned, disjoint column ranges of out (x = seg[0].out + col0,
// strides out_stride and 128), writing [n, H, 128] float4-aligned rows.
struct ConvJoin {
  ConvArgs seg[2];
  int n_segs = 1;
};
bool conv_prep_fusable(const ConvJoin& c, const GdnPrepArgs& p);
cudaError_t launch_causal_conv1d_silu_joined(const ConvJoin& c, const GdnPrepArgs& p, cudaStream_t stream);

// rope.cu. x [n, H, hd] with token stride xs0 and head stride xs1, in place on dims [0, n_rot).
struct RopeArgs {
  float* x = nullptr;
  int64_t stride_token = 0, stride_head = 0;
  int64_t n_tokens = 0, H = 0;
  int64_t n_rot = 0;
  double theta = 0.0;
  int64_t pos0 = 0;
  const int32_t* offsets = nullptr;  // device [n_seqs + 1]
  int n_seqs = 0;
};
cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream);
// norms.cu. An rms_norm whose out is the [n, H, d] x of the rope recorded right after it, as one launch
// with the bits of the two: norm_rope_fusable says whether it takes them (warp-per-row float4 path
// without a half copy, d <= 256, n_rot a multiple of 8 up to 128, rope over exactly the norm's out).
bool norm_rope_fusable(const NormArgs& norm, const RopeArgs& rope);
cudaError_t launch_norm_rope(const NormArgs& norm, const RopeArgs& rope, cudaStream_t stream);

// pointer_head.cu. out[j] = (kappa[j] · u[question[j]]) · scale.
cudaError_t launch_pointer_logits(const float* u, int64_t u_stride, int64_t Q, const float* kappa,
                                  int64_t kappa_stride, const int32_t* question, int64_t M, int64_t P, float scale,
                                  float* out, cudaStream_t stream);

}  // namespace kev::cuda
