// Gated delta rule, chunked (WY/UT form), part 1 of 2: the state-independent matrices of one chunk.
// With C = 64, a chunk of cn tokens t0..t0+cn−1, value head h (key head kh = h / (Hv/Hk)):
//   D_ij = exp(Σ_{t=j+1..i} g_t) (j <= i), summed pairwise so a large earlier decay never cancels
//   against a small later one (WGSL has no f64 for a cumulative Γ);  γ_i = exp(Σ_{t<=i} g_t);
//   dlast_j = D_{cn−1,j};  L_ij = β_i (k_i·k_j) D_ij (j < i);  T = (I + L)⁻¹ (unit lower triangular,
//   forward substitution row by row);  W = T diag(β⊙γ) K;  Tβ = T diag(β);
//   P_ij = (q_i·k_j) D_ij (j <= i).
// Part 2 (gated_delta_net.wgsl) then needs only v, q, k and these: Δ = Tβ V − W S, etc.
//
// Layout: q, k [n,Hk,dk], g, beta [n,Hv] (outer strides free); table (u32): chunk ci at
// chunk_base + 2·ci holds (t0, cn); scratch region of (ci, h) at (ci·Hv + h)·region:
//   Tβ [C×C] | P [C×C] | W [C×dk] | γ [C] | dlast [C]  (rows >= cn zero). L lives in P's slot until
//   T is solved; T itself stays in workgroup memory.
// Launch: one workgroup of 256 invocations per (chunk, value head): n_chunks·Hv workgroups (folded);
// invocation lid owns the pairs lid + 256u, u < 16, of the 64×64 chunk matrices, whose k·k and q·k dot
// products it accumulates over dk in slabs of 16 staged in workgroup memory; the same 8.1 KiB then
// hold T's lower triangle during the solve (plus g, β, γ: 8.9 KiB in all).

struct Params {
  hk: u32, hv: u32, dk: u32, n_chunks: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, g_off: u32, g_st: u32,
  b_off: u32, b_st: u32, chunk_base: u32, region: u32,
  // Always 16; a run-time bound keeps shader compilers from unrolling the pair loops (llvmpipe took over
  // a minute to compile the unrolled form).
  pairs: u32, pad0: u32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> g: array<f32>;
@group(0) @binding(4) var<storage, read_write> beta: array<f32>;
@group(0) @binding(5) var<storage, read_write> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;

const C: u32 = 64u;

var<workgroup> gs: array<f32, 64>;
var<workgroup> bs: array<f32, 64>;
var<workgroup> gam: array<f32, 64>;
const SLAB: u32 = 16u;
// First k and q slabs of the chunk ([C][SLAB] each, dims d0..d0+15, at 0 and C·SLAB), then the
// lower triangle of T packed by rows (T_ic at i(i+1)/2 + c).
var<workgroup> wsm: array<f32, 2080>;

// Σ_{t=j+1..i} g_t within the chunk.
fn decay_sum(j: u32, i: u32) -> f32 {
  var s = 0.0;
  for (var t = j + 1u; t <= i; t++) {
    s += gs[t];
  }
  return s;
}

@compute @workgroup_size(256)
fn prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_chunks * p.hv) {
    return;
  }
  let ci = item / p.hv;
  let h = item % p.hv;
  let kh = h / (p.hv / p.hk);
  let t0 = table[p.chunk_base + 2u * ci];
  let cn = table[p.chunk_base + 2u * ci + 1u];
  let base = item * p.region;
  let tb_at = base;
  let p_at = base + C * C;
  let w_at = base + 2u * C * C;
  let gam_at = w_at + C * p.dk;
  let dl_at = gam_at + C;
  let qb = p.q_off + kh * p.q_st1;
  let kb = p.k_off + kh * p.k_st1;

  if (lid < C) {
    var gv = 0.0;
    var bv = 0.0;
    if (lid < cn) {
      gv = g[p.g_off + (t0 + lid) * p.g_st + h];
      bv = beta[p.b_off + (t0 + lid) * p.b_st + h];
    }
    gs[lid] = gv;
    bs[lid] = bv;
  }
  workgroupBarrier();
  if (lid < C) {
    var gm = 0.0;
    var dl = 0.0;
    if (lid < cn) {
      var s = 0.0;
      for (var t = 0u; t <= lid; t++) {
        s += gs[t];
      }
      gm = exp(s);
      dl = exp(decay_sum(lid, cn - 1u));
    }
    gam[lid] = gm;
    scratch[gam_at + lid] = gm;
    scratch[dl_at + lid] = dl;
  }
  // k_i·k_j and q_i·k_j for this invocation's 16 pairs (i, j) = (idx / C, idx % C), idx = lid + 256u,
  // accumulated over dk in slabs of 16 staged in workgroup memory.
  var kk: array<f32, 16>;
  var qk: array<f32, 16>;
  for (var d0 = 0u; d0 < p.dk; d0 += SLAB) {
    for (var e = lid; e < C * SLAB; e += 256u) {
      let t = e / SLAB;
      let d = d0 + e % SLAB;
      var kv = 0.0;
      var qv = 0.0;
      if (t < cn && d < p.dk) {
        kv = k[kb + (t0 + t) * p.k_st0 + d];
        qv = q[qb + (t0 + t) * p.q_st0 + d];
      }
      wsm[e] = kv;
      wsm[C * SLAB + e] = qv;
    }
    workgroupBarrier();
    for (var u = 0u; u < p.pairs; u++) {
      let idx = lid + u * 256u;
      let i = idx / C;
      let j = idx % C;
      var a = kk[u];
      var b = qk[u];
      for (var d = 0u; d < SLAB; d++) {
        let kj = wsm[j * SLAB + d];
        a = fma(wsm[i * SLAB + d], kj, a);
        b = fma(wsm[C * SLAB + i * SLAB + d], kj, b);
      }
      kk[u] = a;
      qk[u] = b;
    }
    workgroupBarrier();
  }
  // L (into P's slot until T is solved) and P, kept in registers meanwhile.
  var pv: array<f32, 16>;
  for (var u = 0u; u < p.pairs; u++) {
    let idx = lid + u * 256u;
    let i = idx / C;
    let j = idx % C;
    var lv = 0.0;
    var pval = 0.0;
    if (i < cn && j <= i) {
      let dij = exp(decay_sum(j, i));
      pval = qk[u] * dij;
      if (j < i) {
        lv = bs[i] * kk[u] * dij;
      }
    }
    pv[u] = pval;
    scratch[p_at + idx] = lv;
  }
  storageBarrier();
  workgroupBarrier();
  // T = (I + L)⁻¹ by forward substitution, one row per step, the row's columns in parallel:
  // T_ic = −Σ_{c<=j<i} L_ij T_jc (c < i), T_ii = 1; rows >= cn are zero. L_ij is read by every
  // invocation at once (one address); T stays in workgroup memory.
  for (var i = 0u; i < C; i++) {
    if (lid <= i) {
      let c = lid;
      var tv = 0.0;
      if (i < cn) {
        if (c == i) {
          tv = 1.0;
        } else {
          for (var j = c; j < i; j++) {
            tv = fma(-scratch[p_at + i * C + j], wsm[j * (j + 1u) / 2u + c], tv);
          }
        }
      }
      wsm[i * (i + 1u) / 2u + c] = tv;
    }
    workgroupBarrier();
  }
  // W = T diag(β⊙γ) K, and P = tril(QKᵀ ⊙ D) over L's slot (L is no longer needed).
  for (var idx = lid; idx < C * p.dk; idx += 256u) {
    let i = idx / p.dk;
    let d = idx % p.dk;
    var wv = 0.0;
    if (i < cn) {
      for (var j = 0u; j <= i; j++) {
        wv = fma(wsm[i * (i + 1u) / 2u + j] * bs[j] * gam[j], k[kb + (t0 + j) * p.k_st0 + d], wv);
      }
    }
    scratch[w_at + idx] = wv;
  }
  for (var u = 0u; u < p.pairs; u++) {
    let idx = lid + u * 256u;
    let i = idx / C;
    let j = idx % C;
    scratch[p_at + idx] = pv[u];
    var tb = 0.0;
    if (j <= i) {
      tb = wsm[i * (i + 1u) / 2u + j] * bs[j];
    }
    scratch[tb_at + idx] = tb;
  }
}
