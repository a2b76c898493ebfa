// Gated delta rule for passes whose sequences all fit one 64-token chunk and that write no state_out
// (Kev's question rows from the prefix state): the token recurrence itself, per token (KEV_SPEC §5.4)
//   S̄ = α_t S;  S = S̄ + k_t (β_t (v_t − S̄ᵀk_t))ᵀ;  o_t = Sᵀq_t,   α_t = e^{g_t},
// over at most 64 tokens a row. The prefill (any longer sequence) keeps the chunked kernels
// (gated_delta_net_prep / _wu / gated_delta_net / _out): a token loop there is the known trap, 2,187
// sequential steps; here a row's ~40 steps replace four dispatches whose chunk products a one-chunk
// row cannot amortise.
// Scaled state: the workgroup keeps its columns of S as σ S̃ with one scalar σ (the product of the α
// since the last fold), so a token costs three FMAs per state element and no decay multiply:
//   σ' = σ α_t;  u = v_t − σ' S̃ᵀk_t;  S̃ += k_t (β_t u / σ');  o_t = σ' S̃ᵀq_t;
// σ' is folded into S̃ (S̃ ← σ' S̃, σ' = 1) when it falls below 2⁻³², so S̃ stays within 2³² of S.
// S̃ᵀk_{t+1} is summed in the same pass over the updated S̃ as S̃ᵀq_t (both read it; the decay lives in
// σ), so a token is one pass over the state and one reduction of two sums.
//
// Layout: q, k [n,Hk,dk], v, out [n,Hv,dv] (token and head strides free, elements contiguous), g, beta
// [n,Hv] (token stride free), state_in [Hv,dk,dv] contiguous, key-major; offsets [R+1] I32. dk <= 128.
// Launch: one workgroup of 128 invocations per (64-column dv slice, value head, sequence), i.e.
// ceil(dv/64)·Hv·R workgroups (folded). Lane group g = lid / 8 holds state columns 64·slice + 4g ..
// + 3; its lane p = lid % 8 holds rows 32m + 4p .. 32m + 4p + 3 (m < 4) of them, 16 vec4 registers
// over the four columns (rows past dk are zero and so are the k and q entries staged for them, so every
// loop runs its constant 4 steps; the 8 lanes of a group read a staged row's 32 floats as 8 distinct
// 16-byte words). Why four columns a lane: every lane group reads the whole k and q rows each token,
// so a token's workgroup-memory reads are (columns) / (columns a lane holds) row reads; with one column
// a lane (four lanes a column, 256 invocations, until 2026-12-07) that was 4× as many. A sum over the
// rows is each lane's partial sum (two FMA chains, even and odd rows), then group8_sum over the 8 lanes
// (reduce_subgroups.wgsl: three xor shuffles; reduce_workgroup.wgsl: workgroup memory and two barriers,
// the same additions in the same order, so both give the same bits), which leaves the group's four
// columns' sums in every lane. Tokens go in batches of 8: the batch's k rows (and the next token's), q
// rows, v values of the slice, α and β are staged in workgroup memory (two barriers a batch, none in a
// token step), the next batch's loads issued into registers before the current batch's steps. Lanes
// p < 4 write out (column 4g + p). Workgroup memory: 10.6 KiB (+ 4 KiB for group8_sum without
// subgroups). FP32 throughout. An empty row returns at once.
// Measured (docs/backends.md): the quad layout took 136 → 66 µs a call in the 0.8b long evaluation (5
// rows of ~39 tokens) on the H200 (2026-12-03) against the kernel before it, one invocation per column
// walking all dk rows in 32 vec4 (64 invocations a workgroup, 32-step dependent sums); the lane groups
// (2026-12-07, H100, `DISABLED_GdnTiming` medians, two rounds against the quad layout in one run) 35 × 64
// rows 0.462 / 0.546 → 0.353 / 0.381 ms, 6 × 37 rows 0.126 / 0.141 → 0.130 / 0.119 (the same), and on
// lavapipe 1,218 → 485 and 103 → 50 ms. Measured and dropped: the state as named vec4 fields instead
// of the array (the same time: the array stays in registers).

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, g_off: u32, g_st: u32, b_off: u32,
  b_st: u32, si_off: u32, o_off: u32, o_st0: u32,
  o_st1: u32, has_state_in: u32, n_seqs: u32, n_slices: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> g: array<f32>;
@group(0) @binding(5) var<storage, read_write> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> state_in: array<f32>;
@group(0) @binding(7) var<storage, read_write> offsets: array<i32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

const NC: u32 = 64u;   // state columns per workgroup: 16 lane groups of 4
const WG: u32 = 128u;  // invocations per workgroup, 8 per lane group
const D4: u32 = 32u;   // vec4 rows of a staged k or q row (dk <= 128)
const M4: u32 = 4u;    // runs of 4 state rows per invocation (D4 / 8 lanes)
const TB: u32 = 8u;    // tokens per batch
const FOLD_BELOW: f32 = 2.3283064e-10;  // 2⁻³²

var<workgroup> k_sh: array<vec4<f32>, 288>;  // [TB + 1][D4]: the batch's k rows, then the next token's
var<workgroup> q_sh: array<vec4<f32>, 256>;  // [TB][D4]
var<workgroup> v_sh: array<vec4<f32>, 128>;  // [TB][NC / 4]: a lane group's four columns
var<workgroup> alpha_sh: array<f32, 8>;
var<workgroup> beta_sh: array<f32, 8>;
var<workgroup> cn_wg: u32;

// Four entries of row `at` of q or k from dimension 4·m, zero past dk. Every load here and in
// load_batch reads an in-bounds index (dimensions, tokens and columns clamped to the last valid one)
// and a select zeroes what lies past an edge, with no branch around the loads: on the H200 that took
// the op from 0.155 / 0.138 to 0.115 / 0.116 ms (6 × 37 rows) against per-element branches. (The same
// change made the conv and the matmul slower: docs/backends.md, "Eighteenth session: WebGPU".)
fn qk_quad(from_q: bool, at: u32, m: u32) -> vec4<f32> {
  let last = p.dk - 1u;
  let i = 4u * m;
  let e = vec4<u32>(min(i, last), min(i + 1u, last), min(i + 2u, last), min(i + 3u, last)) + at;
  var x: vec4<f32>;
  if (from_q) {
    x = vec4<f32>(q[e.x], q[e.y], q[e.z], q[e.w]);
  } else {
    x = vec4<f32>(k[e.x], k[e.y], k[e.z], k[e.w]);
  }
  return select(vec4<f32>(0.0), x, vec4<u32>(i, i + 1u, i + 2u, i + 3u) < vec4<u32>(p.dk));
}

// What one invocation stages for a batch: k quads lid, lid + WG and lid + 2·WG (< (TB + 1)·D4) of
// [TB + 1][D4], q quads lid and lid + WG of [TB][D4], v quad lid of [TB][NC / 4], and (lid < TB) the α
// and β of token lid.
struct Batch {
  k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>, q0: vec4<f32>, q1: vec4<f32>, v: vec4<f32>,
  alpha: f32, beta: f32,
}

// The workgroup's sequence: tokens [t0, t0 + cn) (cn >= 1) of value head h (key head kh), state
// columns from col0.
struct Walk {
  t0: u32, cn: u32, h: u32, kh: u32, col0: u32,
}

// Token tb + tt of the sequence, or its last token past the end (read, then zeroed by the caller).
fn token_at(wk: Walk, tb: u32, tt: u32) -> u32 {
  return wk.t0 + min(tb + tt, wk.cn - 1u);
}

fn qk_or_zero(from_q: bool, wk: Walk, tb: u32, x: u32) -> vec4<f32> {
  let tt = x / D4;
  var at: u32;
  if (from_q) {
    at = p.q_off + token_at(wk, tb, tt) * p.q_st0 + wk.kh * p.q_st1;
  } else {
    at = p.k_off + token_at(wk, tb, tt) * p.k_st0 + wk.kh * p.k_st1;
  }
  return select(vec4<f32>(0.0), qk_quad(from_q, at, x % D4), tb + tt < wk.cn);
}

// Columns 4·(x % 16) .. + 3 of the slice for token tb + x / 16.
fn v_or_zero(wk: Walk, tb: u32, x: u32) -> vec4<f32> {
  let tt = x / (NC / 4u);
  let col = wk.col0 + 4u * (x % (NC / 4u));
  let last = p.dv - 1u;
  let at = p.v_off + token_at(wk, tb, tt) * p.v_st0 + wk.h * p.v_st1;
  let val = vec4<f32>(v[at + min(col, last)], v[at + min(col + 1u, last)], v[at + min(col + 2u, last)],
                      v[at + min(col + 3u, last)]);
  let inside = (vec4<u32>(col, col + 1u, col + 2u, col + 3u) < vec4<u32>(p.dv)) & vec4<bool>(tb + tt < wk.cn);
  return select(vec4<f32>(0.0), val, inside);
}

fn load_batch(wk: Walk, tb: u32, lid: u32) -> Batch {
  let tok = token_at(wk, tb, lid % TB);  // α and β: stored by invocations lid < TB
  let k_last = (TB + 1u) * D4 - 1u;
  return Batch(qk_or_zero(false, wk, tb, lid), qk_or_zero(false, wk, tb, lid + WG),
               qk_or_zero(false, wk, tb, min(lid + 2u * WG, k_last)), qk_or_zero(true, wk, tb, lid),
               qk_or_zero(true, wk, tb, lid + WG), v_or_zero(wk, tb, lid),
               exp(g[p.g_off + tok * p.g_st + wk.h]), beta[p.b_off + tok * p.b_st + wk.h]);
}

fn store_batch(b: Batch, lid: u32) {
  k_sh[lid] = b.k0;
  k_sh[lid + WG] = b.k1;
  if (lid + 2u * WG < (TB + 1u) * D4) {
    k_sh[lid + 2u * WG] = b.k2;
  }
  q_sh[lid] = b.q0;
  q_sh[lid + WG] = b.q1;
  v_sh[lid] = b.v;
  if (lid < TB) {
    alpha_sh[lid] = b.alpha;
    beta_sh[lid] = b.beta;
  }
}

// The lane's share of S̃ᵀx for its four columns: the sum over its rows r (32m + 4p + e) of x_r s[r],
// from the vec4 run x4[m] of x. Two chains (even and odd e).
fn partial_sum(s: ptr<function, array<vec4<f32>, 16>>, x4: ptr<function, array<vec4<f32>, 4>>) -> vec4<f32> {
  var h0 = vec4<f32>(0.0);
  var h1 = vec4<f32>(0.0);
  for (var m = 0u; m < M4; m++) {
    let x = (*x4)[m];
    h0 = fma((*s)[4u * m], vec4<f32>(x.x), h0);
    h1 = fma((*s)[4u * m + 1u], vec4<f32>(x.y), h1);
    h0 = fma((*s)[4u * m + 2u], vec4<f32>(x.z), h0);
    h1 = fma((*s)[4u * m + 3u], vec4<f32>(x.w), h1);
  }
  return h0 + h1;
}

@compute @workgroup_size(WG)
fn short_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_slices * p.hv * p.n_seqs) {
    return;
  }
  let slice = item % p.n_slices;
  let h = (item / p.n_slices) % p.hv;
  let r = item / (p.n_slices * p.hv);
  let t0 = u32(offsets[r]);
  if (lid == 0u) {
    cn_wg = u32(offsets[r + 1u]) - t0;
  }
  let cn = workgroupUniformLoad(&cn_wg);  // the token loop holds barriers
  if (cn == 0u) {
    return;
  }
  let wk = Walk(t0, cn, h, h / (p.hv / p.hk), slice * NC);
  let grp = lid / 8u;
  let lane = lid % 8u;
  let col = wk.col0 + 4u * grp;  // the group's first column
  let out_col = col + lane;      // lanes < 4 write it

  var nxt = load_batch(wk, 0u, lid);
  var s: array<vec4<f32>, 16>;
  for (var i = 0u; i < 16u; i++) {
    s[i] = vec4<f32>(0.0);
  }
  if (p.has_state_in != 0u) {
    // Rows past dk and columns past dv read the last one and are zeroed.
    let base = p.si_off + h * p.dk * p.dv;
    let last_row = p.dk - 1u;
    let last_col = p.dv - 1u;
    let cols = vec4<u32>(min(col, last_col), min(col + 1u, last_col), min(col + 2u, last_col),
                         min(col + 3u, last_col));
    let live = vec4<u32>(col, col + 1u, col + 2u, col + 3u) < vec4<u32>(p.dv);
    for (var m = 0u; m < M4; m++) {
      for (var e = 0u; e < 4u; e++) {
        let i = 32u * m + 4u * lane + e;
        let at = base + min(i, last_row) * p.dv;
        let x = vec4<f32>(state_in[at + cols.x], state_in[at + cols.y], state_in[at + cols.z], state_in[at + cols.w]);
        s[4u * m + e] = select(vec4<f32>(0.0), x, live & vec4<bool>(i < p.dk));
      }
    }
  }
  var sigma = 1.0;
  var a = vec4<f32>(0.0);  // S̃ᵀk of the next token, the group's four columns
  var x4: array<vec4<f32>, 4>;
  for (var tb = 0u; tb < cn; tb += TB) {
    workgroupBarrier();  // the previous batch's readers are done
    store_batch(nxt, lid);
    workgroupBarrier();
    if (tb + TB < cn) {
      nxt = load_batch(wk, tb + TB, lid);
    }
    if (tb == 0u) {
      for (var m = 0u; m < M4; m++) {
        x4[m] = k_sh[8u * m + lane];
      }
      a = group8_sum(Pair4(partial_sum(&s, &x4), vec4<f32>(0.0)), lid).a;
    }
    let nb = min(TB, cn - tb);
    for (var tt = 0u; tt < nb; tt++) {
      var s1 = sigma * alpha_sh[tt];
      let u = v_sh[tt * (NC / 4u) + grp] - s1 * a;
      if (s1 < FOLD_BELOW) {
        for (var i = 0u; i < 16u; i++) {
          s[i] = s[i] * s1;
        }
        s1 = 1.0;
      }
      sigma = s1;
      let w = beta_sh[tt] * u / s1;
      var q4: array<vec4<f32>, 4>;
      for (var m = 0u; m < M4; m++) {
        let at = tt * D4 + 8u * m + lane;
        let k = k_sh[at];
        s[4u * m] = fma(vec4<f32>(k.x), w, s[4u * m]);
        s[4u * m + 1u] = fma(vec4<f32>(k.y), w, s[4u * m + 1u]);
        s[4u * m + 2u] = fma(vec4<f32>(k.z), w, s[4u * m + 2u]);
        s[4u * m + 3u] = fma(vec4<f32>(k.w), w, s[4u * m + 3u]);
        q4[m] = q_sh[at];
        x4[m] = k_sh[at + D4];
      }
      let ob = group8_sum(Pair4(partial_sum(&s, &x4), partial_sum(&s, &q4)), lid);
      a = ob.a;
      if (lane < 4u && out_col < p.dv) {
        out[p.o_off + (t0 + tb + tt) * p.o_st0 + h * p.o_st1 + out_col] = sigma * ob.b[lane];
      }
    }
  }
}
