// Dense projection: out[i, col0 + j] = Σ_l x[i,l] · w[j,l] (+ bias[col0 + j]), i.e. out = x · Wᵀ.
//
// Layout: x [n,k] F32 (row stride x_st: x may be a column slice), w [m,k] F32 contiguous (one piece
// of a weight split on row boundaries at upload: the piece's rows are output columns
// [col0, col0 + m)), bias [M] or a dummy, out [n, M] (row stride o_st).
// Three entry points; the dispatch takes `matmul_rows` for n ≤ 8, else `matmul` where the output has
// enough 128×128 tiles to fill a large GPU, else `matmul_small`. Workgroups are folded (linear index,
// tiles_m tiles per tile row).
// - matmul: one 256-invocation workgroup (16×16) per 128×128 tile. Each invocation owns an 8×8
//   block — rows {4·ty..4·ty+3, 64+4·ty..+3}, columns {4·tx..4·tx+3, 64+4·tx..+3} — in 16 vec4 FP32
//   registers: per k it reads two vec4 of x and two of w from workgroup memory and issues 16 vec4
//   FMAs (64 FMAs per 4 shared loads). x and w tiles [16][128]: 2 × 8 KiB = 16 KiB of workgroup
//   memory (the minimum every adapter offers).
// - matmul_small: the same with 64×64 tiles, a 4×4 block per invocation (4 vec4 FMAs per k), 8 KiB.
// - matmul_rows: few rows (decode-like passes, readouts), where the cost is streaming w: one
//   128-invocation workgroup per 16 output columns (4× the workgroups of matmul_small, so more of w
//   is in flight); all invocations load a [16 columns × 128 k] slab of w (8 KiB) and x [8 × 128]
//   per step, and invocation (row lid / 16, column lid % 16) owns one output element, reading its x
//   row and w column as vec4 (4 FMAs per two 16-byte shared loads). 12.4 KiB of workgroup memory.
// The tiled two walk k in steps of 16 with the tiles held transposed (k-major, rows in vec4 quads);
// quad q of k row kk is stored at column q ^ (kk & 7), so the 8 invocations of a 128-bit store
// wavefront (8 consecutive kk, one quad) hit 8 distinct 16-byte bank groups (unswizzled: one).
// All three issue the next step's global loads before the current step's FMAs (register prefetch):
// two barriers per step, and the load latency overlaps the arithmetic.
// Each output element is accumulated in ascending k (zero-padded to a multiple of 16), one FMA per
// step from 0, bias last, in every entry point: results do not depend on n, on the row's position,
// or on the entry point picked.
// Preconditions: n ≥ 1 and m ≥ 1 (the dispatch skips empty outputs), n ≤ 8 for matmul_rows; edges
// are masked.

struct Params {
  n: u32, k: u32, m: u32, tiles_m: u32,
  x_off: u32, x_st: u32, w_off: u32, o_off: u32,
  o_st: u32, col0: u32, bias_off: u32, has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const KT: u32 = 16u;  // k step

// [KT][quads] swizzled: quad q of k row kk sits at kk * quads + (q ^ (kk & 7)).
var<workgroup> xs: array<vec4<f32>, 512>;        // matmul: 32 quads
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs_small: array<vec4<f32>, 256>;  // matmul_small: 16 quads
var<workgroup> ws_small: array<vec4<f32>, 256>;

const ROWS_KT: u32 = 128u;  // matmul_rows: k step
const ROWS_Q: u32 = 33u;    // matmul_rows: vec4 per slab row, ROWS_KT / 4 + 1 (the pad staggers banks)
// matmul_rows: w slab [16 columns][ROWS_Q] and x [8 rows][ROWS_Q], k contiguous within a row, so a
// warp's stores (32 consecutive k of one row) and its 16-byte reads (16 columns at one k quad) are
// free of bank conflicts.
var<workgroup> ws_rows: array<vec4<f32>, 528>;
var<workgroup> xs_rows: array<vec4<f32>, 264>;

// Rows r0..r0+3 of x at k = l, zero outside the matrix. Rows past the edge read the last row
// (always in bounds) and are masked, so the four loads need no branches or vector indexing.
fn load_x(r0: u32, l: u32) -> vec4<f32> {
  if (l >= p.k) {
    return vec4<f32>(0.0);
  }
  let last = p.n - 1u;
  let at = p.x_off + l;
  let v = vec4<f32>(x[at + min(r0, last) * p.x_st], x[at + min(r0 + 1u, last) * p.x_st],
                    x[at + min(r0 + 2u, last) * p.x_st], x[at + min(r0 + 3u, last) * p.x_st]);
  return select(vec4<f32>(0.0), v, vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u) < vec4<u32>(p.n));
}

// Rows (output columns) c0..c0+3 of the w piece at k = l, zero outside the piece (as load_x).
fn load_w(c0: u32, l: u32) -> vec4<f32> {
  if (l >= p.k) {
    return vec4<f32>(0.0);
  }
  let last = p.m - 1u;
  let at = p.w_off + l;
  let v = vec4<f32>(w[at + min(c0, last) * p.k], w[at + min(c0 + 1u, last) * p.k],
                    w[at + min(c0 + 2u, last) * p.k], w[at + min(c0 + 3u, last) * p.k]);
  return select(vec4<f32>(0.0), v, vec4<u32>(c0, c0 + 1u, c0 + 2u, c0 + 3u) < vec4<u32>(p.m));
}

// Columns c..c+3 of row r (bias added, edges masked).
fn store4(r: u32, c: u32, v: vec4<f32>) {
  if (r >= p.n) {
    return;
  }
  for (var j = 0u; j < 4u; j++) {
    if (c + j < p.m) {
      var y = v[j];
      if (p.has_bias != 0u) {
        y += bias[p.bias_off + p.col0 + c + j];
      }
      out[p.o_off + r * p.o_st + p.col0 + c + j] = y;
    }
  }
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  if (tile >= (p.n + 127u) / 128u * p.tiles_m) {
    return;
  }
  let row0 = (tile / p.tiles_m) * 128u;
  let colt0 = (tile % p.tiles_m) * 128u;
  let ty = lid / 16u;
  let tx = lid % 16u;
  // Loader role: k offset kk = lid % 16 (16 neighbours read 16 consecutive k of one row: 64-byte
  // runs), quads q and q + 16 with q = lid / 16.
  let kk_load = lid % KT;
  let q_load = lid / KT;
  let st_lo = kk_load * 32u + (q_load ^ (kk_load & 7u));
  let st_hi = st_lo + 16u;

  var px0 = load_x(row0 + 4u * q_load, kk_load);
  var px1 = load_x(row0 + 64u + 4u * q_load, kk_load);
  var pw0 = load_w(colt0 + 4u * q_load, kk_load);
  var pw1 = load_w(colt0 + 64u + 4u * q_load, kk_load);

  // Accumulators: aR_lo / aR_hi hold row R of the 8×8 block, columns 4·tx.. and 64+4·tx..
  var a0l = vec4<f32>(0.0); var a0h = vec4<f32>(0.0);
  var a1l = vec4<f32>(0.0); var a1h = vec4<f32>(0.0);
  var a2l = vec4<f32>(0.0); var a2h = vec4<f32>(0.0);
  var a3l = vec4<f32>(0.0); var a3h = vec4<f32>(0.0);
  var a4l = vec4<f32>(0.0); var a4h = vec4<f32>(0.0);
  var a5l = vec4<f32>(0.0); var a5h = vec4<f32>(0.0);
  var a6l = vec4<f32>(0.0); var a6h = vec4<f32>(0.0);
  var a7l = vec4<f32>(0.0); var a7h = vec4<f32>(0.0);

  for (var k0 = 0u; k0 < p.k; k0 += KT) {
    xs[st_lo] = px0;
    xs[st_hi] = px1;
    ws[st_lo] = pw0;
    ws[st_hi] = pw1;
    workgroupBarrier();
    let kn = k0 + KT + kk_load;
    if (k0 + KT < p.k) {
      px0 = load_x(row0 + 4u * q_load, kn);
      px1 = load_x(row0 + 64u + 4u * q_load, kn);
      pw0 = load_w(colt0 + 4u * q_load, kn);
      pw1 = load_w(colt0 + 64u + 4u * q_load, kn);
    }
    for (var kk = 0u; kk < KT; kk++) {
      let s = kk & 7u;
      let base = kk * 32u;
      let xa = xs[base + (ty ^ s)];
      let xb = xs[base + 16u + (ty ^ s)];
      let wa = ws[base + (tx ^ s)];
      let wb = ws[base + 16u + (tx ^ s)];
      a0l = fma(vec4<f32>(xa.x), wa, a0l); a0h = fma(vec4<f32>(xa.x), wb, a0h);
      a1l = fma(vec4<f32>(xa.y), wa, a1l); a1h = fma(vec4<f32>(xa.y), wb, a1h);
      a2l = fma(vec4<f32>(xa.z), wa, a2l); a2h = fma(vec4<f32>(xa.z), wb, a2h);
      a3l = fma(vec4<f32>(xa.w), wa, a3l); a3h = fma(vec4<f32>(xa.w), wb, a3h);
      a4l = fma(vec4<f32>(xb.x), wa, a4l); a4h = fma(vec4<f32>(xb.x), wb, a4h);
      a5l = fma(vec4<f32>(xb.y), wa, a5l); a5h = fma(vec4<f32>(xb.y), wb, a5h);
      a6l = fma(vec4<f32>(xb.z), wa, a6l); a6h = fma(vec4<f32>(xb.z), wb, a6h);
      a7l = fma(vec4<f32>(xb.w), wa, a7l); a7h = fma(vec4<f32>(xb.w), wb, a7h);
    }
    workgroupBarrier();
  }

  let r_lo = row0 + 4u * ty;
  let r_hi = row0 + 64u + 4u * ty;
  let c_lo = colt0 + 4u * tx;
  let c_hi = colt0 + 64u + 4u * tx;
  store4(r_lo, c_lo, a0l); store4(r_lo, c_hi, a0h);
  store4(r_lo + 1u, c_lo, a1l); store4(r_lo + 1u, c_hi, a1h);
  store4(r_lo + 2u, c_lo, a2l); store4(r_lo + 2u, c_hi, a2h);
  store4(r_lo + 3u, c_lo, a3l); store4(r_lo + 3u, c_hi, a3h);
  store4(r_hi, c_lo, a4l); store4(r_hi, c_hi, a4h);
  store4(r_hi + 1u, c_lo, a5l); store4(r_hi + 1u, c_hi, a5h);
  store4(r_hi + 2u, c_lo, a6l); store4(r_hi + 2u, c_hi, a6h);
  store4(r_hi + 3u, c_lo, a7l); store4(r_hi + 3u, c_hi, a7h);
}

@compute @workgroup_size(256)
fn matmul_small(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  if (tile >= (p.n + 63u) / 64u * p.tiles_m) {
    return;
  }
  let row0 = (tile / p.tiles_m) * 64u;
  let colt0 = (tile % p.tiles_m) * 64u;
  let ty = lid / 16u;
  let tx = lid % 16u;
  // Loader role: k offset kk = lid % 16, quad q = lid / 16 of x and of w.
  let kk_load = lid % KT;
  let q_load = lid / KT;
  let st = kk_load * 16u + (q_load ^ (kk_load & 7u));

  var px = load_x(row0 + 4u * q_load, kk_load);
  var pw = load_w(colt0 + 4u * q_load, kk_load);
  var a0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);

  for (var k0 = 0u; k0 < p.k; k0 += KT) {
    xs_small[st] = px;
    ws_small[st] = pw;
    workgroupBarrier();
    if (k0 + KT < p.k) {
      px = load_x(row0 + 4u * q_load, k0 + KT + kk_load);
      pw = load_w(colt0 + 4u * q_load, k0 + KT + kk_load);
    }
    for (var kk = 0u; kk < KT; kk++) {
      let s = kk & 7u;
      let xa = xs_small[kk * 16u + (ty ^ s)];
      let wa = ws_small[kk * 16u + (tx ^ s)];
      a0 = fma(vec4<f32>(xa.x), wa, a0);
      a1 = fma(vec4<f32>(xa.y), wa, a1);
      a2 = fma(vec4<f32>(xa.z), wa, a2);
      a3 = fma(vec4<f32>(xa.w), wa, a3);
    }
    workgroupBarrier();
  }

  let r = row0 + 4u * ty;
  let c = colt0 + 4u * tx;
  store4(r, c, a0);
  store4(r + 1u, c, a1);
  store4(r + 2u, c, a2);
  store4(r + 3u, c, a3);
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
  var acc = 0.0;
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
      pw0 = load_w(colt0, k0 + lid);
      pw1 = load_w(colt0 + 4u, k0 + lid);
      pw2 = load_w(colt0 + 8u, k0 + lid);
      pw3 = load_w(colt0 + 12u, k0 + lid);
      px0 = load_x(0u, k0 + lid);
      px1 = load_x(4u, k0 + lid);
    }
    if (k0 > 0u) {
      // Up to k rounded up to 16 (the zero-filled tail): the same FMAs as the tiled entry points,
      // so even the sign of a zero result agrees.
      let quads = min(ROWS_KT, ((p.k + 15u) & ~15u) - (k0 - ROWS_KT)) / 4u;
      for (var q = 0u; q < quads; q++) {
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
    var y = acc;
    if (p.has_bias != 0u) {
      y += bias[p.bias_off + p.col0 + c];
    }
    out[p.o_off + row * p.o_st + p.col0 + c] = y;
  }
}
