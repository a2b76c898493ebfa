// Causal grouped-query attention over a read-only prefix K/V plus each sequence's own K/V:
//   out[t,h,:] = Σ_s softmax_s(scale · q[t,h]·key_s) value_s, query head h reading KV head
//   h / G (G = H/Hkv); token t (relative index τ) sees the Ls prefix keys, then its sequence's keys 0..τ.
//
// Layout: q, out [n,H,hd]; k, v [n,Hkv,hd]; prefix_k, prefix_v [Ls,Hkv,hd] (dummies when Ls = 0);
// all with free outer strides, last dim contiguous. `tiles` (u32, staged per op by ops.cpp):
//   query tile i at 4·i: (first token of its sequence, τ of its first query, query count <= tpw =
//     64 / gw, number of key splits S_i);
//   work item w at work_base + 4·w: (query tile, first key tile, end key tile, split index);
//   token t at split_base + t: S of its query tile.
// Launch (`attention`): one 256-invocation workgroup per (work item, KV head, head chunk) (folded;
// the host orders work items longest first). Its 64 query rows are the tile's tpw tokens × gw heads
// sharing the KV head (gw = min(G, 64); heads beyond 64 go in further head chunks), so each key and
// value row is read once per 64 rows. The tile's keys (prefix, then own keys up to its last token)
// go by in tiles of 32; a work item takes a contiguous range of them (the host splits long tiles, so
// that few tiles or a causal prefill's long last tiles still spread over the GPU). Per key tile, two
// register-tiled products through 12 KiB of workgroup memory (12.8 KiB with the row statistics:
// within the portable 16 KiB minimum):
// - scores S[64 rows × 32 keys] = Q·Kᵀ: invocation (ty, tx) = (lid / 16, lid % 16) owns rows
//   4ty..4ty+3 × keys 2tx, 2tx+1 (8 FMAs per vec4 + vec4 shared load), over hd in chunks of 32 dims
//   staged k-major (Q [32][16 row quads], K [32][8 key quads], quad index XOR-swizzled with the dim
//   so a store wavefront hits distinct banks); the Q chunk is re-staged per key tile (it does not fit).
// - online softmax in FP32 per row (running max and sum; the accumulators rescaled by
//   exp(old max − new max) per key tile), masked keys contributing exactly 0; P [32 keys][16 row
//   quads] reuses the Q/K staging memory.
// - O[64 × hd] += P·V: the same invocation owns rows 4ty..+3 × dim quads tx + 16u (u < 4) in 16
//   vec4 registers, values staged 4 keys at a time (4 × 64 quads).
// The next chunk's global loads are issued before the current chunk's FMAs (register prefetch).
// A tile with S_i = 1: the workgroup writes out normalised. S_i > 1 (flash-decoding): each split
// writes its rows' unnormalised output, running max m and sum l to `part` (O at [split][t][h][hd] for
// split < max_splits, then (m, l) at [split][t][h]); `attention_combine` (one 64-invocation
// workgroup per (token, head); tokens of unsplit tiles return at once) merges them:
// m* = max_s m_s, out = Σ_s e^{m_s−m*} O_s / Σ_s e^{m_s−m*} l_s. A split that saw no visible key of a
// row leaves m = −3e38, l = 0, O = 0 (weight 0).
// Preconditions (supports()): hd <= 256, Hkv divides H; exp is WGSL's FP32 exp.

struct Params {
  n_work: u32, h: u32, hkv: u32, hd: u32,
  ls: u32, scale: f32, gw: u32, n_hchunks: u32,
  max_splits: u32, n: u32, work_base: u32, split_base: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, pk_off: u32, pk_st0: u32, pk_st1: u32,
  pv_off: u32, pv_st0: u32, pv_st1: u32, o_off: u32,
  o_st0: u32, o_st1: u32, pad2: u32, pad3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> prefix_k: array<f32>;
@group(0) @binding(5) var<storage, read_write> prefix_v: array<f32>;
@group(0) @binding(6) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;

const NEG_BIG: f32 = -3.0e38;
const ROWS: u32 = 64u;  // query rows per workgroup
const KT: u32 = 32u;    // keys per key tile
const DC: u32 = 32u;    // dims per score chunk
const VC: u32 = 4u;     // keys per value chunk
const KOFF: u32 = 512u; // K chunk, then V chunk, start here in `buf` (Q chunk, then P, below)

// Phase 1: Q chunk [DC][16 quads] at 0, K chunk [DC][8 quads] at KOFF. Phase 2: P [KT][16 quads]
// at 0, V chunk [VC][64 quads] at KOFF.
var<workgroup> buf: array<vec4<f32>, 768>;
var<workgroup> row_max: array<f32, 64>;
var<workgroup> row_scale: array<f32, 64>;  // exp(old max − new max) of the current key tile
var<workgroup> row_sum: array<f32, 64>;
var<workgroup> tile_info: vec4<u32>;
var<workgroup> work_info: vec4<u32>;

// Element offset of key or value row s (prefix first) of KV head kvh, for a sequence starting at
// token `begin`.
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

// Element d of key (value = false) or value row s; 0 for s >= end or d >= hd.
fn kv_at(s: u32, end: u32, d: u32, begin: u32, kvh: u32, value: bool) -> f32 {
  if (s >= end || d >= p.hd) {
    return 0.0;
  }
  let at = key_row(s, begin, kvh, value) + d;
  if (s < p.ls) {
    if (value) {
      return prefix_v[at];
    }
    return prefix_k[at];
  }
  if (value) {
    return v[at];
  }
  return k[at];
}

// Element d of query row base `qb` (0xffffffff: an invalid row), 0 outside.
fn q_at(qb: u32, d: u32) -> f32 {
  if (qb == 0xffffffffu || d >= p.hd) {
    return 0.0;
  }
  return q[qb + d];
}

// Swizzled quad index: quad c of staged row r (8 rows of a store wavefront hit 8 bank groups).
fn swz(r: u32, c: u32) -> u32 {
  return c ^ (r & 7u);
}

@compute @workgroup_size(256)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_work * p.hkv * p.n_hchunks) {
    return;
  }
  let hchunk = item % p.n_hchunks;
  let kvh = (item / p.n_hchunks) % p.hkv;
  let work = item / (p.n_hchunks * p.hkv);
  let g = p.h / p.hkv;
  if (lid == 0u) {
    let w = p.work_base + 4u * work;
    work_info = vec4<u32>(tiles[w], tiles[w + 1u], tiles[w + 2u], tiles[w + 3u]);
    let ti = 4u * tiles[w];
    tile_info = vec4<u32>(tiles[ti], tiles[ti + 1u], tiles[ti + 2u], tiles[ti + 3u]);
  }
  let winfo = workgroupUniformLoad(&work_info);
  let info = workgroupUniformLoad(&tile_info);
  let begin = info.x;
  let tau0 = info.y;
  let count = info.z;
  let n_splits = info.w;
  let kt0 = winfo.y;
  let kt1 = winfo.z;
  let split = winfo.w;
  let n_keys = p.ls + tau0 + count;

  let ty = lid / 16u;
  let tx = lid % 16u;
  // Row ρ: token tau0 + ρ / gw, head kvh·G + hchunk·gw + ρ % gw.
  var lim: vec4<u32>;  // rows 4ty..4ty+3 see keys s < lim (0: an invalid row)
  for (var i = 0u; i < 4u; i++) {
    let r = 4u * ty + i;
    let hh = hchunk * p.gw + r % p.gw;
    lim[i] = select(0u, p.ls + tau0 + r / p.gw + 1u, r / p.gw < count && hh < g);
  }
  // Loader role: dim dl = lid % 32 of the chunk; Q row quads lq and lq + 8, K key quad lq.
  let dl = lid % DC;
  let lq = lid / DC;
  var qb: array<u32, 8>;  // query row bases of rows 4lq..4lq+3, 32+4lq..32+4lq+3
  for (var i = 0u; i < 8u; i++) {
    let r = 4u * lq + (i / 4u) * 32u + i % 4u;
    let hh = hchunk * p.gw + r % p.gw;
    var base = 0xffffffffu;
    if (r / p.gw < count && hh < g) {
      base = p.q_off + (begin + tau0 + r / p.gw) * p.q_st0 + (kvh * g + hh) * p.q_st1;
    }
    qb[i] = base;
  }
  if (lid < ROWS) {
    row_max[lid] = NEG_BIG;
    row_sum[lid] = 0.0;
  }

  var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0); var a02 = vec4<f32>(0.0); var a03 = vec4<f32>(0.0);
  var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0); var a12 = vec4<f32>(0.0); var a13 = vec4<f32>(0.0);
  var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0); var a22 = vec4<f32>(0.0); var a23 = vec4<f32>(0.0);
  var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0); var a32 = vec4<f32>(0.0); var a33 = vec4<f32>(0.0);

  let n_dc = (p.hd + DC - 1u) / DC;
  for (var kt = kt0; kt < kt1; kt++) {
    let s0 = kt * KT;
    let key_end = min(n_keys, s0 + KT);
    // ---- scores ----
    var pq0 = vec4<f32>(q_at(qb[0], dl), q_at(qb[1], dl), q_at(qb[2], dl), q_at(qb[3], dl));
    var pq1 = vec4<f32>(q_at(qb[4], dl), q_at(qb[5], dl), q_at(qb[6], dl), q_at(qb[7], dl));
    let sk = s0 + 4u * lq;
    var pk = vec4<f32>(kv_at(sk, key_end, dl, begin, kvh, false), kv_at(sk + 1u, key_end, dl, begin, kvh, false),
                       kv_at(sk + 2u, key_end, dl, begin, kvh, false), kv_at(sk + 3u, key_end, dl, begin, kvh, false));
    var sc0 = vec4<f32>(0.0);  // rows 4ty..+3 × key 2tx
    var sc1 = vec4<f32>(0.0);  // ... × key 2tx + 1
    for (var c = 0u; c < n_dc; c++) {
      buf[dl * 16u + swz(dl, lq)] = pq0;
      buf[dl * 16u + swz(dl, lq + 8u)] = pq1;
      buf[KOFF + dl * 8u + swz(dl, lq)] = pk;
      workgroupBarrier();
      if (c + 1u < n_dc) {
        let d = (c + 1u) * DC + dl;
        pq0 = vec4<f32>(q_at(qb[0], d), q_at(qb[1], d), q_at(qb[2], d), q_at(qb[3], d));
        pq1 = vec4<f32>(q_at(qb[4], d), q_at(qb[5], d), q_at(qb[6], d), q_at(qb[7], d));
        pk = vec4<f32>(kv_at(sk, key_end, d, begin, kvh, false), kv_at(sk + 1u, key_end, d, begin, kvh, false),
                       kv_at(sk + 2u, key_end, d, begin, kvh, false), kv_at(sk + 3u, key_end, d, begin, kvh, false));
      }
      for (var dd = 0u; dd < DC; dd++) {
        let qv = buf[dd * 16u + swz(dd, ty)];
        let kq = buf[KOFF + dd * 8u + swz(dd, tx / 2u)];
        let kp = select(kq.xy, kq.zw, (tx & 1u) == 1u);
        sc0 = fma(qv, vec4<f32>(kp.x), sc0);
        sc1 = fma(qv, vec4<f32>(kp.y), sc1);
      }
      workgroupBarrier();
    }
    // ---- online softmax ----
    let j0 = 2u * tx;
    let ok0 = vec4<u32>(s0 + j0) < lim;
    let ok1 = vec4<u32>(s0 + j0 + 1u) < lim;
    sc0 = select(vec4<f32>(NEG_BIG), sc0 * p.scale, ok0);
    sc1 = select(vec4<f32>(NEG_BIG), sc1 * p.scale, ok1);
    // P row j holds quad c at j·16 + (c ^ ((j / 2) & 7)): keys 2tx, 2tx+1 of a store wavefront spread.
    let st0 = j0 * 16u + swz(tx, ty);
    let st1 = st0 + 16u;
    buf[st0] = sc0;
    buf[st1] = sc1;
    workgroupBarrier();
    if (lid < ROWS) {
      var m = row_max[lid];
      for (var j = 0u; j < KT; j++) {
        m = max(m, buf[j * 16u + swz(j / 2u, lid / 4u)][lid % 4u]);
      }
      row_scale[lid] = exp(row_max[lid] - m);
      row_max[lid] = m;
    }
    workgroupBarrier();
    let mx = vec4<f32>(row_max[4u * ty], row_max[4u * ty + 1u], row_max[4u * ty + 2u], row_max[4u * ty + 3u]);
    buf[st0] = select(vec4<f32>(0.0), exp(sc0 - mx), ok0);
    buf[st1] = select(vec4<f32>(0.0), exp(sc1 - mx), ok1);
    workgroupBarrier();
    if (lid < ROWS) {
      var sum = 0.0;
      for (var j = 0u; j < KT; j++) {
        sum += buf[j * 16u + swz(j / 2u, lid / 4u)][lid % 4u];
      }
      row_sum[lid] = row_sum[lid] * row_scale[lid] + sum;
    }
    // ---- O = O·scale + P·V ----
    let f0 = row_scale[4u * ty];
    let f1 = row_scale[4u * ty + 1u];
    let f2 = row_scale[4u * ty + 2u];
    let f3 = row_scale[4u * ty + 3u];
    a00 *= f0; a01 *= f0; a02 *= f0; a03 *= f0;
    a10 *= f1; a11 *= f1; a12 *= f1; a13 *= f1;
    a20 *= f2; a21 *= f2; a22 *= f2; a23 *= f2;
    a30 *= f3; a31 *= f3; a32 *= f3; a33 *= f3;
    // Loader role: key lid / 64 of the chunk, dims 4·(lid % 64)..+3.
    let vj = lid / 64u;
    let vd = 4u * (lid % 64u);
    let n_vc = (key_end - s0 + VC - 1u) / VC;
    var sv = s0 + vj;
    var pv = vec4<f32>(kv_at(sv, key_end, vd, begin, kvh, true), kv_at(sv, key_end, vd + 1u, begin, kvh, true),
                       kv_at(sv, key_end, vd + 2u, begin, kvh, true), kv_at(sv, key_end, vd + 3u, begin, kvh, true));
    for (var c = 0u; c < n_vc; c++) {
      buf[KOFF + lid] = pv;
      workgroupBarrier();
      if (c + 1u < n_vc) {
        sv += VC;
        pv = vec4<f32>(kv_at(sv, key_end, vd, begin, kvh, true), kv_at(sv, key_end, vd + 1u, begin, kvh, true),
                       kv_at(sv, key_end, vd + 2u, begin, kvh, true), kv_at(sv, key_end, vd + 3u, begin, kvh, true));
      }
      for (var jj = 0u; jj < VC; jj++) {
        let j = c * VC + jj;
        let pr = buf[j * 16u + swz(j / 2u, ty)];
        let vb = KOFF + jj * 64u + tx;
        let v0 = buf[vb];
        let v1 = buf[vb + 16u];
        let v2 = buf[vb + 32u];
        let v3 = buf[vb + 48u];
        a00 = fma(vec4<f32>(pr.x), v0, a00); a01 = fma(vec4<f32>(pr.x), v1, a01);
        a02 = fma(vec4<f32>(pr.x), v2, a02); a03 = fma(vec4<f32>(pr.x), v3, a03);
        a10 = fma(vec4<f32>(pr.y), v0, a10); a11 = fma(vec4<f32>(pr.y), v1, a11);
        a12 = fma(vec4<f32>(pr.y), v2, a12); a13 = fma(vec4<f32>(pr.y), v3, a13);
        a20 = fma(vec4<f32>(pr.z), v0, a20); a21 = fma(vec4<f32>(pr.z), v1, a21);
        a22 = fma(vec4<f32>(pr.z), v2, a22); a23 = fma(vec4<f32>(pr.z), v3, a23);
        a30 = fma(vec4<f32>(pr.w), v0, a30); a31 = fma(vec4<f32>(pr.w), v1, a31);
        a32 = fma(vec4<f32>(pr.w), v2, a32); a33 = fma(vec4<f32>(pr.w), v3, a33);
      }
      workgroupBarrier();
    }
  }
  workgroupBarrier();
  let sp = vec2<u32>(split, n_splits);
  store_rows(0u, lim[0], ty, tx, hchunk, kvh, begin + tau0, sp, a00, a01, a02, a03);
  store_rows(1u, lim[1], ty, tx, hchunk, kvh, begin + tau0, sp, a10, a11, a12, a13);
  store_rows(2u, lim[2], ty, tx, hchunk, kvh, begin + tau0, sp, a20, a21, a22, a23);
  store_rows(3u, lim[3], ty, tx, hchunk, kvh, begin + tau0, sp, a30, a31, a32, a33);
}

// Row 4ty + i of the workgroup (lim = 0: invalid), dim quads tx + 16u: normalised into out (the
// tile's split count sp.y = 1) or unnormalised into part as split sp.x, with the row's (m, l).
fn store_rows(i: u32, lim: u32, ty: u32, tx: u32, hchunk: u32, kvh: u32, t0: u32, sp: vec2<u32>, o0: vec4<f32>,
              o1: vec4<f32>, o2: vec4<f32>, o3: vec4<f32>) {
  if (lim == 0u) {
    return;
  }
  let r = 4u * ty + i;
  let t = t0 + r / p.gw;
  let head = kvh * (p.h / p.hkv) + hchunk * p.gw + r % p.gw;
  var o = array<vec4<f32>, 4>(o0, o1, o2, o3);
  if (sp.y == 1u) {
    let inv = 1.0 / row_sum[r];
    let ob = p.o_off + t * p.o_st0 + head * p.o_st1;
    for (var u = 0u; u < 4u; u++) {
      for (var e = 0u; e < 4u; e++) {
        let d = 4u * (tx + 16u * u) + e;
        if (d < p.hd) {
          out[ob + d] = o[u][e] * inv;
        }
      }
    }
    return;
  }
  let row = (sp.x * p.n + t) * p.h + head;
  let pb = row * p.hd;
  for (var u = 0u; u < 4u; u++) {
    for (var e = 0u; e < 4u; e++) {
      let d = 4u * (tx + 16u * u) + e;
      if (d < p.hd) {
        part[pb + d] = o[u][e];
      }
    }
  }
  if (tx == 0u) {
    let sb = p.max_splits * p.n * p.h * p.hd + 2u * row;
    part[sb] = row_max[r];
    part[sb + 1u] = row_sum[r];
  }
}

@compute @workgroup_size(64)
fn attention_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n * p.h) {
    return;
  }
  let t = item / p.h;
  let head = item % p.h;
  let n_splits = tiles[p.split_base + t];
  if (n_splits <= 1u) {
    return;
  }
  let stride = p.n * p.h;  // rows per split
  let sb = p.max_splits * stride * p.hd;
  var m = NEG_BIG;
  for (var s = 0u; s < n_splits; s++) {
    m = max(m, part[sb + 2u * (s * stride + item)]);
  }
  var l = 0.0;
  for (var s = 0u; s < n_splits; s++) {
    l += exp(part[sb + 2u * (s * stride + item)] - m) * part[sb + 2u * (s * stride + item) + 1u];
  }
  let inv = 1.0 / l;
  let ob = p.o_off + t * p.o_st0 + head * p.o_st1;
  for (var d = lid; d < p.hd; d += 64u) {
    var acc = 0.0;
    for (var s = 0u; s < n_splits; s++) {
      let w = exp(part[sb + 2u * (s * stride + item)] - m);
      acc = fma(w, part[(s * stride + item) * p.hd + d], acc);
    }
    out[ob + d] = acc * inv;
  }
}
