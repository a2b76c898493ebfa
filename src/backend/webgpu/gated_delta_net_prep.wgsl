// Gated delta rule, chunked (WY/UT form), part 1 of 3: everything about a chunk that does not depend on
// the state, for all chunks at once. With C = 64, a chunk of cn tokens t0..t0+cn−1, value head h (key
// head kh = h / (Hv/Hk)):
//   D_ij = exp(Σ_{t=j+1..i} g_t) (j <= i), never as a difference of cumulative sums, so a large
//   earlier decay cannot cancel against a small later one (WGSL has no f64 for a cumulative Γ):
//   within a 16-token block the terms are summed directly, across blocks as the tail of j's block +
//   whole block sums + the head of i's block, partial sums of terms g <= 0 that only add;
//   γ_i = exp(Σ_{t<=i} g_t);
//   dlast_j = D_{cn−1,j};  L_ij = β_i (k_i·k_j) D_ij (j < i);  T = (I + L)⁻¹ (unit lower triangular);
//   W = T diag(β⊙γ) K;  U = T diag(β) V;  P_ij = (q_i·k_j) D_ij (j <= i).
// Part 2 (gated_delta_net.wgsl) then runs Δ = U − W S, S ← γ_{cn−1} S + Kᵀ diag(dlast) Δ chunk by chunk,
// part 3 (gated_delta_net_out.wgsl) o = γ⊙(Q S) + P Δ for all chunks at once.
//
// Layout: q, k [n,Hk,dk], v [n,Hv,dv], g, beta [n,Hv] (outer strides free); table (u32): chunk ci at
// chunk_base + 3·ci holds (t0, cn, S nonzero); scratch region of (ci, h) at (ci·Hv + h)·region, P and W
// transposed so that a warp of parts 2 and 3 reads consecutive rows i (one cache line):
//   Pᵀ [C×C] (Pᵀ[j·C + i]) | Wᵀ [dk×C] (Wᵀ[d·C + i]) | U [C×dv] (row-major) | γ [C] | dlast [C] |
//   S [dk×dv] (the chunk's starting state, written by part 2);
// rows i >= cn are zero.
// Launch: one workgroup of 256 invocations per (chunk, value head): n_chunks·Hv workgroups (folded).
//   1. k·k and q·k: invocation (q4, tj) = (lid/16, lid%16) owns rows i = 4·q4 .. +3 and columns
//      j = tj + 16b (b < 4), accumulated in vec4 registers over dk in slabs of 16 dims staged
//      dim-major in workgroup memory: 6 loads (2 of them vec4) per 32 FMAs; invocations whose rows
//      lie wholly past a short chunk's cn skip the products. The next slab's global loads are
//      issued before the current slab's FMAs (as in step 3; on the H200 this measured the same as
//      loading each slab after the previous one's barrier: 0.87 ms per 2,187-token call either way).
//   2. T in place of L, by blocks of 16: the four diagonal blocks inverted at once (64 invocations,
//      one column each, 16 steps), then block rows I = 1..3: T_IJ = −T_II Σ_{K=J..I−1} L_IK T_KJ,
//      4 rows × 1 column per invocation.
//   3. W and U: [K | V] in slabs of 16 columns through workgroup memory, the next slab's global
//      loads issued before the current slab's FMAs; invocation owns 4 rows of one 16-row block and one
//      column, so its loop stops at the end of its block (and at cn); vec4 reads of T's columns and
//      the slab's: 5 loads per 16 FMAs.
// Workgroup memory (vec4 words, only ever written whole: WGSL lets a write to one component access
// the whole vector, so invocations writing neighbouring floats would race; matrices are stored
// column-major so that one invocation writes 4 consecutive rows): T's 10 lower 16×16 blocks
// (10 KiB, first holding the k/q slabs) + a 4.25 KiB slab + g, β, γ and the block partial sums of
// g: 15.5 KiB. The kernel's time follows this size more than its FMA count (presumably through how
// many workgroups share a multiprocessor): declared at 26 KiB, nothing else changed, the op took 1.18
// against 0.83–0.89 ms per 2,187-token call (H200, 2026-12-01), and W and U as 4×4 register blocks
// over 64-column slabs (2 loads per 16 FMAs instead of 5, 26 KiB) 1.07–1.13 ms. FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, g_off: u32, g_st: u32, b_off: u32,
  b_st: u32, n_chunks: u32, chunk_base: u32, region: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> table: array<u32>;
@group(0) @binding(7) var<storage, read_write> scratch: array<f32>;

const C: u32 = 64u;
const SLAB: u32 = 16u;
const ST: u32 = 68u;        // stride of the dim-major k/q slabs and of the transposed column slab
const Q_AT: u32 = 1088u;    // the q slab after the k slab (16·ST floats)
const XS_AT: u32 = 2560u;   // the column slab (and the diagonal inverses) after T's 10 blocks

var<workgroup> gs: array<f32, 64>;
var<workgroup> bs: array<f32, 64>;
var<workgroup> gam: array<f32, 64>;
var<workgroup> head: array<f32, 64>;   // Σ g_t from i's 16-block start to i (inclusive)
var<workgroup> tail: array<f32, 64>;   // Σ g_t from j + 1 to the end of j's 16-block
var<workgroup> whole: array<f32, 4>;   // Σ g_t over 16-block m
// Float offsets below. Step 1: k slab (token t, dim dd) at dd·ST + t, q slab at Q_AT + dd·ST + t.
// Steps 2-3: T's lower blocks (I, J), J <= I, at blk(I, J), element (r, c) at c·16 + r; then at
// XS_AT the diagonal inverses and the block-row sums (same layout, 256 floats each) and finally the
// [K | V] column slab, column c's 64 rows at XS_AT + c·ST.
var<workgroup> wsm: array<vec4<f32>, 912>;

fn ld(e: u32) -> f32 {
  return wsm[e >> 2u][e & 3u];
}

// The 4 floats at e (a multiple of 4).
fn ld4(e: u32) -> vec4<f32> {
  return wsm[e >> 2u];
}

fn st4(e: u32, x: vec4<f32>) {
  wsm[e >> 2u] = x;
}

fn blk(bi: u32, bj: u32) -> u32 {
  return (bi * (bi + 1u) / 2u + bj) * 256u;
}

// Σ_{t=j+1..i} g_t within the chunk (j <= i).
fn decay_sum(j: u32, i: u32) -> f32 {
  let bj = j / 16u;
  let bi = i / 16u;
  if (bj == bi) {
    var s = 0.0;
    for (var t = j + 1u; t <= i; t++) {
      s += gs[t];
    }
    return s;
  }
  var s = tail[j];
  for (var m = bj + 1u; m < bi; m++) {
    s += whole[m];
  }
  return s + head[i];
}

// Pairs (4·q4 + m, j), m < 4, with k·k and q·k in kk, qk (component m): Pᵀ to scratch, and for
// j in a block b <= a = q4 / 4, L into T's block (a, b).
fn store_pairs(q4: u32, j: u32, cn: u32, p_at: u32, kk: vec4<f32>, qk: vec4<f32>) {
  var pv = vec4<f32>(0.0);
  var lv = vec4<f32>(0.0);
  for (var m = 0u; m < 4u; m++) {
    let i = 4u * q4 + m;
    if (i < cn && j <= i) {
      let dij = exp(decay_sum(j, i));
      pv[m] = qk[m] * dij;
      if (j < i) {
        lv[m] = bs[i] * kk[m] * dij;
      }
    }
    scratch[p_at + j * C + 4u * q4 + m] = pv[m];
  }
  let a = q4 / 4u;
  let bj = j / 16u;
  if (bj <= a) {
    st4(blk(a, bj) + (j % 16u) * 16u + 4u * (q4 % 4u), lv);
  }
}

// k (from_k) or q of the chunk's tokens t .. t + 3 (relative to t0) at dim d, zero past cn and dk.
fn kq_rows(from_k: bool, at: u32, t0: u32, cn: u32, t: u32, d: u32) -> vec4<f32> {
  var x = vec4<f32>(0.0);
  if (d < p.dk) {
    for (var m = 0u; m < 4u; m++) {
      if (t + m < cn) {
        if (from_k) {
          x[m] = k[at + (t0 + t + m) * p.k_st0 + d];
        } else {
          x[m] = q[at + (t0 + t + m) * p.q_st0 + d];
        }
      }
    }
  }
  return x;
}

// Column col of [diag(β⊙γ) K | diag(β) V] at the chunk's rows j .. j + 3, zero past cn.
fn kv_rows(kb: u32, vb: u32, t0: u32, cn: u32, j: u32, col: u32) -> vec4<f32> {
  var x = vec4<f32>(0.0);
  for (var m = 0u; m < 4u; m++) {
    if (j + m < cn) {
      if (col < p.dk) {
        x[m] = bs[j + m] * gam[j + m] * k[kb + (t0 + j + m) * p.k_st0 + col];
      } else if (col < p.dk + p.dv) {
        x[m] = bs[j + m] * v[vb + (t0 + j + m) * p.v_st0 + col - p.dk];
      }
    }
  }
  return x;
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
  let t0 = table[p.chunk_base + 3u * ci];
  let cn = table[p.chunk_base + 3u * ci + 1u];
  let base = item * p.region;
  let p_at = base;
  let w_at = base + C * C;
  let u_at = w_at + C * p.dk;
  let gam_at = u_at + C * p.dv;
  let dl_at = gam_at + C;
  let qb = p.q_off + kh * p.q_st1;
  let kb = p.k_off + kh * p.k_st1;
  let vb = p.v_off + h * p.v_st1;

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
    let b0 = lid & ~15u;
    var hs = 0.0;
    for (var t = b0; t <= lid; t++) {
      hs += gs[t];
    }
    head[lid] = hs;
    var ts = 0.0;
    for (var t = lid + 1u; t < b0 + 16u; t++) {
      ts += gs[t];
    }
    tail[lid] = ts;
  } else if (lid < C + 4u) {
    var ws = 0.0;
    for (var t = 16u * (lid - C); t < 16u * (lid - C + 1u); t++) {
      ws += gs[t];
    }
    whole[lid - C] = ws;
  }
  workgroupBarrier();
  if (lid < C) {
    var gm = 0.0;
    var dl = 0.0;
    if (lid < cn) {
      var s = head[lid];
      for (var m = 0u; m < lid / 16u; m++) {
        s += whole[m];
      }
      gm = exp(s);
      dl = exp(decay_sum(lid, cn - 1u));
    }
    gam[lid] = gm;
    scratch[gam_at + lid] = gm;
    scratch[dl_at + lid] = dl;
  }

  // 1. k_i·k_j and q_i·k_j for i = 4·q4 + m (vector component m), j = tj + 16b.
  let q4 = lid / 16u;
  let tj = lid % 16u;
  var kk0 = vec4<f32>(0.0);
  var kk1 = vec4<f32>(0.0);
  var kk2 = vec4<f32>(0.0);
  var kk3 = vec4<f32>(0.0);
  var qk0 = vec4<f32>(0.0);
  var qk1 = vec4<f32>(0.0);
  var qk2 = vec4<f32>(0.0);
  var qk3 = vec4<f32>(0.0);
  // Slab loads go one slab ahead: invocation lid holds tokens 4·(lid / SLAB) .. +3 of dim lid % SLAB
  // (consecutive invocations: consecutive dims).
  let t_ld = 4u * (lid / SLAB);
  let d_ld = lid % SLAB;
  var kv = kq_rows(true, kb, t0, cn, t_ld, d_ld);
  var qv = kq_rows(false, qb, t0, cn, t_ld, d_ld);
  for (var d0 = 0u; d0 < p.dk; d0 += SLAB) {
    st4(d_ld * ST + t_ld, kv);
    st4(Q_AT + d_ld * ST + t_ld, qv);
    workgroupBarrier();
    if (d0 + SLAB < p.dk) {
      kv = kq_rows(true, kb, t0, cn, t_ld, d0 + SLAB + d_ld);
      qv = kq_rows(false, qb, t0, cn, t_ld, d0 + SLAB + d_ld);
    }
    let d_end = select(0u, SLAB, 4u * q4 < cn);
    for (var d = 0u; d < d_end; d++) {
      let ki = ld4(d * ST + 4u * q4);
      let qi = ld4(Q_AT + d * ST + 4u * q4);
      let kj = vec4<f32>(ld(d * ST + tj), ld(d * ST + tj + 16u), ld(d * ST + tj + 32u), ld(d * ST + tj + 48u));
      kk0 = fma(vec4<f32>(kj.x), ki, kk0);
      kk1 = fma(vec4<f32>(kj.y), ki, kk1);
      kk2 = fma(vec4<f32>(kj.z), ki, kk2);
      kk3 = fma(vec4<f32>(kj.w), ki, kk3);
      qk0 = fma(vec4<f32>(kj.x), qi, qk0);
      qk1 = fma(vec4<f32>(kj.y), qi, qk1);
      qk2 = fma(vec4<f32>(kj.z), qi, qk2);
      qk3 = fma(vec4<f32>(kj.w), qi, qk3);
    }
    workgroupBarrier();
  }
  store_pairs(q4, tj, cn, p_at, kk0, qk0);
  store_pairs(q4, tj + 16u, cn, p_at, kk1, qk1);
  store_pairs(q4, tj + 32u, cn, p_at, kk2, qk2);
  store_pairs(q4, tj + 48u, cn, p_at, kk3, qk3);
  workgroupBarrier();

  // 2a. The diagonal blocks: invocation (bb, c) solves column c of (I + L_bb)⁻¹ top-down into the
  // slab area, 4 rows per write; it reads back only values it computed itself (zero above the
  // diagonal).
  if (lid < C) {
    let bb = lid / 16u;
    let c = lid % 16u;
    let lb = blk(bb, bb);
    let xb = XS_AT + bb * 256u + c * 16u;
    for (var r4 = 0u; r4 < 16u; r4 += 4u) {
      var xv = vec4<f32>(0.0);
      for (var m = 0u; m < 4u; m++) {
        let r = r4 + m;
        var x = select(0.0, 1.0, r == c);
        for (var j = c; j < min(r, r4); j++) {
          x = fma(-ld(lb + j * 16u + r), ld(xb + j), x);
        }
        for (var j = max(c, r4); j < r; j++) {
          x = fma(-ld(lb + j * 16u + r), xv[j - r4], x);
        }
        xv[m] = x;
      }
      st4(xb + r4, xv);
    }
  }
  workgroupBarrier();
  for (var e = lid; e < 4u * 64u; e += 256u) {
    st4(blk(e / 64u, e / 64u) + 4u * (e % 64u), ld4(XS_AT + 4u * e));
  }
  workgroupBarrier();
  // 2b. Block row bi (L_bi· is read here for the last time, so T_bi· replaces it): invocation
  // (bj, c, r4) = (lid / 64, lid % 16, 4·(lid % 64 / 16)) owns rows r4 .. r4 + 3 of column c of
  // block (bi, bj).
  let c2 = lid % 16u;
  let r2 = 4u * ((lid % 64u) / 16u);
  let bj2 = lid / 64u;
  for (var bi = 1u; bi < 4u; bi++) {
    if (bj2 < bi) {
      var acc = vec4<f32>(0.0);
      for (var bk = bj2; bk < bi; bk++) {
        let la = blk(bi, bk) + r2;
        let ta = blk(bk, bj2) + c2 * 16u;
        for (var m = 0u; m < 16u; m++) {
          acc = fma(ld4(la + m * 16u), vec4<f32>(ld(ta + m)), acc);
        }
      }
      st4(XS_AT + bj2 * 256u + c2 * 16u + r2, acc);
    }
    workgroupBarrier();
    if (bj2 < bi) {
      let da = blk(bi, bi) + r2;
      let xa = XS_AT + bj2 * 256u + c2 * 16u;
      var t = vec4<f32>(0.0);
      for (var m = 0u; m < 16u; m++) {
        t = fma(ld4(da + m * 16u), vec4<f32>(ld(xa + m)), t);
      }
      st4(blk(bi, bj2) + c2 * 16u + r2, -t);
    }
    workgroupBarrier();
  }

  // 3. W = T diag(β⊙γ) K and U = T diag(β) V, 16 columns of [K | V] at a time; invocation owns rows
  // 16·bi + rr .. +3 and column c of the slab.
  let c = lid % 16u;
  let bi = q4 / 4u;
  let rr = (q4 % 4u) * 4u;
  // Rows of a block wholly past cn are zero: T is the identity there and the slab's rows are zero.
  let jmax = select(min(cn, 16u * (bi + 1u)), 0u, 16u * bi >= cn);
  let n_cols = p.dk + p.dv;
  // Slab loads one slab ahead, as in step 1: invocation lid holds rows t_ld .. +3 of column d_ld.
  var xv = kv_rows(kb, vb, t0, cn, t_ld, d_ld);
  for (var col0 = 0u; col0 < n_cols; col0 += SLAB) {
    st4(XS_AT + d_ld * ST + t_ld, xv);
    workgroupBarrier();
    if (col0 + SLAB < n_cols) {
      xv = kv_rows(kb, vb, t0, cn, t_ld, col0 + SLAB + d_ld);
    }
    // Four j at a time; reading up to 3 j past jmax adds zeros (the slab is zero from cn on, T is
    // zero above the diagonal).
    var acc = vec4<f32>(0.0);
    for (var bj = 0u; 16u * bj < jmax; bj++) {
      let ta = blk(bi, bj) + rr;
      let xa = XS_AT + c * ST + 16u * bj;
      let jn = min(16u, jmax - 16u * bj);
      for (var j = 0u; j < jn; j += 4u) {
        let x = ld4(xa + j);
        acc = fma(ld4(ta + j * 16u), vec4<f32>(x.x), acc);
        acc = fma(ld4(ta + (j + 1u) * 16u), vec4<f32>(x.y), acc);
        acc = fma(ld4(ta + (j + 2u) * 16u), vec4<f32>(x.z), acc);
        acc = fma(ld4(ta + (j + 3u) * 16u), vec4<f32>(x.w), acc);
      }
    }
    let col = col0 + c;
    let i = 16u * bi + rr;
    if (col < p.dk) {
      for (var m = 0u; m < 4u; m++) {
        scratch[w_at + col * C + i + m] = acc[m];
      }
    } else if (col < n_cols) {
      for (var m = 0u; m < 4u; m++) {
        scratch[u_at + (i + m) * p.dv + col - p.dk] = acc[m];
      }
    }
    workgroupBarrier();
  }
}
