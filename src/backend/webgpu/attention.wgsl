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
// go by in tiles of 64; a work item takes a contiguous range of them (the host splits long tiles, so
// that few tiles or a causal prefill's long last tiles still spread over the GPU). Invocation
// (ty, tx) = (lid / 16, lid % 16) owns rows 4ty..4ty+3 throughout. Per key tile, through 12 KiB of
// workgroup memory (`buf`, the only workgroup array besides two vec4 of tile data):
// - scores S[64 rows × 64 keys] = Q·Kᵀ in registers: the invocation owns keys 2tx, 2tx+1 of each
//   half of 32 keys (16 FMAs per two vec4 shared loads), over hd in chunks of 16 dims staged k-major
//   (Q [16][16 row quads], K [16][16 key quads], key quad q = keys 2q, 2q+1, 32+2q, 33+2q; quad index
//   XOR-swizzled with the dim so a store wavefront hits distinct banks); Q is re-staged per key tile
//   (64 rows × hd does not fit).
// - online softmax in FP32 per row: each invocation's max over its 4 keys goes to workgroup memory
//   (`red` [16 tx][16 row quads] at KOFF) and every invocation of a row reads all 16, so all hold
//   the same running max m (registers) and rescale by exp(old m − new m); each keeps the running sum
//   l of its own keys only, summed over the 16 once at the end. Masked keys contribute exactly 0.
// - O[64 × hd] += P·V in two halves of 32 keys (P of keys 32h..32h+31 as [32 keys][16 row quads] at
//   0, every invocation writing its two keys of the half, so only the second half's P stays in
//   registers through the first; a half past the tile's last key is skipped): the invocation owns dim
//   quads tx + 16u (u < 4) of its rows in 16 vec4 registers, values staged 4 keys at a time (4 × 64
//   quads at KOFF).
// Barriers: two per dim chunk and per value chunk, one per key tile for the row maxima and one per
// half for P. The next chunk's global loads are issued before the current chunk's FMAs (register
// prefetch).
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
const NONE: u32 = 0xffffffffu;  // the row base of a key or query row outside the tile
const KT: u32 = 64u;    // keys per key tile
const DC: u32 = 16u;    // dims per score chunk
const VC: u32 = 4u;     // keys per value chunk
const KOFF: u32 = 512u; // K chunk, then `red`, then the V chunk start here in `buf` (Q chunk, then P, below)

// Scores: Q chunk [DC][16 quads] at 0, K chunk [DC][16 quads] at 256. Softmax: `red` [16][16 quads]
// at KOFF. P·V: P [32][16 quads] at 0, V chunk [VC][64 quads] at KOFF.
var<workgroup> buf: array<vec4<f32>, 768>;
var<workgroup> tile_info: vec4<u32>;
var<workgroup> work_info: vec4<u32>;

// Element offset of key or value row s (prefix first) of KV head kvh, for a sequence starting at
// token `begin`; NONE for s >= end.
fn key_base(s: u32, end: u32, begin: u32, kvh: u32, value: bool) -> u32 {
  if (s >= end) {
    return NONE;
  }
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

// Element d of the key (value = false) or value row s whose base is `base`; 0 for NONE or d >= hd.
fn kv_at(base: u32, s: u32, d: u32, value: bool) -> f32 {
  if (base == NONE || d >= p.hd) {
    return 0.0;
  }
  if (s < p.ls) {
    if (value) {
      return prefix_v[base + d];
    }
    return prefix_k[base + d];
  }
  if (value) {
    return v[base + d];
  }
  return k[base + d];
}

// Element d of query row base `qb`, 0 outside.
fn q_at(qb: u32, d: u32) -> f32 {
  if (qb == NONE || d >= p.hd) {
    return 0.0;
  }
  return q[qb + d];
}

// Swizzled quad index: quad c of staged row r (8 rows of a store wavefront hit 8 bank groups).
fn swz(r: u32, c: u32) -> u32 {
  return c ^ (r & 7u);
}

// The 16 × 4 row maxima in `red`, each the max over one invocation's 4 keys, reduced for row quad ty.
fn red_max(ty: u32, m: vec4<f32>) -> vec4<f32> {
  var r = m;
  for (var t = 0u; t < 16u; t++) {
    r = max(r, buf[KOFF + t * 16u + swz(t, ty)]);
  }
  return r;
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

  // ty masked to 0..15 (a no-op for lid < 256) so that the shader compiler can prove the shared read
  // indices in the inner loops (dd · 16 + (ty ^ swizzle), ...) within `buf` and drop Dawn's
  // robustness clamp from each of them; tx is bounded already.
  let ty = (lid / 16u) & 15u;
  let tx = lid % 16u;
  // Row ρ: token tau0 + ρ / gw, head kvh·G + hchunk·gw + ρ % gw.
  var lim: vec4<u32>;  // rows 4ty..4ty+3 see keys s < lim (0: an invalid row)
  for (var i = 0u; i < 4u; i++) {
    let r = 4u * ty + i;
    let hh = hchunk * p.gw + r % p.gw;
    lim[i] = select(0u, p.ls + tau0 + r / p.gw + 1u, r / p.gw < count && hh < g);
  }
  // Loader role: dim dl = lid % 16 of the chunk; Q row quad lq, K key quad lq.
  let dl = lid % DC;
  let lq = lid / DC;
  var qb: vec4<u32>;  // query row bases of rows 4lq..4lq+3
  for (var i = 0u; i < 4u; i++) {
    let r = 4u * lq + i;
    let hh = hchunk * p.gw + r % p.gw;
    var base = NONE;
    if (r / p.gw < count && hh < g) {
      base = p.q_off + (begin + tau0 + r / p.gw) * p.q_st0 + (kvh * g + hh) * p.q_st1;
    }
    qb[i] = base;
  }
  let st_q = dl * 16u + swz(dl, lq);  // the loader's quad in the Q chunk (K chunk: + 256)

  var m = vec4<f32>(NEG_BIG);  // running max of rows 4ty..+3 (the same in all 16 invocations of a row)
  var l = vec4<f32>(0.0);      // running sum of exp(score − m) over this invocation's keys
  var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0); var a02 = vec4<f32>(0.0); var a03 = vec4<f32>(0.0);
  var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0); var a12 = vec4<f32>(0.0); var a13 = vec4<f32>(0.0);
  var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0); var a22 = vec4<f32>(0.0); var a23 = vec4<f32>(0.0);
  var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0); var a32 = vec4<f32>(0.0); var a33 = vec4<f32>(0.0);

  let n_dc = (p.hd + DC - 1u) / DC;
  for (var kt = kt0; kt < kt1; kt++) {
    let s0 = kt * KT;
    let key_end = min(n_keys, s0 + KT);
    // ---- scores ----
    let sk = s0 + 2u * lq;  // the loader's keys: sk, sk + 1, sk + 32, sk + 33
    let kb = vec4<u32>(key_base(sk, key_end, begin, kvh, false), key_base(sk + 1u, key_end, begin, kvh, false),
                       key_base(sk + 32u, key_end, begin, kvh, false), key_base(sk + 33u, key_end, begin, kvh, false));
    var pq = vec4<f32>(q_at(qb.x, dl), q_at(qb.y, dl), q_at(qb.z, dl), q_at(qb.w, dl));
    var pk = vec4<f32>(kv_at(kb.x, sk, dl, false), kv_at(kb.y, sk + 1u, dl, false),
                       kv_at(kb.z, sk + 32u, dl, false), kv_at(kb.w, sk + 33u, dl, false));
    var sc0 = vec4<f32>(0.0);  // rows 4ty..+3 × key 2tx
    var sc1 = vec4<f32>(0.0);  // ... × key 2tx + 1
    var sc2 = vec4<f32>(0.0);  // ... × key 32 + 2tx
    var sc3 = vec4<f32>(0.0);  // ... × key 33 + 2tx
    for (var c = 0u; c < n_dc; c++) {
      buf[st_q] = pq;
      buf[256u + st_q] = pk;
      workgroupBarrier();
      if (c + 1u < n_dc) {
        let d = (c + 1u) * DC + dl;
        pq = vec4<f32>(q_at(qb.x, d), q_at(qb.y, d), q_at(qb.z, d), q_at(qb.w, d));
        pk = vec4<f32>(kv_at(kb.x, sk, d, false), kv_at(kb.y, sk + 1u, d, false),
                       kv_at(kb.z, sk + 32u, d, false), kv_at(kb.w, sk + 33u, d, false));
      }
      for (var dd = 0u; dd < DC; dd++) {
        let qv = buf[dd * 16u + swz(dd, ty)];
        let kv = buf[256u + dd * 16u + swz(dd, tx)];
        sc0 = fma(qv, vec4<f32>(kv.x), sc0);
        sc1 = fma(qv, vec4<f32>(kv.y), sc1);
        sc2 = fma(qv, vec4<f32>(kv.z), sc2);
        sc3 = fma(qv, vec4<f32>(kv.w), sc3);
      }
      workgroupBarrier();
    }
    // ---- online softmax ----
    let j0 = s0 + 2u * tx;
    let ok0 = vec4<u32>(j0) < lim;
    let ok1 = vec4<u32>(j0 + 1u) < lim;
    let ok2 = vec4<u32>(j0 + 32u) < lim;
    let ok3 = vec4<u32>(j0 + 33u) < lim;
    sc0 = select(vec4<f32>(NEG_BIG), sc0 * p.scale, ok0);
    sc1 = select(vec4<f32>(NEG_BIG), sc1 * p.scale, ok1);
    sc2 = select(vec4<f32>(NEG_BIG), sc2 * p.scale, ok2);
    sc3 = select(vec4<f32>(NEG_BIG), sc3 * p.scale, ok3);
    buf[KOFF + tx * 16u + swz(tx, ty)] = max(max(sc0, sc1), max(sc2, sc3));
    workgroupBarrier();
    let m_new = red_max(ty, m);
    let f = exp(m - m_new);
    m = m_new;
    let p0 = select(vec4<f32>(0.0), exp(sc0 - m), ok0);
    let p1 = select(vec4<f32>(0.0), exp(sc1 - m), ok1);
    let p2 = select(vec4<f32>(0.0), exp(sc2 - m), ok2);
    let p3 = select(vec4<f32>(0.0), exp(sc3 - m), ok3);
    l = l * f + ((p0 + p1) + (p2 + p3));
    // ---- O = O·f + P·V ----
    a00 *= f.x; a01 *= f.x; a02 *= f.x; a03 *= f.x;
    a10 *= f.y; a11 *= f.y; a12 *= f.y; a13 *= f.y;
    a20 *= f.z; a21 *= f.z; a22 *= f.z; a23 *= f.z;
    a30 *= f.w; a31 *= f.w; a32 *= f.w; a33 *= f.w;
    // Loader role: key lid / 64 of the chunk, dims 4·(lid % 64)..+3.
    let vj = lid / 64u;
    let vd = 4u * (lid % 64u);
    for (var h = 0u; h < 2u; h++) {
      let h0 = s0 + 32u * h;  // the half's first key
      if (h0 >= key_end) {
        break;
      }
      // P row j (key h0 + j) holds quad c at j·16 + (c ^ ((j / 2) & 7)): the 8 invocations of a store
      // wavefront (8 tx, one ty) write rows 2tx + e, so they hit 8 bank groups.
      let pb = 32u * tx + swz(tx, ty);
      buf[pb] = select(p0, p2, h == 1u);
      buf[pb + 16u] = select(p1, p3, h == 1u);
      workgroupBarrier();
      let n_vc = (min(key_end - h0, 32u) + VC - 1u) / VC;
      var sv = h0 + vj;
      var vb = key_base(sv, key_end, begin, kvh, true);
      var pv = vec4<f32>(kv_at(vb, sv, vd, true), kv_at(vb, sv, vd + 1u, true), kv_at(vb, sv, vd + 2u, true),
                         kv_at(vb, sv, vd + 3u, true));
      for (var c = 0u; c < n_vc; c++) {
        buf[KOFF + lid] = pv;
        workgroupBarrier();
        if (c + 1u < n_vc) {
          sv += VC;
          vb = key_base(sv, key_end, begin, kvh, true);
          pv = vec4<f32>(kv_at(vb, sv, vd, true), kv_at(vb, sv, vd + 1u, true), kv_at(vb, sv, vd + 2u, true),
                         kv_at(vb, sv, vd + 3u, true));
        }
        for (var jj = 0u; jj < VC; jj++) {
          let j = c * VC + jj;
          let pr = buf[j * 16u + swz(j / 2u, ty)];
          let vq = KOFF + jj * 64u + tx;
          let v0 = buf[vq];
          let v1 = buf[vq + 16u];
          let v2 = buf[vq + 32u];
          let v3 = buf[vq + 48u];
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
  }
  // The rows' sums over all 16 invocations' keys (`red` is free: the last value chunk ended in a
  // barrier, and a work item has at least one key tile).
  buf[KOFF + tx * 16u + swz(tx, ty)] = l;
  workgroupBarrier();
  var sum = vec4<f32>(0.0);
  for (var t = 0u; t < 16u; t++) {
    sum += buf[KOFF + t * 16u + swz(t, ty)];
  }
  let sp = vec2<u32>(split, n_splits);
  store_rows(0u, lim[0], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.x, sum.x), a00, a01, a02, a03);
  store_rows(1u, lim[1], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.y, sum.y), a10, a11, a12, a13);
  store_rows(2u, lim[2], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.z, sum.z), a20, a21, a22, a23);
  store_rows(3u, lim[3], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.w, sum.w), a30, a31, a32, a33);
}

// Row 4ty + i of the workgroup (lim = 0: invalid), dim quads tx + 16u, with its running max and sum
// ml: normalised into out (the tile's split count sp.y = 1) or unnormalised into part as split sp.x,
// with (m, l).
fn store_rows(i: u32, lim: u32, ty: u32, tx: u32, hchunk: u32, kvh: u32, t0: u32, sp: vec2<u32>, ml: vec2<f32>,
              o0: vec4<f32>, o1: vec4<f32>, o2: vec4<f32>, o3: vec4<f32>) {
  if (lim == 0u) {
    return;
  }
  let r = 4u * ty + i;
  let t = t0 + r / p.gw;
  let head = kvh * (p.h / p.hkv) + hchunk * p.gw + r % p.gw;
  var o = array<vec4<f32>, 4>(o0, o1, o2, o3);
  if (sp.y == 1u) {
    let inv = 1.0 / ml.y;
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
    part[sb] = ml.x;
    part[sb + 1u] = ml.y;
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
