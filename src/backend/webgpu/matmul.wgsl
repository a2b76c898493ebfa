// Dense projection: out[i, col0 + j] = Σ_l x[i,l] · w[j,l] (+ bias[col0 + j]), i.e. out = x · Wᵀ.
//
// Layout: x [n,k] F32 (row stride x_st: x may be a column slice), w [m,k] F32 contiguous (one piece
// of a weight split on row boundaries at upload: the piece's rows are output columns
// [col0, col0 + m)), bias [M] or a dummy, out [n, M] (row stride o_st).
// Four kernels; the dispatch (ops.cpp) takes `matmul_rows` for n ≤ 8, else `matmul_wide_split` where
// the weight's k is split (below), else `matmul` where the output's 128×128 tiles fill a large GPU,
// else `matmul_wide`.
// Workgroups are folded (linear index, tiles_m tiles per tile row, then the k pieces).
// - matmul: one 256-invocation workgroup (16×16) per 128×128 tile. Each invocation owns an 8×8
//   block — rows {4·ty..4·ty+3, 64+4·ty..+3}, columns {4·tx..4·tx+3, 64+4·tx..+3} — in 16 vec4 FP32
//   registers: per k it reads two vec4 of x and two of w from workgroup memory and issues 16 vec4
//   FMAs (64 FMAs per 4 shared loads). One x and one w tile [16][128] (2 × 8 KiB, the 16 KiB every
//   adapter offers), so two barriers per k step (tiles free before the store, stored before the
//   reads). A double-buffered version (32 KiB, one barrier per step) measured 13 TFLOP/s on the
//   H200 against this one's 24 at 4096³, so it was dropped.
// - matmul_wide_split: one 128-invocation workgroup (16×8) per 64-row × 128-column tile and k piece,
//   matmul's 8×8 blocks (rows {4·ty..+3, 32+4·ty..+3}) and k loop over an x tile [16][64] and a w
//   tile [16][128] (12 KiB). Half of matmul's workgroup: the long prefill's 2,187-row outputs waste
//   53 rows in their edge tiles instead of 117, and its m = 1,024 products spread over 2,240
//   workgroups (35 × 8 tiles × 8 pieces) instead of 1,152, four resident per multiprocessor
//   instead of two. H200 (2026-12-02, coordinator's round 1, `DISABLED_MatmulTiming` medians, two
//   alternated readings): 2,187 × 3,584 × 1,024 0.624 / 0.646 → 0.599 / 0.608 ms against the 128×128
//   split kernel, 2,187 × 2,048 × 1,024 0.403 / 0.409 → 0.380 / 0.383, and against the 64×64 one
//   250 × 3,584 × 1,024 0.116 / 0.113 → 0.106 / 0.107, 250 × 2,048 × 1,024 0.082 / 0.071 → 0.069 /
//   0.070, 222 × 3,584 × 1,024 0.115 / 0.113 → 0.113 / 0.105; round 2, the same shapes: 0.658 /
//   0.642 → 0.614 / 0.620, 0.427 / 0.411 → 0.384 / 0.380, 0.110 / 0.122 → 0.114 / 0.108, 0.072 /
//   0.082 → 0.079 / 0.069, 0.121 / 0.111 → 0.110 / 0.107. Dropped: using it only where the 128×128
//   one ran (64×64 tiles kept for n ≈ 250; round 1): 0.614 / 0.611, 0.385 / 0.383, 0.113 / 0.113,
//   0.072 / 0.071; and for the unsplit large outputs too (round 2, against `matmul`): 2,187 × 1,024 ×
//   7,168 1.121 / 1.163 → 1.218 / 1.238 ms, × 8,224 1.276 / 1.304 → 1.447 / 1.474, 4096³ 4.26 /
//   4.28 → 5.06 / 5.09 ms (32.2 → 27.1 TFLOP/s), long prefill 107.3 → 114.6 ms: where k is not split
//   and the 128×128 tiles fill the GPU, `matmul`'s larger tile wins.
// - matmul_wide: the unsplit outputs under `matmul`'s threshold (short's 250 / 220-row gate_up,
//   in_proj and k|v|q). 256 invocations (16×16) per 64-row × 128-column tile, a 4×8 block each —
//   rows 4·ty..+3, columns {4·tx..+3, 64+4·tx..+3}: 8 vec4 FMAs per three shared loads — over
//   matmul_wide_split's tile layout (x [16][16 quads], w [16][32 quads], 12 KiB), two barriers per
//   step. Until 2026-12-02 `matmul_small` ran these: 64×64 tiles, 4×4 blocks (4 vec4 FMAs per two
//   shared loads), two buffered pairs of [16][64] tiles (16 KiB), one barrier per step. H200
//   (2026-12-02, coordinator's round 3, main fa6fe5d → this; `DISABLED_MatmulTiming` medians):
//   250 × 1,024 × 7,168 0.202 → 0.196 ms; 250 × 1,024 × 8,224 0.202, × 5,120 0.189, 220 × 1,024 ×
//   7,168 0.190, × 8,224 0.201 (no old reading); 2,187 × 1,024 × 7,168 1.124 → 1.131 and 4096³
//   4.279 → 4.275 (`matmul`, unchanged). `kev_benchmark --workload short --runs 5 --warmups 2`,
//   two alternated readings: prefill + evaluation 36.66 / 35.77 → 35.98 / 35.93 ms (equal within
//   the spread); long (--runs 3 --warmups 1, one reading) prefill 107.66 → 106.24, cached
//   evaluation (195 rows, this kernel) 19.18 → 18.76. Dropped in the same run: the tile as
//   matmul_wide_split's 128 invocations with 8×8 blocks, unsplit: 250 × 1,024 × 7,168 0.235 ms,
//   × 8,224 0.221, × 5,120 0.215, 220 × 1,024 × 7,168 0.222; short 38.26 / 38.60 ms, long
//   cached evaluation 20.01 (likely too few warps to hide the loads: 224 workgroups of 4 warps
//   leave a multiprocessor 4 or 8 of them). At these rows the time barely follows m
//   (5,120 → 8,224 columns: 0.189 → 0.202 ms): the 160–260 workgroups are one wave, so a product
//   costs about one workgroup's 64-step k walk; a gain would have to shorten that walk, not change
//   the tile count.
// - matmul_rows: few rows (decode-like passes, readouts), where the cost is streaming w: one
//   128-invocation workgroup per 16 output columns (more of w in flight than any tiled kernel);
//   all invocations load a [16 columns × 128 k] slab of w (8 KiB) and x [8 × 128] per step, and
//   invocation (row lid / 16, column lid % 16) owns one output element, reading its x row and w
//   column as vec4 (4 FMAs per two 16-byte shared loads). 12.4 KiB of workgroup memory.
// The tiled ones walk k in steps of 16 with the tiles held transposed (k-major, rows in vec4 quads);
// quad q of k row kk is stored at column q ^ (kk & 7), so the 8 invocations of a 128-bit store
// wavefront (8 consecutive kk, one quad) hit 8 distinct 16-byte bank groups (unswizzled: one).
// Loader role of the tiled ones: invocation lid loads k offset lid % 16 of x quads and w quads
// (16 neighbours read 16 consecutive k of one row: 64-byte runs). Their compute-role row quad is
// masked to 0..15 (row_quad; 0..7 in matmul_wide_split), so every shared read index of the k loop is
// provably in range and needs no robustness clamp.
// All issue the next step's global loads before the current step's FMAs (register prefetch), so
// the load latency overlaps the arithmetic. The tiled ones' 16 k rows a step are written out
// (block8_k16, wide_k16), not looped. Measured on the H200 and dropped (2026-12-03): loads two steps
// ahead in matmul_wide and matmul_wide_split (two register sets: no gain, 220 × 1,024 × 7,168 0.21 →
// 0.23 ms); loads past the piece at a clamped k zeroed by a select instead of the branch in
// load_x / load_w (2,187 × 3,584 × 1,024 0.62 → 0.66–0.70 ms).
// Split-K: the host cuts k into `pieces` ranges of k_piece (a multiple of 16; the last one shorter)
// chosen from the weight's shape alone (ops.cpp). One dispatch of `matmul_wide_split` then covers
// every piece: workgroup lin computes tile lin % tiles over piece lin / tiles and stores the partial
// sums, without bias, to plane `piece` of the output binding (the host binds scratch planes there,
// o_off + piece · piece_stride) in its invocations' order (matmul_reduce.wgsl's layout: each store
// writes 128 consecutive floats; row-major planes took four stores per 16-byte run); matmul_reduce.wgsl
// adds the planes in piece order, then the bias. Those planes with the earlier 128×128 and 64×64 split
// kernels (same round as above): 2,187 × 3,584 × 1,024 0.620 / 0.599 ms, 2,187 × 2,048 × 1,024
// 0.407 / 0.387, but 250 × 3,584 × 1,024 0.120 / 0.121 and 222 × 3,584 × 1,024 0.120 / 0.121 (slower
// than row-major there). The unsplit entry points run their tile code over all of k with the piece
// fixed at compile time (k from 0, stored at o_off), as before split-K: with one entry point each
// reading its piece at run time, unsplit shapes and the 4096³ rate measured 2 % slower on the H200
// (docs/backends.md).
// matmul_rows walks all of k itself and folds at the same boundaries, in the same order.
// Each partial is accumulated in ascending k from its piece's start (zero-padded to a multiple of
// 16), one FMA per step from 0; the pieces are added in order (piece 0 + piece 1 + ...) and the bias
// last, in every entry point: results do not depend on n, on the row's position, or on the entry
// point picked. pieces = 1 (k_piece = k rounded up to 16) is the plain product.
// Preconditions: n ≥ 1 and m ≥ 1 (the dispatch skips empty outputs), n ≤ 8 for matmul_rows; edges
// are masked at the store (loads past an edge repeat the last row or column). Workgroup memory:
// each entry point fits the 16 KiB every adapter offers.

struct Params {
  n: u32, k: u32, m: u32, tiles_m: u32,
  x_off: u32, x_st: u32, w_off: u32, o_off: u32,
  o_st: u32, col0: u32, bias_off: u32, has_bias: u32,
  k_piece: u32, pieces: u32, piece_stride: u32, pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const KT: u32 = 16u;  // k step of the tiled entry points

// Tiles [KT][quads] swizzled: quad q of k row kk sits at kk * quads + (q ^ (kk & 7)).
var<workgroup> xs: array<vec4<f32>, 512>;          // matmul: 32 quads; the 64×128 tiles: 16
var<workgroup> ws: array<vec4<f32>, 512>;          // 32 quads

const ROWS_KT: u32 = 128u;  // matmul_rows: k step
const ROWS_Q: u32 = 33u;    // matmul_rows: vec4 per slab row, ROWS_KT / 4 + 1 (the pad staggers banks)
// matmul_rows: w slab [16 columns][ROWS_Q] and x [8 rows][ROWS_Q], k contiguous within a row, so a
// warp's stores (32 consecutive k of one row) and its 16-byte reads (16 columns at one k quad) are
// free of bank conflicts.
var<workgroup> ws_rows: array<vec4<f32>, 528>;
var<workgroup> xs_rows: array<vec4<f32>, 264>;

// A tiled workgroup's k piece: k in [k_lo, k_lo + k_len), partials stored from o_base.
struct Piece {
  k_lo: u32, k_len: u32, o_base: u32,
}

// Workgroup lin of a tiled dispatch over `tiles` output tiles per piece (the caller checked lin <
// tiles · pieces): its piece (its tile is lin % tiles).
fn piece_of(lin: u32, tiles: u32) -> Piece {
  let s = lin / tiles;
  let lo = s * p.k_piece;
  return Piece(lo, min(p.k_piece, p.k - lo), p.o_off + s * p.piece_stride);
}

// All of k in one piece, stored at o_off: the plain tiled entry points, and matmul_rows, which folds
// the pieces itself.
fn whole_k() -> Piece {
  return Piece(0u, p.k, p.o_off);
}

// The output's tiles of edge × edge (per k piece).
fn tile_count(edge: u32) -> u32 {
  return (p.n + edge - 1u) / edge * p.tiles_m;
}

// Rows r0..r0+3 of x at k = k_lo + l, zero past the piece. Rows past the edge read the last row (always in bounds)
// unmasked: an output element depends only on its own x row and w column, and the outputs of rows
// past the edge are never stored, so the four loads need no branches, vector indexing or selects.
fn load_x(pc: Piece, r0: u32, l: u32) -> vec4<f32> {
  if (l >= pc.k_len) {
    return vec4<f32>(0.0);
  }
  let last = p.n - 1u;
  let at = p.x_off + pc.k_lo + l;
  return vec4<f32>(x[at + min(r0, last) * p.x_st], x[at + min(r0 + 1u, last) * p.x_st],
                   x[at + min(r0 + 2u, last) * p.x_st], x[at + min(r0 + 3u, last) * p.x_st]);
}

// Rows (output columns) c0..c0+3 of the w piece at k = k_lo + l (rows of k floats), zero past the k
// piece; columns past the weight piece's edge read its last row (as load_x: their outputs are never
// stored).
fn load_w(pc: Piece, c0: u32, l: u32) -> vec4<f32> {
  if (l >= pc.k_len) {
    return vec4<f32>(0.0);
  }
  let last = p.m - 1u;
  let at = p.w_off + pc.k_lo + l;
  return vec4<f32>(w[at + min(c0, last) * p.k], w[at + min(c0 + 1u, last) * p.k],
                   w[at + min(c0 + 2u, last) * p.k], w[at + min(c0 + 3u, last) * p.k]);
}

// Columns c..c+3 of row r (bias added, edges masked) from o_base.
fn store4(o_base: u32, r: u32, c: u32, v: vec4<f32>) {
  if (r >= p.n) {
    return;
  }
  for (var j = 0u; j < 4u; j++) {
    if (c + j < p.m) {
      var y = v[j];
      if (p.has_bias != 0u) {
        y += bias[p.bias_off + p.col0 + c + j];
      }
      out[o_base + r * p.o_st + p.col0 + c + j] = y;
    }
  }
}

// Compute role of the tiled entry points: row quad lid / 16 of the tile, masked to 0..15 (a no-op for
// lid < 256) so that the shader compiler can prove every shared read index in the k loop (k row ·
// quads + (row quad ^ swizzle) + 16) within the tile and drop Dawn's robustness clamp (min with the
// array's last index) from each of them; the column quad lid % 16 is bounded already.
fn row_quad(lid: u32) -> u32 {
  return (lid / 16u) & 15u;
}

// matmul_wide_split's partial sums: a 4×4 quarter of invocation lid's block into its tile's run of
// a partial plane (matmul_reduce.wgsl's layout), value (row i, column e) at at + (4i + e) · 128 with
// `at` the quarter's start plus lid, so each store of the workgroup writes 128 consecutive floats.
fn store_part4(at: u32, a: Block4) {
  for (var e = 0u; e < 4u; e++) {
    out[at + e * 128u] = a.r0[e];
    out[at + (4u + e) * 128u] = a.r1[e];
    out[at + (8u + e) * 128u] = a.r2[e];
    out[at + (12u + e) * 128u] = a.r3[e];
  }
}

fn store_block4(o_base: u32, r: u32, c: u32, a: Block4) {
  store4(o_base, r, c, a.r0);
  store4(o_base, r + 1u, c, a.r1);
  store4(o_base, r + 2u, c, a.r2);
  store4(o_base, r + 3u, c, a.r3);
}

// The 8×8 block of matmul as four 4×4 quarters (rows lo/hi, columns lo/hi).
struct Block8 {
  ll: Block4, lh: Block4, hl: Block4, hh: Block4,
}

fn fma8(a: Block8, xa: vec4<f32>, xb: vec4<f32>, wa: vec4<f32>, wb: vec4<f32>) -> Block8 {
  return Block8(fma4(a.ll, xa, wa), fma4(a.lh, xa, wb), fma4(a.hl, xb, wa), fma4(a.hh, xb, wb));
}

// matmul's roles: the block an invocation owns and the quads it loads.
struct Tile128 {
  row0: u32, colt0: u32,
  ty: u32, tx: u32,                 // compute role: the 8×8 block
  q_load: u32, kk_load: u32,        // loader role: x and w quads q_load and q_load + 16
  st_lo: u32,                       // where the loader's low quads go in a tile (high: + 16)
}

fn tile128(tile: u32, lid: u32) -> Tile128 {
  let kk = lid % KT;
  let q = lid / KT;
  return Tile128((tile / p.tiles_m) * 128u, (tile % p.tiles_m) * 128u, row_quad(lid), lid % 16u, q, kk,
                 kk * 32u + (q ^ (kk & 7u)));
}

// The loader's four quads (x low, x high, w low, w high) at step k0.
struct Quads128 {
  x0: vec4<f32>, x1: vec4<f32>, w0: vec4<f32>, w1: vec4<f32>,
}

fn load128(pc: Piece, t: Tile128, k0: u32) -> Quads128 {
  let l = k0 + t.kk_load;
  return Quads128(load_x(pc, t.row0 + 4u * t.q_load, l), load_x(pc, t.row0 + 64u + 4u * t.q_load, l),
                  load_w(pc, t.colt0 + 4u * t.q_load, l), load_w(pc, t.colt0 + 64u + 4u * t.q_load, l));
}

fn store_block8(pc: Piece, t: Tile128, a: Block8) {
  let r_lo = t.row0 + 4u * t.ty;
  let c_lo = t.colt0 + 4u * t.tx;
  store_block4(pc.o_base, r_lo, c_lo, a.ll);
  store_block4(pc.o_base, r_lo, c_lo + 64u, a.lh);
  store_block4(pc.o_base, r_lo + 64u, c_lo, a.hl);
  store_block4(pc.o_base, r_lo + 64u, c_lo + 64u, a.hh);
}

// The quarters (ll, lh, hl, hh) of an 8×8 block one after the other.
fn store_part8(at: u32, a: Block8) {
  store_part4(at, a.ll);
  store_part4(at + 2048u, a.lh);
  store_part4(at + 4096u, a.hl);
  store_part4(at + 6144u, a.hh);
}

fn zero_block8() -> Block8 {
  return Block8(zero_block4(), zero_block4(), zero_block4(), zero_block4());
}

// k row kk of an 8×8 block's tiles (x rows of xq quads, its second row quad xoff further; w rows of
// 32 quads, the second column quad 16 further; both swizzled).
fn block8_kk(a: Block8, kk: u32, xq: u32, xoff: u32, ty: u32, tx: u32) -> Block8 {
  let s = kk & 7u;
  let xb = kk * xq + (ty ^ s);
  let wb = kk * 32u + (tx ^ s);
  return fma8(a, xs[xb], xs[xb + xoff], ws[wb], ws[wb + 16u]);
}

// A k step (KT = 16 rows) of an 8×8 block, written out: the H200's Vulkan compiler schedules these
// constant-index shared loads and FMAs better than the same steps as a loop (H200, 2026-12-03: 4096³
// 4.23–4.28 → 3.94–3.96 ms, 2,187 × 2,048 × 1,024 0.40–0.41 → 0.36; docs/backends.md).
fn block8_k16(a0: Block8, xq: u32, xoff: u32, ty: u32, tx: u32) -> Block8 {
  var a = block8_kk(a0, 0u, xq, xoff, ty, tx);
  a = block8_kk(a, 1u, xq, xoff, ty, tx);
  a = block8_kk(a, 2u, xq, xoff, ty, tx);
  a = block8_kk(a, 3u, xq, xoff, ty, tx);
  a = block8_kk(a, 4u, xq, xoff, ty, tx);
  a = block8_kk(a, 5u, xq, xoff, ty, tx);
  a = block8_kk(a, 6u, xq, xoff, ty, tx);
  a = block8_kk(a, 7u, xq, xoff, ty, tx);
  a = block8_kk(a, 8u, xq, xoff, ty, tx);
  a = block8_kk(a, 9u, xq, xoff, ty, tx);
  a = block8_kk(a, 10u, xq, xoff, ty, tx);
  a = block8_kk(a, 11u, xq, xoff, ty, tx);
  a = block8_kk(a, 12u, xq, xoff, ty, tx);
  a = block8_kk(a, 13u, xq, xoff, ty, tx);
  a = block8_kk(a, 14u, xq, xoff, ty, tx);
  return block8_kk(a, 15u, xq, xoff, ty, tx);
}

// matmul's workgroup: tile `tile` over piece pc.
fn matmul_tile(pc: Piece, tile: u32, lid: u32) {
  let t = tile128(tile, lid);
  var pre = load128(pc, t, 0u);
  var acc = zero_block8();
  for (var k0 = 0u; k0 < pc.k_len; k0 += KT) {
    xs[t.st_lo] = pre.x0;
    xs[t.st_lo + 16u] = pre.x1;
    ws[t.st_lo] = pre.w0;
    ws[t.st_lo + 16u] = pre.w1;
    workgroupBarrier();
    if (k0 + KT < pc.k_len) {
      pre = load128(pc, t, k0 + KT);
    }
    acc = block8_k16(acc, 32u, 16u, t.ty, t.tx);
    workgroupBarrier();
  }
  store_block8(pc, t, acc);
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  if (tile >= tile_count(128u)) {
    return;
  }
  matmul_tile(whole_k(), tile, lid);
}

// matmul_wide_split's workgroup (128 invocations, a 64-row × 128-column tile): the 8×8 block of
// invocation lid — rows {4·ty..+3, 32+4·ty..+3}, columns {4·tx..+3, 64+4·tx..+3} — over piece pc.
// x tile [16][16 quads] in xs, w tile [16][32 quads] in ws, swizzled as matmul's; the loader (k
// offset lid % 16, quad q = lid / 16) loads x quads q, q + 8 and w quads q, q + 8, q + 16, q + 24.
fn matmul_wide_tile(pc: Piece, tile: u32, lid: u32) -> Block8 {
  let row0 = (tile / p.tiles_m) * 64u;
  let colt0 = (tile % p.tiles_m) * 128u;
  let ty = (lid / 16u) & 7u;
  let tx = lid % 16u;
  let kk_load = lid % KT;
  let q = lid / KT;
  let sw = q ^ (kk_load & 7u);
  let stx = kk_load * 16u + sw;
  let stw = kk_load * 32u + sw;
  var px0 = load_x(pc, row0 + 4u * q, kk_load);
  var px1 = load_x(pc, row0 + 32u + 4u * q, kk_load);
  var pw0 = load_w(pc, colt0 + 4u * q, kk_load);
  var pw1 = load_w(pc, colt0 + 32u + 4u * q, kk_load);
  var pw2 = load_w(pc, colt0 + 64u + 4u * q, kk_load);
  var pw3 = load_w(pc, colt0 + 96u + 4u * q, kk_load);
  var acc = zero_block8();
  for (var k0 = 0u; k0 < pc.k_len; k0 += KT) {
    xs[stx] = px0;
    xs[stx + 8u] = px1;
    ws[stw] = pw0;
    ws[stw + 8u] = pw1;
    ws[stw + 16u] = pw2;
    ws[stw + 24u] = pw3;
    workgroupBarrier();
    if (k0 + KT < pc.k_len) {
      let l = k0 + KT + kk_load;
      px0 = load_x(pc, row0 + 4u * q, l);
      px1 = load_x(pc, row0 + 32u + 4u * q, l);
      pw0 = load_w(pc, colt0 + 4u * q, l);
      pw1 = load_w(pc, colt0 + 32u + 4u * q, l);
      pw2 = load_w(pc, colt0 + 64u + 4u * q, l);
      pw3 = load_w(pc, colt0 + 96u + 4u * q, l);
    }
    acc = block8_k16(acc, 16u, 8u, ty, tx);
    workgroupBarrier();
  }
  return acc;
}

// matmul_wide's accumulators: columns 4·tx..+3 (lo) and 64 + 4·tx..+3 (hi) of rows 4·ty..+3.
struct Wide {
  lo: Block4, hi: Block4,
}

// k row kk of matmul_wide's tiles: x quad ty, w quads tx and tx + 16 (swizzled).
fn wide_kk(a: Wide, kk: u32, ty: u32, tx: u32) -> Wide {
  let s = kk & 7u;
  let xv = xs[kk * 16u + (ty ^ s)];
  let wb = kk * 32u;
  return Wide(fma4(a.lo, xv, ws[wb + (tx ^ s)]), fma4(a.hi, xv, ws[wb + 16u + (tx ^ s)]));
}

// A k step of matmul_wide written out (see block8_k16).
fn wide_k16(a0: Wide, ty: u32, tx: u32) -> Wide {
  var a = wide_kk(a0, 0u, ty, tx);
  a = wide_kk(a, 1u, ty, tx);
  a = wide_kk(a, 2u, ty, tx);
  a = wide_kk(a, 3u, ty, tx);
  a = wide_kk(a, 4u, ty, tx);
  a = wide_kk(a, 5u, ty, tx);
  a = wide_kk(a, 6u, ty, tx);
  a = wide_kk(a, 7u, ty, tx);
  a = wide_kk(a, 8u, ty, tx);
  a = wide_kk(a, 9u, ty, tx);
  a = wide_kk(a, 10u, ty, tx);
  a = wide_kk(a, 11u, ty, tx);
  a = wide_kk(a, 12u, ty, tx);
  a = wide_kk(a, 13u, ty, tx);
  a = wide_kk(a, 14u, ty, tx);
  return wide_kk(a, 15u, ty, tx);
}

// matmul_wide's workgroup: invocation lid owns rows 4·ty..+3 (ty = lid / 16) and columns
// {4·tx..+3, 64+4·tx..+3} (tx = lid % 16) of a 64-row × 128-column tile; x tile [16][16 quads] in xs,
// w tile [16][32 quads] in ws (matmul_wide_tile's layout); the loader (k offset lid % 16, quad q =
// lid / 16) loads x quad q and w quads q, q + 16.
@compute @workgroup_size(256)
fn matmul_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  if (tile >= tile_count(64u)) {
    return;
  }
  let pc = whole_k();
  let row0 = (tile / p.tiles_m) * 64u;
  let colt0 = (tile % p.tiles_m) * 128u;
  let ty = row_quad(lid);
  let tx = lid % 16u;
  let kk_load = lid % KT;
  let q = lid / KT;
  let sw = q ^ (kk_load & 7u);
  let stx = kk_load * 16u + sw;
  let stw = kk_load * 32u + sw;
  var px = load_x(pc, row0 + 4u * q, kk_load);
  var pw0 = load_w(pc, colt0 + 4u * q, kk_load);
  var pw1 = load_w(pc, colt0 + 64u + 4u * q, kk_load);
  var acc = Wide(zero_block4(), zero_block4());
  for (var k0 = 0u; k0 < pc.k_len; k0 += KT) {
    xs[stx] = px;
    ws[stw] = pw0;
    ws[stw + 16u] = pw1;
    workgroupBarrier();
    if (k0 + KT < pc.k_len) {
      let l = k0 + KT + kk_load;
      px = load_x(pc, row0 + 4u * q, l);
      pw0 = load_w(pc, colt0 + 4u * q, l);
      pw1 = load_w(pc, colt0 + 64u + 4u * q, l);
    }
    acc = wide_k16(acc, ty, tx);
    workgroupBarrier();
  }
  store_block4(pc.o_base, row0 + 4u * ty, colt0 + 4u * tx, acc.lo);
  store_block4(pc.o_base, row0 + 4u * ty, colt0 + 64u + 4u * tx, acc.hi);
}

@compute @workgroup_size(128)
fn matmul_wide_split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
  let lin = linear_group(wid, nwg);
  let tiles = tile_count(64u);
  if (lin >= tiles * p.pieces) {
    return;
  }
  let tile = lin % tiles;
  let pc = piece_of(lin, tiles);
  store_part8(pc.o_base + tile * 8192u + lid, matmul_wide_tile(pc, tile, lid));
}

// matmul_rows: w columns (put_w_rows) or x rows (put_x_rows) c0..c0+3 at k = l of the step.
fn put_w_rows(l: u32, c0: u32, v: vec4<f32>) {
  let q = l / 4u;
  let e = l % 4u;
  ws_rows[c0 * ROWS_Q + q][e] = v.x;
  ws_rows[(c0 + 1u) * ROWS_Q + q][e] = v.y;
  ws_rows[(c0 + 2u) * ROWS_Q + q][e] = v.z;
  ws_rows[(c0 + 3u) * ROWS_Q + q][e] = v.w;
}

fn put_x_rows(l: u32, r0: u32, v: vec4<f32>) {
  let q = l / 4u;
  let e = l % 4u;
  xs_rows[r0 * ROWS_Q + q][e] = v.x;
  xs_rows[(r0 + 1u) * ROWS_Q + q][e] = v.y;
  xs_rows[(r0 + 2u) * ROWS_Q + q][e] = v.z;
  xs_rows[(r0 + 3u) * ROWS_Q + q][e] = v.w;
}

@compute @workgroup_size(128)
fn matmul_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  if (tile >= p.tiles_m) {
    return;
  }
  let colt0 = tile * 16u;
  let pc = whole_k();
  // Loader role: k offset lid of the step (128 neighbours read 128 consecutive k of one row:
  // 512-byte runs) for w rows colt0..colt0+15 and x rows 0..7, prefetched one step ahead: iteration
  // t stores step t-1's registers, loads step t and accumulates step t-1.
  var pw0 = vec4<f32>(0.0);
  var pw1 = vec4<f32>(0.0);
  var pw2 = vec4<f32>(0.0);
  var pw3 = vec4<f32>(0.0);
  var px0 = vec4<f32>(0.0);
  var px1 = vec4<f32>(0.0);
  // Compute role: one output element.
  let row = lid / 16u;
  let col = lid % 16u;
  var acc = 0.0;             // the current k piece
  var sum = 0.0;             // the pieces before it, added in order
  var next = p.k_piece;      // where the next piece starts (never reached when pieces = 1)
  for (var k0 = 0u; k0 < p.k + ROWS_KT; k0 += ROWS_KT) {
    if (k0 > 0u) {
      put_w_rows(lid, 0u, pw0);
      put_w_rows(lid, 4u, pw1);
      put_w_rows(lid, 8u, pw2);
      put_w_rows(lid, 12u, pw3);
      put_x_rows(lid, 0u, px0);
      put_x_rows(lid, 4u, px1);
    }
    workgroupBarrier();
    if (k0 < p.k) {
      pw0 = load_w(pc, colt0, k0 + lid);
      pw1 = load_w(pc, colt0 + 4u, k0 + lid);
      pw2 = load_w(pc, colt0 + 8u, k0 + lid);
      pw3 = load_w(pc, colt0 + 12u, k0 + lid);
      px0 = load_x(pc, 0u, k0 + lid);
      px1 = load_x(pc, 4u, k0 + lid);
    }
    if (k0 > 0u) {
      // Up to k rounded up to 16 (the zero-filled tail): the same FMAs as the tiled entry points,
      // so even the sign of a zero result agrees.
      let quads = min(ROWS_KT, ((p.k + 15u) & ~15u) - (k0 - ROWS_KT)) / 4u;
      for (var q = 0u; q < quads; q++) {
        if (k0 - ROWS_KT + 4u * q == next) {
          sum = select(acc, sum + acc, next > p.k_piece);
          acc = 0.0;
          next += p.k_piece;
        }
        let xv = xs_rows[row * ROWS_Q + q];
        let wv = ws_rows[col * ROWS_Q + q];
        acc = fma(xv.x, wv.x, acc);
        acc = fma(xv.y, wv.y, acc);
        acc = fma(xv.z, wv.z, acc);
        acc = fma(xv.w, wv.w, acc);
      }
    }
    workgroupBarrier();
  }
  let c = colt0 + col;
  if (row < p.n && c < p.m) {
    var y = select(acc, sum + acc, next > p.k_piece);
    if (p.has_bias != 0u) {
      y += bias[p.bias_off + p.col0 + c];
    }
    out[p.o_off + row * p.o_st + p.col0 + c] = y;
  }
}
