// Depthwise causal convolution over each packed sequence, then SiLU (the GDN pre-mixer):
//   out[t,c] = SiLU(Σ_{j<K} w[c,j] · in(τ−(K−1)+j, c)),  τ = t − offsets[r] for t in sequence r;
//   in(i, c) = x[offsets[r]+i, c] for i >= 0, else state_in[c, K+i] with has_prefix, else 0.
//   conv_state: state_out[c, j] = in(L−K+j, c) for the single sequence of length L.
//
// Layout: x [n,C] (row stride x_st), w [C,K], state_in / state_out [C,K] contiguous, out [n,C] (row
// stride o_st), offsets [R+1] I32 (staged per op). Unused operands are bound to dummies.
// Launch: conv, one invocation per (token, channel); conv_state, one per (channel, tap); 256 per
// workgroup (folded). A token finds its sequence by binary search over offsets.

struct Params {
  n: u32, c: u32, k: u32, n_seqs: u32,
  x_off: u32, x_st: u32, w_off: u32, si_off: u32,
  o_off: u32, o_st: u32, so_off: u32, has_prefix: u32,
  len: u32, pad0: u32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> offsets: array<i32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> state_out: array<f32>;

// Start of the sequence holding token t: the last r < n_seqs with offsets[r] <= t.
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

// in(i, ch) for a sequence starting at token `begin`.
fn input_at(begin: u32, i: i32, ch: u32) -> f32 {
  if (i >= 0) {
    return x[p.x_off + (begin + u32(i)) * p.x_st + ch];
  }
  if (p.has_prefix != 0u) {
    return state_in[p.si_off + ch * p.k + u32(i32(p.k) + i)];
  }
  return 0.0;
}

@compute @workgroup_size(256)
fn conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.n * p.c) {
    return;
  }
  let t = i / p.c;
  let ch = i % p.c;
  let begin = sequence_start(t);
  let tau = i32(t - begin);
  var acc = 0.0;
  for (var j = 0u; j < p.k; j++) {
    acc = fma(w[p.w_off + ch * p.k + j], input_at(begin, tau - i32(p.k - 1u) + i32(j), ch), acc);
  }
  out[p.o_off + t * p.o_st + ch] = silu(acc);
}

@compute @workgroup_size(256)
fn conv_state(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.c * p.k) {
    return;
  }
  let ch = i / p.k;
  let j = i % p.k;
  state_out[p.so_off + ch * p.k + j] = input_at(0u, i32(p.len) - i32(p.k) + i32(j), ch);
}
