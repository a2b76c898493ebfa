// Causal grouped-query attention over a read-only prefix K/V plus each sequence's own K/V:
//   out[t,h,:] = Σ_s softmax_s(scale · q[t,h]·key_s) value_s, query head h reading KV head
//   h / (H/Hkv); token t (relative index τ) sees the Ls prefix keys, then its sequence's keys 0..τ.
//
// Layout: q, out [n,H,hd]; k, v [n,Hkv,hd]; prefix_k, prefix_v [Ls,Hkv,hd] (dummies when Ls = 0);
// all with free outer strides; tiles (u32, staged per op): tile i at 4·i holds (first token of its
// sequence, τ of its first query, query count <= 8). hd <= 256.
// Launch: one workgroup of 64 invocations per (query tile, query head) (folded). The tile's (up to) 8
// queries sit in workgroup memory (8 KiB); keys go by in tiles of 64, invocation i scoring key i
// against all 8 queries (each key row read once per 8 queries), then an online softmax per query in
// FP32 (running max and sum, the accumulators rescaled per key tile); invocation i accumulates output
// dims i, i+64, ... of all 8 queries, each value row read once per 8 queries. qt = 8 comes in the params
// (a run-time bound keeps shader compilers from unrolling the per-query loops).

struct Params {
  n_tiles: u32, h: u32, hkv: u32, hd: u32,
  ls: u32, qt: u32, scale: f32, pad0: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, pk_off: u32, pk_st0: u32, pk_st1: u32,
  pv_off: u32, pv_st0: u32, pv_st1: u32, o_off: u32,
  o_st0: u32, o_st1: u32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> prefix_k: array<f32>;
@group(0) @binding(5) var<storage, read_write> prefix_v: array<f32>;
@group(0) @binding(6) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const NEG_BIG: f32 = -3.0e38;
const QT: u32 = 8u;
const KT: u32 = 64u;

var<workgroup> qs: array<f32, 2048>;   // [QT][hd]
var<workgroup> probs: array<f32, 512>; // [QT][KT]: scores, then probabilities
var<workgroup> row_max: array<f32, 8>;
var<workgroup> row_scale: array<f32, 8>;  // exp(old max − new max) of the current key tile
var<workgroup> row_sum: array<f32, 8>;
var<workgroup> tile_info: vec3<u32>;

// Key s (prefix first) of a sequence starting at token `begin`: its element offset in k or v.
fn key_row(s: u32, begin: u32, kvh: u32, value: bool) -> u32 {
  if (s < p.ls) {
    if (value) {
      return p.pv_off + s * p.pv_st0 + kvh * p.pv_st1;
    }
    return p.pk_off + s * p.pk_st0 + kvh * p.pk_st1;
  }
  if (value) {
    return p.v_off + (begin + s - p.ls) * p.v_st0 + kvh * p.v_st1;
  }
  return p.k_off + (begin + s - p.ls) * p.k_st0 + kvh * p.k_st1;
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_tiles * p.h) {
    return;
  }
  let tile = item / p.h;
  let head = item % p.h;
  let kvh = head / (p.h / p.hkv);
  if (lid == 0u) {
    tile_info = vec3<u32>(tiles[4u * tile], tiles[4u * tile + 1u], tiles[4u * tile + 2u]);
  }
  let info = workgroupUniformLoad(&tile_info);
  let begin = info.x;
  let tau0 = info.y;
  let count = info.z;
  for (var e = lid; e < QT * p.hd; e += 64u) {
    let qi = e / p.hd;
    var val = 0.0;
    if (qi < count) {
      val = q[p.q_off + (begin + tau0 + qi) * p.q_st0 + head * p.q_st1 + e % p.hd];
    }
    qs[e] = val;
  }
  if (lid < QT) {
    row_max[lid] = NEG_BIG;
    row_sum[lid] = 0.0;
  }
  workgroupBarrier();
  // Query qi (< count) sees keys s < ls + tau0 + qi + 1.
  let n_keys = p.ls + tau0 + count;
  var acc: array<f32, 32>;  // [qi][u]: output dim lid + 64u of query qi
  for (var s0 = 0u; s0 < n_keys; s0 += KT) {
    let s = s0 + lid;
    // Zeroed explicitly: llvmpipe kept this loop-body array's values from the previous key tile.
    var dots: array<f32, 8>;
    for (var qi = 0u; qi < QT; qi++) {
      dots[qi] = 0.0;
    }
    if (s < n_keys) {
      let kb = key_row(s, begin, kvh, false);
      for (var d = 0u; d < p.hd; d++) {
        var kd: f32;
        if (s < p.ls) {
          kd = prefix_k[kb + d];
        } else {
          kd = k[kb + d];
        }
        for (var qi = 0u; qi < p.qt; qi++) {
          dots[qi] = fma(qs[qi * p.hd + d], kd, dots[qi]);
        }
      }
    }
    for (var qi = 0u; qi < p.qt; qi++) {
      let valid = qi < count && s < p.ls + tau0 + qi + 1u;
      probs[qi * KT + lid] = select(NEG_BIG, dots[qi] * p.scale, valid);
    }
    workgroupBarrier();
    if (lid < QT) {
      var m = row_max[lid];
      for (var j = 0u; j < KT; j++) {
        m = max(m, probs[lid * KT + j]);
      }
      row_scale[lid] = exp(row_max[lid] - m);
      row_max[lid] = m;
    }
    workgroupBarrier();
    for (var qi = 0u; qi < p.qt; qi++) {
      let valid = qi < count && s < p.ls + tau0 + qi + 1u;
      probs[qi * KT + lid] = select(0.0, exp(probs[qi * KT + lid] - row_max[qi]), valid);
    }
    workgroupBarrier();
    if (lid < QT) {
      var sum = 0.0;
      for (var j = 0u; j < KT; j++) {
        sum += probs[lid * KT + j];
      }
      row_sum[lid] = row_sum[lid] * row_scale[lid] + sum;
    }
    let n_tile = min(KT, n_keys - s0);
    for (var u = 0u; u < 4u; u++) {
      let d = lid + u * 64u;
      if (d < p.hd) {
        for (var qi = 0u; qi < p.qt; qi++) {
          acc[qi * 4u + u] *= row_scale[qi];
        }
        for (var j = 0u; j < n_tile; j++) {
          var val: f32;
          if (s0 + j < p.ls) {
            val = prefix_v[key_row(s0 + j, begin, kvh, true) + d];
          } else {
            val = v[key_row(s0 + j, begin, kvh, true) + d];
          }
          for (var qi = 0u; qi < p.qt; qi++) {
            acc[qi * 4u + u] = fma(probs[qi * KT + j], val, acc[qi * 4u + u]);
          }
        }
      }
    }
    workgroupBarrier();
  }
  for (var qi = 0u; qi < count; qi++) {
    for (var u = 0u; u < 4u; u++) {
      let d = lid + u * 64u;
      if (d < p.hd) {
        out[p.o_off + (begin + tau0 + qi) * p.o_st0 + head * p.o_st1 + d] = acc[qi * 4u + u] / row_sum[qi];
      }
    }
  }
}
