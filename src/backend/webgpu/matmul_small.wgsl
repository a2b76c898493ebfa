// Dense projection: out[i, col0 + j] = Σ_l x[i,l] · w[j,l] (+ bias[col0 + j]), i.e. out = x · Wᵀ.
//
// Layout: x [n,k] F32 (row stride x_st: x may be a column slice), w [m,k] F32 contiguous (one piece
// of a weight split on row boundaries at upload: the piece's rows are output columns
// [col0, col0 + m)), bias [M] or a dummy, out [n, M] (row stride o_st).
// Launch: 64×64 output tiles, one workgroup of 256 invocations per tile (folded, tiles_m tiles per
// tile row); k is walked in steps of 16 through workgroup memory (x and w tiles as vec4 quads, 8 KiB),
// each invocation accumulates a 4×4 block (four vec4 FMAs per k) in FP32 registers in ascending k
// (no split-k: a row's result does not depend on the other rows of the pass).

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

const TILE: u32 = 64u;
const KT: u32 = 16u;

// [KT][TILE/4]: element (kk, q) holds rows (or columns) 4q..4q+3 at k = k0 + kk.
var<workgroup> xs: array<vec4<f32>, 256>;
var<workgroup> ws: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let tile = linear_group(wid, nwg);
  let tiles_n = (p.n + TILE - 1u) / TILE;
  if (tile >= tiles_n * p.tiles_m) {
    return;
  }
  let row0 = (tile / p.tiles_m) * TILE;
  let colt0 = (tile % p.tiles_m) * TILE;
  let ty = lid / 16u;
  let tx = lid % 16u;
  // Loader role: k offset kk = lid % 16 (16 neighbours read 16 consecutive k of one row), quad lid / 16.
  let kk_load = lid % KT;
  let quad = lid / KT;
  var acc: array<vec4<f32>, 4>;
  for (var k0 = 0u; k0 < p.k; k0 += KT) {
    let l = k0 + kk_load;
    var xv = vec4<f32>(0.0);
    var wv = vec4<f32>(0.0);
    if (l < p.k) {
      for (var i = 0u; i < 4u; i++) {
        let r = row0 + quad * 4u + i;
        if (r < p.n) {
          xv[i] = x[p.x_off + r * p.x_st + l];
        }
        let c = colt0 + quad * 4u + i;
        if (c < p.m) {
          wv[i] = w[p.w_off + c * p.k + l];
        }
      }
    }
    xs[kk_load * 16u + quad] = xv;
    ws[kk_load * 16u + quad] = wv;
    workgroupBarrier();
    for (var kk = 0u; kk < KT; kk++) {
      let a = xs[kk * 16u + ty];
      let b = ws[kk * 16u + tx];
      acc[0] = fma(vec4<f32>(a.x), b, acc[0]);
      acc[1] = fma(vec4<f32>(a.y), b, acc[1]);
      acc[2] = fma(vec4<f32>(a.z), b, acc[2]);
      acc[3] = fma(vec4<f32>(a.w), b, acc[3]);
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let r = row0 + ty * 4u + i;
    for (var j = 0u; j < 4u; j++) {
      let c = colt0 + tx * 4u + j;
      if (r < p.n && c < p.m) {
        var v = acc[i][j];
        if (p.has_bias != 0u) {
          v += bias[p.bias_off + p.col0 + c];
        }
        out[p.o_off + r * p.o_st + p.col0 + c] = v;
      }
    }
  }
}
