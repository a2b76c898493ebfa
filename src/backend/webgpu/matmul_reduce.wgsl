// Split-K sum of matmul.wgsl's tiled entry points:
//   out[i, col0 + j] = ((P_0[i,j] + P_1[i,j]) + ... + P_{S-1}[i,j]) (+ bias[col0 + j]),
// the k pieces' partials added in piece order and the bias last — the order in which matmul_rows folds
// its pieces, so a row's bits do not depend on the entry point that computed it.
// Layout: partial planes P [S][n][m] contiguous from the start of their binding (scratch), bias [M] or
// a dummy, out [n, M] (row stride o_st; the weight piece's columns start at col0).
// Launch: one invocation per output element (consecutive invocations, consecutive columns), 256 per
// workgroup, folded. An invocation issues the loads of up to 8 pieces before adding them (past the last
// piece it reloads the last one, unused), so it waits out about pieces / 8 memory latencies rather than
// one per piece; the adds keep their order.

struct Params {
  n: u32, m: u32, pieces: u32, o_off: u32,
  o_st: u32, col0: u32, bias_off: u32, has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn matmul_reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let e = linear_group(wid, nwg) * 256u + lid;
  let plane = p.n * p.m;
  if (e >= plane) {
    return;
  }
  var y = part[e];
  for (var s0 = 1u; s0 < p.pieces; s0 += 8u) {
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
      v[j] = part[min(s0 + j, p.pieces - 1u) * plane + e];
    }
    for (var j = 0u; j < 8u; j++) {
      if (s0 + j < p.pieces) {
        y += v[j];
      }
    }
  }
  let c = e % p.m;
  if (p.has_bias != 0u) {
    y += bias[p.bias_off + p.col0 + c];
  }
  out[p.o_off + (e / p.m) * p.o_st + p.col0 + c] = y;
}
