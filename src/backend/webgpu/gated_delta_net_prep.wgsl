// Gated delta rule, chunked (WY/UT form), part 1 of 3: everything about a chunk that does not depend on
// the state, for all chunks at once. With C = 64, a chunk of cn tokens t0..t0+cn−1, value head h (key
// head kh = h / (Hv/Hk)):
//   D_ij = exp(Σ_{t=j+1..i} g_t) (j <= i), never as a difference of cumulative sums, so a large
//   earlier decay cannot cancel against a small later one (WGSL has no f64 for a cumulative Γ):
//   within a 16-token block the terms are summed directly, across blocks as the tail of j's block +
//   whole block sums + the head of i's block, partial sums of terms g <= 0 that only add;
//   γ_i = exp(Σ_{t<=i} g_t);
//   dlast_j = D_{cn−1,j};  L_ij = β_i (k_i·k_j) D_ij (j < i);  T = (I + L)⁻¹ (unit lower triangular);
//   P_ij = (q_i·k_j) D_ij (j <= i).
// Part 1b (gated_delta_net_wu.wgsl) forms W = T diag(β⊙γ) K and U = T diag(β) V from T, part 2
// (gated_delta_net.wgsl) runs Δ = U − W S, S ← γ_{cn−1} S + Kᵀ diag(dlast) Δ chunk by chunk, part 3
// (gated_delta_net_out.wgsl) o = γ⊙(Q S) + P Δ for all chunks at once.
//
// Layout: q, k [n,Hk,dk], g, beta [n,Hv] (outer strides free); table (u32): chunk ci at
// chunk_base + 3·ci holds (t0, cn, S nonzero); scratch region of (ci, h) at (ci·Hv + h)·region, P and W
// transposed so that a warp of parts 2 and 3 reads consecutive rows i (one cache line):
//   Pᵀ [C×C] (Pᵀ[j·C + i]) | Wᵀ [dk×C] (Wᵀ[d·C + i]) | U [C×dv] (row-major) | γ [C] | dlast [C] |
//   S slot [max(dk·dv, C·C)]: Tᵀ [C×C] (Tᵀ[j·C + i]) from here to part 1b, then the chunk's starting
//   state [dk×dv], written by part 2;
// rows i >= cn of P are zero, those of T the identity's.
// Launch: one workgroup of 256 invocations per (chunk, value head): n_chunks·Hv workgroups (folded).
//   1. k·k and q·k: invocation (q4, tj) = (lid/16, lid%16) owns rows i = 4·q4 .. +3 and columns
//      j = tj + 16b (b < 4), accumulated in vec4 registers over dk in slabs of 16 dims staged
//      dim-major in workgroup memory: 6 loads (2 of them vec4) per 32 FMAs; invocations whose rows
//      lie wholly past a short chunk's cn skip the products. The next slab's global loads are
//      issued before the current slab's FMAs (on the H200 this measured the same as loading each
//      slab after the previous one's barrier: 0.87 ms per 2,187-token call either way).
//   2. T in place of L, by blocks of 16: the four diagonal blocks inverted at once (64 invocations,
//      one column each, 16 steps in registers, written back after a barrier), then block rows
//      I = 1..3: T_IJ = −T_II Σ_{K=J..I−1} L_IK T_KJ, 4 rows × 1 column per invocation, each of the
//      two products read into registers and written back in place after a barrier.
//   3. Tᵀ to scratch, zeros above the diagonal included, a quad of rows per write.
// Workgroup memory (vec4 words, only ever written whole: WGSL lets a write to one component access
// the whole vector, so invocations writing neighbouring floats would race; matrices are stored
// column-major so that one invocation writes 4 consecutive rows): T's 10 lower 16×16 blocks
// (10 KiB, first holding the k/q slabs) + g, β and the block partial sums of g: 11 KiB. The
// kernel's time follows this size more than its FMA count (presumably through how many workgroups
// share a multiprocessor): declared at 26 KiB, nothing else changed, the op took 1.18 against
// 0.83–0.89 ms per 2,187-token call (H200, 2026-12-01). Until 2026-12-02 this kernel also formed W
// and U (16 slabs of 16 [K | V] columns through a 4.25 KiB slab, 5 loads per 16 FMAs) and solved the
// inversion through a 4 KiB side area (15.5 KiB); as 4×4 register blocks over 64-column slabs (2
// loads per 16 FMAs, 26 KiB) W and U had made it slower (1.07–1.13 ms). H200, `DISABLED_GdnTiming`
// medians, 2026-12-02, alternating with main's binaries: W and U in part 1b, 2,187 tokens 0.878 /
// 0.880 → 0.800 / 0.826 ms (first round), then 0.851 / 0.861 / 0.822 (main) against 0.850 / 0.827 /
// 0.830 with part 1b and 0.817 / 0.783 / 0.793 with part 1b and the in-place inversion (second
// round; minima 0.77 / 0.75 / 0.72). Dropped in the first round: k·k and q·k as part 3's tiled
// product (4×4 register blocks, double-buffered [16][64] tiles, 17 KiB), two workgroups per (chunk,
// head), the k·k one inverting: 0.906 / 0.876 against 0.800 / 0.826 ms, 35 × 64 rows 0.818 / 0.766
// against 0.700 / 0.741. FP32 throughout.

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
@group(0) @binding(3) var<storage, read_write> g: array<f32>;
@group(0) @binding(4) var<storage, read_write> beta: array<f32>;
@group(0) @binding(5) var<storage, read_write> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;

const C: u32 = 64u;
const SLAB: u32 = 16u;
const ST: u32 = 68u;        // stride of the dim-major k/q slabs
const Q_AT: u32 = 1088u;    // the q slab after the k slab (16·ST floats)

var<workgroup> gs: array<f32, 64>;
var<workgroup> bs: array<f32, 64>;
var<workgroup> head: array<f32, 64>;   // Σ g_t from i's 16-block start to i (inclusive)
var<workgroup> tail: array<f32, 64>;   // Σ g_t from j + 1 to the end of j's 16-block
var<workgroup> whole: array<f32, 4>;   // Σ g_t over 16-block m
// Float offsets below. Step 1: k slab (token t, dim dd) at dd·ST + t, q slab at Q_AT + dd·ST + t.
// Steps 2-3: T's lower blocks (I, J), J <= I, at blk(I, J), element (r, c) at c·16 + r.
var<workgroup> wsm: array<vec4<f32>, 640>;

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
  let gam_at = base + C * C + C * (p.dk + p.dv);
  let dl_at = gam_at + C;
  let t_at = dl_at + C;
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

  // 2a. The diagonal blocks: invocation (bb, c) solves column c of (I + L_bb)⁻¹ top-down in
  // registers (x_r = δ_rc − Σ_{j<r} L_rj x_j, zero for r < c), then, once every invocation has read
  // L_bb, writes it in place.
  let bb = lid / 16u;
  let c = lid % 16u;
  let lb = blk(bb, bb);
  var x: array<f32, 16>;
  if (lid < C) {
    for (var r = 0u; r < 16u; r++) {
      var s = select(0.0, 1.0, r == c);
      for (var j = 0u; j < r; j++) {
        s = fma(-ld(lb + j * 16u + r), x[j], s);
      }
      x[r] = s;
    }
  }
  workgroupBarrier();
  if (lid < C) {
    st4(lb + c * 16u, vec4<f32>(x[0], x[1], x[2], x[3]));
    st4(lb + c * 16u + 4u, vec4<f32>(x[4], x[5], x[6], x[7]));
    st4(lb + c * 16u + 8u, vec4<f32>(x[8], x[9], x[10], x[11]));
    st4(lb + c * 16u + 12u, vec4<f32>(x[12], x[13], x[14], x[15]));
  }
  workgroupBarrier();
  // 2b. Block row bi (L_bi· is read here for the last time, so T_bi· replaces it, in place: each
  // product is read into registers and written back after a barrier): invocation (bj, c, r4) =
  // (lid / 64, lid % 16, 4·(lid % 64 / 16)) owns rows r4 .. r4 + 3 of column c of block (bi, bj).
  let c2 = lid % 16u;
  let r2 = 4u * ((lid % 64u) / 16u);
  let bj2 = lid / 64u;
  for (var bi = 1u; bi < 4u; bi++) {
    let mine = blk(bi, bj2) + c2 * 16u;
    var acc = vec4<f32>(0.0);
    if (bj2 < bi) {
      for (var bk = bj2; bk < bi; bk++) {
        let la = blk(bi, bk) + r2;
        let ta = blk(bk, bj2) + c2 * 16u;
        for (var m = 0u; m < 16u; m++) {
          acc = fma(ld4(la + m * 16u), vec4<f32>(ld(ta + m)), acc);
        }
      }
    }
    workgroupBarrier();
    if (bj2 < bi) {
      st4(mine + r2, acc);
    }
    workgroupBarrier();
    var t = vec4<f32>(0.0);
    if (bj2 < bi) {
      let da = blk(bi, bi) + r2;
      for (var m = 0u; m < 16u; m++) {
        t = fma(ld4(da + m * 16u), vec4<f32>(ld(mine + m)), t);
      }
    }
    workgroupBarrier();
    if (bj2 < bi) {
      st4(mine + r2, -t);
    }
    workgroupBarrier();
  }

  // 3. Tᵀ (row j: T's column j, zero above the diagonal) for gated_delta_net_wu.wgsl, a quad of 4
  // consecutive rows i per write.
  for (var e = lid; e < C * C / 4u; e += 256u) {
    let j = e / 16u;
    let i = 4u * (e % 16u);
    var tv = vec4<f32>(0.0);
    if (j / 16u <= i / 16u) {
      tv = ld4(blk(i / 16u, j / 16u) + (j % 16u) * 16u + i % 16u);
    }
    let at = t_at + j * C + i;
    scratch[at] = tv.x;
    scratch[at + 1u] = tv.y;
    scratch[at + 2u] = tv.z;
    scratch[at + 3u] = tv.w;
  }
}
