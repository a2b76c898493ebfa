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
// (ty, tx) = (lid / 16, lid % 16) owns rows 4ty..4ty+3 throughout and keys tx + 16a (a < 4) of each
// key tile. Everything goes through one workgroup array `buf` (which also hands the tile data to
// every invocation at the start), in phases that barriers keep apart:
// - scores S[64 rows × 64 keys] = Q·Kᵀ in registers (4 rows × 4 keys per invocation, 16 FMAs per two
//   16-byte shared loads), over hd in chunks of QK_DC dims staged k-major: Q [QK_DC][16 row quads],
//   then K [QK_DC][16 key quads] (key quad c = keys c, c+16, c+32, c+48), loaded by invocation
//   (dim lid % QK_DC, quads lid / QK_DC + 8i) so that a warp's load is one 128-byte line of a row,
//   quad index XOR-swizzled with the row (`sidx`), so that the 8 invocations of a store wavefront
//   (8 consecutive dims of one quad) hit 8 bank groups; one stage, two barriers per chunk (on the
//   H200 faster than two stages of 16 dims with one barrier each, or chunks of 64 dims in 32 KiB:
//   docs/backends.md); Q is re-staged per key tile (64 rows × hd does not fit).
// - online softmax in FP32 per row: each invocation's max over its 4 keys goes to `red` [16 tx][16 row
//   quads] and every invocation of a row reads all 16, so all hold the same running max m (registers)
//   and rescale by exp(old m − new m); each keeps the running sum l of its own keys only, summed over
//   the 16 once at the end. Masked keys contribute exactly 0.
// - O[64 × hd] += P·V: p of 32 keys at a time in workgroup memory ([32 keys][16 row quads] at 0,
//   swizzled as above; the second half is stored once every invocation is done with the first), the
//   invocation owning dim quads tx + 16u (u < 4) of its rows in 16 vec4 registers; values staged VC
//   keys at a time in two stages after p (one barrier per chunk); `red` lies in the second value
//   stage, which is first written after the barrier that follows the maxima's reads.
// The next chunk's global loads (Q/K, V, and across the phases: the tile's first value chunk during
// its last score chunk, the next tile's first score chunk during its last value chunk) are issued
// before the current chunk's FMAs (register prefetch). Loads past a tile's last key or past hd read
// the last key or dim instead (their products reach only masked scores and unstored outputs); only
// Q is zeroed past hd. Invalid query rows read the tile's first row (never stored).
// Measured on the H200 and dropped (docs/backends.md, "Attention: larger score blocks, deeper
// prefetch"): 4 rows × 8 keys of scores per invocation over 128-key steps (a quarter fewer shared
// loads per FMA, Q staged and the maxima exchanged once per 128 keys; 16- or 32-dim score chunks):
// 2,187 tokens 1.53–1.58 → 1.54–1.62 ms, the small passes slower; loads issued two chunks ahead (one
// more register set): values only 1.55 → 1.56–1.58 ms, values and scores 1.65–1.68. So neither the
// shared loads nor the load latency within a chunk looks like the limit; the variants holding more
// registers were the slower ones. Nor are the registers (H200, coordinator's round 3, 2026-12-02; half
// the O registers, 32 per invocation, in both): 32 query rows a workgroup (4 rows × 2 keys of scores,
// 4 rows × 8 dims of O) 2,187 tokens 1.56 / 1.58 → 2.02 / 2.04 ms, 700 tokens 0.29 → 0.38 (only the
// split pass over 2,187 keys faster, 0.43 → 0.40); O's head dims over two workgroups, each computing
// Q·Kᵀ (1.5× the products) → 2.37 / 2.38 ms. The time follows the work per workgroup.
// This layout compiles to 216 registers on NVIDIA (one workgroup an SM); trimming what lives beside the
// 80 accumulators (16-dim score chunks, all of p staged in 24 KiB, no register prefetch, loops not
// fully unrollable) leaves 203–214 and no form is faster (H100, docs/backends.md "Twenty-second session").
// A tile with S_i = 1: the workgroup writes out normalised. S_i > 1 (flash-decoding): each split
// writes its rows' unnormalised output, running max m and sum l to `part` (O at [split][t][h][hd] for
// split < max_splits, then (m, l) at [split][t][h]); `attention_combine` (one 64-invocation
// workgroup per (token, head); tokens of unsplit tiles return at once) merges them:
// m* = max_s m_s, out = Σ_s e^{m_s−m*} O_s / Σ_s e^{m_s−m*} l_s. A split that saw no visible key of a
// row leaves m = −3e38, l = 0, O = 0 (weight 0).
// Preconditions (supports()): hd <= 256, Hkv divides H; exp is WGSL's FP32 exp. A binding holds
// fewer than 2^31 floats (storage bindings stay below 4 GiB), so a row base's top bit is free for
// PREFIX.

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
const PREFIX: u32 = 0x80000000u;  // flag bit of a key or value row base: the row is in prefix_k / prefix_v
const KT: u32 = 64u;      // keys per key tile
const QK_DC: u32 = 32u;   // dims per score chunk (a multiple of 16)
const VC: u32 = 4u;       // keys per value chunk (a multiple of 4 dividing 32)
const QK_QL: u32 = 256u / QK_DC;   // quads loaded per pass of the 256 loaders over a score chunk
const QK_NQ: u32 = 16u / QK_QL;    // Q and K quads each invocation loads per score chunk
const K_OFF: u32 = QK_DC * 16u;    // the K chunk, after the Q chunk
const V_OFF: u32 = 32u * 16u;      // the value stages, after p
const V_STAGE: u32 = VC * 64u;
const RED: u32 = V_OFF + V_STAGE;  // row maxima and sums [16][16], in the second value stage
const BUF: u32 = max(2u * K_OFF, V_OFF + 2u * V_STAGE);  // 16 KiB

var<workgroup> buf: array<vec4<f32>, BUF>;

// Index of quad c of staged row r (Q / K chunks: r a dim; p: r a key), XOR-swizzled.
fn sidx(r: u32, c: u32) -> u32 {
  return r * 16u + (c ^ (r & 7u));
}

// Index of tx's entry for row quad ty in `red` (8 tx of one ty hit 8 bank groups).
fn ridx(tx: u32, ty: u32) -> u32 {
  return RED + tx * 16u + (ty ^ (tx & 7u));
}

// Base of the key (value = false) or value row of key s (prefix first) of KV head kvh, for a sequence
// starting at token `begin`, s clamped to the tile's last key key_end − 1; PREFIX set for prefix rows.
fn kv_base(s: u32, key_end: u32, begin: u32, kvh: u32, value: bool) -> u32 {
  let sc = min(s, key_end - 1u);
  if (sc < p.ls) {
    return PREFIX | select(p.pk_off + sc * p.pk_st0 + kvh * p.pk_st1, p.pv_off + sc * p.pv_st0 + kvh * p.pv_st1,
                           value);
  }
  let t = begin + sc - p.ls;
  return select(p.k_off + t * p.k_st0 + kvh * p.k_st1, p.v_off + t * p.v_st0 + kvh * p.v_st1, value);
}

// Element d (clamped to hd − 1) of the key row with base b.
fn k_at(b: u32, d: u32) -> f32 {
  let dc = min(d, p.hd - 1u);
  if (b >= PREFIX) {
    return prefix_k[(b ^ PREFIX) + dc];
  }
  return k[b + dc];
}

// Dims d..d+3 (clamped to hd − 1) of the value row with base b.
fn v_at(b: u32, d: u32) -> vec4<f32> {
  let last = p.hd - 1u;
  if (b >= PREFIX) {
    let pb = b ^ PREFIX;
    return vec4<f32>(prefix_v[pb + min(d, last)], prefix_v[pb + min(d + 1u, last)], prefix_v[pb + min(d + 2u, last)],
                     prefix_v[pb + min(d + 3u, last)]);
  }
  return vec4<f32>(v[b + min(d, last)], v[b + min(d + 1u, last)], v[b + min(d + 2u, last)], v[b + min(d + 3u, last)]);
}

// Element d of the query row with base qb, 0 past hd.
fn q_at(qb: u32, d: u32) -> f32 {
  return select(0.0, q[qb + min(d, p.hd - 1u)], d < p.hd);
}

// The key bases of key quad c of the tile at s0 (keys c, c+16, c+32, c+48).
fn k_bases(s0: u32, key_end: u32, begin: u32, kvh: u32, c: u32) -> vec4<u32> {
  let s = s0 + c;
  return vec4<u32>(kv_base(s, key_end, begin, kvh, false), kv_base(s + 16u, key_end, begin, kvh, false),
                   kv_base(s + 32u, key_end, begin, kvh, false), kv_base(s + 48u, key_end, begin, kvh, false));
}

// Row r of a workgroup (token tau0 + r / gw of the sequence at `begin`, head kvh·G + hchunk·gw + r % gw):
// x, the keys it sees (s < x; 0: an invalid row) and y, its query row base (invalid rows: the tile's first row).
fn query_row(r: u32, begin: u32, tau0: u32, count: u32, hchunk: u32, kvh: u32) -> vec2<u32> {
  let g = p.h / p.hkv;
  let hh = hchunk * p.gw + r % p.gw;
  let ok = r / p.gw < count && hh < g;
  return vec2<u32>(select(0u, p.ls + tau0 + r / p.gw + 1u, ok),
                   p.q_off + (begin + tau0 + select(0u, r / p.gw, ok)) * p.q_st0 +
                       (kvh * g + select(hchunk * p.gw, hh, ok)) * p.q_st1);
}

// A loader's part of one score chunk: dim d of its Q row quads and K key quads lq + QK_QL·i (i < QK_NQ).
struct QkRegs {
  q: array<vec4<f32>, QK_NQ>,
  k: array<vec4<f32>, QK_NQ>,
}

fn load_qk(qb: array<vec4<u32>, QK_NQ>, kb: array<vec4<u32>, QK_NQ>, d: u32) -> QkRegs {
  var r: QkRegs;
  for (var i = 0u; i < QK_NQ; i++) {
    r.q[i] = vec4<f32>(q_at(qb[i].x, d), q_at(qb[i].y, d), q_at(qb[i].z, d), q_at(qb[i].w, d));
    r.k[i] = vec4<f32>(k_at(kb[i].x, d), k_at(kb[i].y, d), k_at(kb[i].z, d), k_at(kb[i].w, d));
  }
  return r;
}

// The key bases of a loader's key quads lq + QK_QL·i of the tile at s0.
fn loader_k_bases(s0: u32, key_end: u32, begin: u32, kvh: u32, lq: u32) -> array<vec4<u32>, QK_NQ> {
  var kb: array<vec4<u32>, QK_NQ>;
  for (var i = 0u; i < QK_NQ; i++) {
    kb[i] = k_bases(s0, key_end, begin, kvh, lq + QK_QL * i);
  }
  return kb;
}

// Stores them as row dl, quads lq + QK_QL·i, of the Q and K chunks.
fn store_qk(r: QkRegs, dl: u32, lq: u32) {
  for (var i = 0u; i < QK_NQ; i++) {
    let at = sidx(dl, lq + QK_QL * i);
    buf[at] = r.q[i];
    buf[K_OFF + at] = r.k[i];
  }
}

// A loader's part of one value chunk: dims 4vq..4vq+3 of keys vj0 + 4i (i < VC / 4) of the chunk at s.
fn load_v(s: u32, key_end: u32, begin: u32, kvh: u32, vj0: u32, vq: u32) -> array<vec4<f32>, VC / 4u> {
  var r: array<vec4<f32>, VC / 4u>;
  for (var i = 0u; i < VC / 4u; i++) {
    r[i] = v_at(kv_base(s + vj0 + 4u * i, key_end, begin, kvh, true), 4u * vq);
  }
  return r;
}

// Value stage of value chunk vc.
fn v_base(vc: u32) -> u32 {
  return V_OFF + (vc & 1u) * V_STAGE;
}

fn store_v(r: array<vec4<f32>, VC / 4u>, base: u32, vj0: u32, vq: u32) {
  for (var i = 0u; i < VC / 4u; i++) {
    buf[base + (vj0 + 4u * i) * 64u + vq] = r[i];
  }
}

// Scores of rows 4ty..+3 × keys tx + 16a (a < 4) in sa.
struct Scores {
  s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>,
}

// One staged score chunk.
fn qk_chunk(sc: Scores, ty: u32, tx: u32) -> Scores {
  var r = sc;
  for (var dd = 0u; dd < QK_DC; dd++) {
    let qv = buf[sidx(dd, ty)];
    let kv = buf[K_OFF + sidx(dd, tx)];
    r.s0 = fma(qv, vec4<f32>(kv.x), r.s0);
    r.s1 = fma(qv, vec4<f32>(kv.y), r.s1);
    r.s2 = fma(qv, vec4<f32>(kv.z), r.s2);
    r.s3 = fma(qv, vec4<f32>(kv.w), r.s3);
  }
  return r;
}

// O of rows 4ty..+3 (oi: row i, Block4 rows rU = dim quad tx + 16U).
struct Out {
  o0: Block4, o1: Block4, o2: Block4, o3: Block4,
}

fn scale_out(o: Out, f: vec4<f32>) -> Out {
  return Out(Block4(o.o0.r0 * f.x, o.o0.r1 * f.x, o.o0.r2 * f.x, o.o0.r3 * f.x),
             Block4(o.o1.r0 * f.y, o.o1.r1 * f.y, o.o1.r2 * f.y, o.o1.r3 * f.y),
             Block4(o.o2.r0 * f.z, o.o2.r1 * f.z, o.o2.r2 * f.z, o.o2.r3 * f.z),
             Block4(o.o3.r0 * f.w, o.o3.r1 * f.w, o.o3.r2 * f.w, o.o3.r3 * f.w));
}

// Stores p of this invocation's keys tx + 32h (pa) and tx + 16 + 32h (pb) as rows of the p half.
fn p_store(pa: vec4<f32>, pb: vec4<f32>, ty: u32, tx: u32) {
  buf[sidx(tx, ty)] = pa;
  buf[sidx(16u + tx, ty)] = pb;
}

// O += P·V over value chunk vc (keys VC·vc.. of the tile, p from the stored half).
fn pv_chunk(o: Out, vc: u32, ty: u32, tx: u32) -> Out {
  var r = o;
  let vs = v_base(vc);
  for (var jj = 0u; jj < VC; jj++) {
    let pr = buf[sidx((vc * VC + jj) & 31u, ty)];
    let vb = vs + jj * 64u + tx;
    let v0 = buf[vb];
    let v1 = buf[vb + 16u];
    let v2 = buf[vb + 32u];
    let v3 = buf[vb + 48u];
    r.o0 = Block4(fma(vec4<f32>(pr.x), v0, r.o0.r0), fma(vec4<f32>(pr.x), v1, r.o0.r1),
                  fma(vec4<f32>(pr.x), v2, r.o0.r2), fma(vec4<f32>(pr.x), v3, r.o0.r3));
    r.o1 = Block4(fma(vec4<f32>(pr.y), v0, r.o1.r0), fma(vec4<f32>(pr.y), v1, r.o1.r1),
                  fma(vec4<f32>(pr.y), v2, r.o1.r2), fma(vec4<f32>(pr.y), v3, r.o1.r3));
    r.o2 = Block4(fma(vec4<f32>(pr.z), v0, r.o2.r0), fma(vec4<f32>(pr.z), v1, r.o2.r1),
                  fma(vec4<f32>(pr.z), v2, r.o2.r2), fma(vec4<f32>(pr.z), v3, r.o2.r3));
    r.o3 = Block4(fma(vec4<f32>(pr.w), v0, r.o3.r0), fma(vec4<f32>(pr.w), v1, r.o3.r1),
                  fma(vec4<f32>(pr.w), v2, r.o3.r2), fma(vec4<f32>(pr.w), v3, r.o3.r3));
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
  if (lid == 0u) {
    let w = p.work_base + 4u * work;
    let ti = 4u * tiles[w];
    buf[0] = bitcast<vec4<f32>>(vec4<u32>(tiles[w], tiles[w + 1u], tiles[w + 2u], tiles[w + 3u]));
    buf[1] = bitcast<vec4<f32>>(vec4<u32>(tiles[ti], tiles[ti + 1u], tiles[ti + 2u], tiles[ti + 3u]));
  }
  let winfo = bitcast<vec4<u32>>(workgroupUniformLoad(&buf[0]));
  let info = bitcast<vec4<u32>>(workgroupUniformLoad(&buf[1]));
  let begin = info.x;
  let tau0 = info.y;
  let count = info.z;
  let n_splits = info.w;
  let kt0 = winfo.y;
  let kt1 = winfo.z;
  let split = winfo.w;
  let n_keys = p.ls + tau0 + count;

  // ty masked to 0..15 (a no-op for lid < 256) so that the shader compiler can prove the shared read
  // indices in the inner loops within `buf` and drop Dawn's robustness clamp from each of them; tx is
  // bounded already.
  let ty = (lid / 16u) & 15u;
  let tx = lid % 16u;
  var lim: vec4<u32>;  // rows 4ty..4ty+3 see keys s < lim (0: an invalid row)
  for (var i = 0u; i < 4u; i++) {
    lim[i] = query_row(4u * ty + i, begin, tau0, count, hchunk, kvh).x;
  }
  // Score chunk loader role: dim dl of Q row quads and K key quads lq + QK_QL·i, so that a warp's
  // load reads QK_DC consecutive floats of one row (a whole 128-byte line at QK_DC = 32).
  let dl = lid % QK_DC;
  let lq = lid / QK_DC;
  var qb: array<vec4<u32>, QK_NQ>;  // the loader's query row bases
  for (var i = 0u; i < QK_NQ; i++) {
    for (var j = 0u; j < 4u; j++) {
      qb[i][j] = query_row(4u * (lq + QK_QL * i) + j, begin, tau0, count, hchunk, kvh).y;
    }
  }
  // Value loader role: dim quad vq, keys vj0 + 4i of the chunk.
  let vq = lid % 64u;
  let vj0 = lid / 64u;

  var m = vec4<f32>(NEG_BIG);  // running max of rows 4ty..+3 (the same in all 16 invocations of a row)
  var l = vec4<f32>(0.0);      // running sum of exp(score − m) over this invocation's keys
  var o = Out(zero_block4(), zero_block4(), zero_block4(), zero_block4());

  let n_dc = (p.hd + QK_DC - 1u) / QK_DC;
  var kb = loader_k_bases(kt0 * KT, min(n_keys, kt0 * KT + KT), begin, kvh, lq);
  var rqk = load_qk(qb, kb, dl);
  for (var kt = kt0; kt < kt1; kt++) {
    let s0 = kt * KT;
    let key_end = min(n_keys, s0 + KT);
    // ---- scores ---- (each loop's last chunk comes after it, behind the next phase's first loads)
    workgroupBarrier();  // the previous tile's (or the tile data's) last reads are done
    store_qk(rqk, dl, lq);
    workgroupBarrier();
    var sc = Scores(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var c = 0u; c + 1u < n_dc; c++) {
      rqk = load_qk(qb, kb, (c + 1u) * QK_DC + dl);
      sc = qk_chunk(sc, ty, tx);
      workgroupBarrier();
      store_qk(rqk, dl, lq);
      workgroupBarrier();
    }
    var rv = load_v(s0, key_end, begin, kvh, vj0, vq);
    sc = qk_chunk(sc, ty, tx);
    // ---- online softmax ----
    let j0 = s0 + tx;
    let ok0 = vec4<u32>(j0) < lim;
    let ok1 = vec4<u32>(j0 + 16u) < lim;
    let ok2 = vec4<u32>(j0 + 32u) < lim;
    let ok3 = vec4<u32>(j0 + 48u) < lim;
    let sc0 = select(vec4<f32>(NEG_BIG), sc.s0 * p.scale, ok0);
    let sc1 = select(vec4<f32>(NEG_BIG), sc.s1 * p.scale, ok1);
    let sc2 = select(vec4<f32>(NEG_BIG), sc.s2 * p.scale, ok2);
    let sc3 = select(vec4<f32>(NEG_BIG), sc.s3 * p.scale, ok3);
    workgroupBarrier();  // the last score chunk's reads are done
    buf[ridx(tx, ty)] = max(max(sc0, sc1), max(sc2, sc3));
    workgroupBarrier();
    var m_new = m;
    for (var t = 0u; t < 16u; t++) {
      m_new = max(m_new, buf[ridx(t, ty)]);
    }
    let f = exp(m - m_new);
    m = m_new;
    let p0 = select(vec4<f32>(0.0), exp(sc0 - m), ok0);
    let p1 = select(vec4<f32>(0.0), exp(sc1 - m), ok1);
    let p2 = select(vec4<f32>(0.0), exp(sc2 - m), ok2);
    let p3 = select(vec4<f32>(0.0), exp(sc3 - m), ok3);
    l = l * f + ((p0 + p1) + (p2 + p3));
    // ---- O = O·f + P·V ----
    o = scale_out(o, f);
    p_store(p0, p1, ty, tx);
    store_v(rv, v_base(0u), vj0, vq);
    workgroupBarrier();
    let n_vc = (key_end - s0 + VC - 1u) / VC;
    for (var vc = 0u; vc + 1u < n_vc; vc++) {
      rv = load_v(s0 + (vc + 1u) * VC, key_end, begin, kvh, vj0, vq);
      o = pv_chunk(o, vc, ty, tx);
      store_v(rv, v_base(vc + 1u), vj0, vq);
      if ((vc + 1u) * VC == 32u) {
        workgroupBarrier();  // every invocation is done with the first half's p
        p_store(p2, p3, ty, tx);
      }
      workgroupBarrier();
    }
    // The next tile's first score chunk (past the last tile: loads of its clamped last key, unused).
    kb = loader_k_bases(s0 + KT, min(n_keys, s0 + 2u * KT), begin, kvh, lq);
    rqk = load_qk(qb, kb, dl);
    o = pv_chunk(o, n_vc - 1u, ty, tx);
  }
  // The rows' sums over all 16 invocations' keys, in tx order.
  workgroupBarrier();  // the last value chunk's reads are done
  buf[ridx(tx, ty)] = l;
  workgroupBarrier();
  var sum = vec4<f32>(0.0);
  for (var t = 0u; t < 16u; t++) {
    sum += buf[ridx(t, ty)];
  }
  let sp = vec2<u32>(split, n_splits);
  store_rows(0u, lim[0], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.x, sum.x), o.o0);
  store_rows(1u, lim[1], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.y, sum.y), o.o1);
  store_rows(2u, lim[2], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.z, sum.z), o.o2);
  store_rows(3u, lim[3], ty, tx, hchunk, kvh, begin + tau0, sp, vec2<f32>(m.w, sum.w), o.o3);
}

// Row 4ty + i of the workgroup (lim = 0: invalid), dim quads tx + 16u, with its running max and sum
// ml: normalised into out (the tile's split count sp.y = 1) or unnormalised into part as split sp.x,
// with (m, l).
fn store_rows(i: u32, lim: u32, ty: u32, tx: u32, hchunk: u32, kvh: u32, t0: u32, sp: vec2<u32>, ml: vec2<f32>,
              ob4: Block4) {
  if (lim == 0u) {
    return;
  }
  let r = 4u * ty + i;
  let t = t0 + r / p.gw;
  let head = kvh * (p.h / p.hkv) + hchunk * p.gw + r % p.gw;
  let o = array<vec4<f32>, 4>(ob4.r0, ob4.r1, ob4.r2, ob4.r3);
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
