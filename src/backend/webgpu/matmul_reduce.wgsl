// Split-K sum of matmul.wgsl's `matmul_wide_split`:
//   out[i, col0 + j] = ((P_0[i,j] + P_1[i,j]) + ... + P_{S-1}[i,j]) (+ bias[col0 + j]),
// the k pieces' partials added in piece order and the bias last — the order in which matmul_rows folds
// its pieces, so a row's bits do not depend on the entry point that computed it.
// Layout: partial planes P [S][plane] contiguous from the start of their binding (scratch), bias [M]
// or a dummy, out [n, M] (row stride o_st; the weight piece's columns start at col0). A plane holds
// the split kernel's 64-row × 128-column tiles (tiles_m per tile row, edge tiles whole) in the order
// its invocations store them: invocation t (of 128) owns rows 4·(t / 16) + i and 32 + 4·(t / 16) + i,
// columns 4·(t % 16) + e and 64 + 4·(t % 16) + e, four 4×4 quarters q (rows low/high, columns low/
// high: 2·row half + column half), and value (q, i, e) sits at tile · 8192 + ((4q + i) · 4 + e) · 128
// + t: each store of the split kernel writes 128 consecutive floats (a row-major plane took four
// stores per 16-byte run and measured slower at n = 2,187, docs/backends.md).
// Launch: one invocation per (tile, q, i, t): 4 values of one row (4 coalesced loads a piece), 256 per
// workgroup, folded. An invocation issues the loads of up to 8 pieces before adding them (past the last
// piece it reloads the last one, unused), so it waits out about pieces / 8 memory latencies rather than
// one per piece; the adds keep their order.

struct Params {
  n: u32, m: u32, pieces: u32, o_off: u32,
  o_st: u32, col0: u32, bias_off: u32, has_bias: u32,
  plane: u32, tiles_m: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// The 4 values (e = 0..3) of piece s from plane offset at.
fn load_part(s: u32, at: u32) -> vec4<f32> {
  let b = s * p.plane + at;
  return vec4<f32>(part[b], part[b + 128u], part[b + 256u], part[b + 384u]);
}

@compute @workgroup_size(256)
fn matmul_reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let g = linear_group(wid, nwg) * 256u + lid;
  let tile = g / 2048u;  // 2,048 invocations per tile
  if (tile >= p.plane / 8192u) {
    return;
  }
  let t = g % 128u;         // the split kernel's invocation
  let qi = (g / 128u) % 16u;  // 4q + i
  let q = qi / 4u;
  let r = (tile / p.tiles_m) * 64u + 4u * (t / 16u) + qi % 4u + (q / 2u) * 32u;
  let c = (tile % p.tiles_m) * 128u + 4u * (t % 16u) + (q % 2u) * 64u;
  if (r >= p.n) {
    return;
  }
  let at = tile * 8192u + qi * 512u + t;
  var y = load_part(0u, at);
  for (var s0 = 1u; s0 < p.pieces; s0 += 8u) {
    var v: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
      v[j] = load_part(min(s0 + j, p.pieces - 1u), at);
    }
    for (var j = 0u; j < 8u; j++) {
      if (s0 + j < p.pieces) {
        y += v[j];
      }
    }
  }
  for (var e = 0u; e < 4u; e++) {
    if (c + e < p.m) {
      var o = y[e];
      if (p.has_bias != 0u) {
        o += bias[p.bias_off + p.col0 + c + e];
      }
      out[p.o_off + r * p.o_st + p.col0 + c + e] = o;
    }
  }
}
