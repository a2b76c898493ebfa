// Rotary position embedding, rotate-half form, in place on the first n_rot dims of every head:
//   (x_i, x_{i+half}) ← (x_i cos φ − x_{i+half} sin φ, x_{i+half} cos φ + x_i sin φ),
//   φ = (pos0 + τ) · θ^(−2i/n_rot), τ = t − offsets[r] for token t of sequence r.
//
// Layout: x [n,H,hd] (strides x_st0, x_st1; q may be a view of a wider projection); table
// [max_len, 2·half] with cos φ then sin φ for each relative position, computed on the host in double
// (an FP32 angle at position 70,000 would be off by ~4e-3 rad) and staged once per pass;
// offsets [R+1] I32. Launch: one invocation per (token, head, i < half), 256 per workgroup (folded);
// each invocation owns its pair, so the update in place is race-free.

struct Params {
  n: u32, h: u32, half: u32, n_seqs: u32,
  x_off: u32, x_st0: u32, x_st1: u32, pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> table: array<f32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<i32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

fn sequence_start(t: u32) -> u32 {
  var lo = 0u;
  var hi = p.n_seqs;
  while (hi - lo > 1u) {
    let mid = (lo + hi) / 2u;
    if (u32(offsets[mid]) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return u32(offsets[lo]);
}

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let idx = linear_group(wid, nwg) * 256u + lid;
  if (idx >= p.n * p.h * p.half) {
    return;
  }
  let i = idx % p.half;
  let th = idx / p.half;
  let head = th % p.h;
  let t = th / p.h;
  let rel = t - sequence_start(t);
  let cs = table[rel * 2u * p.half + i];
  let sn = table[rel * 2u * p.half + p.half + i];
  let base = p.x_off + t * p.x_st0 + head * p.x_st1;
  let a = x[base + i];
  let b = x[base + i + p.half];
  x[base + i] = a * cs - b * sn;
  x[base + i + p.half] = b * cs + a * sn;
}
