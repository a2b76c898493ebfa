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
// Launch: one workgroup of 256 invocations per (64-column dv slice, value head, sequence), i.e.
// ceil(dv/64)·Hv·R workgroups (folded). Invocations 4c..4c+3 share state column 64·slice + c; lane
// p = lid % 4 holds its rows 16m + 4p .. 16m + 4p + 3 (m < 8) in 8 vec4 registers (rows past dk are zero
// and so are the k and q entries staged for them, so every loop runs its constant 8 steps; the lanes of
// a quad read distinct 16-byte words of a staged row). A sum over the rows is each lane's partial sum,
// then quad_sum2 (reduce_subgroups.wgsl: two xor shuffles; reduce_workgroup.wgsl: workgroup memory and
// two barriers, the same additions in the same order, so both give the same bits). Tokens go in batches
// of 8: the batch's k rows (and the next token's), q rows, v values of the slice, α and β are staged in
// workgroup memory (two barriers a batch, none in a token step), the next batch's loads issued into
// registers before the current batch's steps. Lane 0 of a quad writes out. Workgroup memory: 10.6 KiB
// (+ 2 KiB for quad_sum2 without subgroups). FP32 throughout. An empty row returns at once.
// H200 (2026-12-03, docs/backends.md): 136 → 66 µs a call in the 0.8b long evaluation (5 rows of ~39
// tokens) against the previous kernel, one invocation per column walking all dk rows in 32 vec4 (64
// invocations a workgroup, 32-step dependent sums). Measured and dropped: the state as eight named
// vec4 fields instead of the array (the same time: the array stays in registers).

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

const NC: u32 = 64u;   // state columns per workgroup
const WG: u32 = 256u;  // invocations per workgroup, 4 per state column
const D4: u32 = 32u;   // vec4 rows of a staged k or q row (dk <= 128)
const M4: u32 = 8u;    // vec4 rows of the state per invocation (D4 / 4 lanes)
const TB: u32 = 8u;    // tokens per batch
const FOLD_BELOW: f32 = 2.3283064e-10;  // 2⁻³²

var<workgroup> k_sh: array<vec4<f32>, 288>;  // [TB + 1][D4]: the batch's k rows, then the next token's
var<workgroup> q_sh: array<vec4<f32>, 256>;  // [TB][D4]
var<workgroup> v_sh: array<f32, 512>;        // [TB][NC]
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

// What one invocation stages for a batch: k quads lid and lid + WG (< (TB + 1)·D4) of [TB + 1][D4],
// q quad lid of [TB][D4], v entries lid and lid + WG of [TB][NC], and (lid < TB) the α and β of
// token lid.
struct Batch {
  k0: vec4<f32>, k1: vec4<f32>, q0: vec4<f32>,
  v0: f32, v1: f32, alpha: f32, beta: f32,
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

fn v_or_zero(wk: Walk, tb: u32, x: u32) -> f32 {
  let tt = x / NC;
  let col = wk.col0 + x % NC;
  let val = v[p.v_off + token_at(wk, tb, tt) * p.v_st0 + wk.h * p.v_st1 + min(col, p.dv - 1u)];
  return select(0.0, val, tb + tt < wk.cn && col < p.dv);
}

fn load_batch(wk: Walk, tb: u32, lid: u32) -> Batch {
  let tok = token_at(wk, tb, lid % TB);  // α and β: stored by invocations lid < TB
  return Batch(qk_or_zero(false, wk, tb, lid), qk_or_zero(false, wk, tb, min(lid + WG, (TB + 1u) * D4 - 1u)),
               qk_or_zero(true, wk, tb, lid), v_or_zero(wk, tb, lid), v_or_zero(wk, tb, lid + WG),
               exp(g[p.g_off + tok * p.g_st + wk.h]), beta[p.b_off + tok * p.b_st + wk.h]);
}

fn store_batch(b: Batch, lid: u32) {
  k_sh[lid] = b.k0;
  if (lid + WG < (TB + 1u) * D4) {
    k_sh[lid + WG] = b.k1;
  }
  q_sh[lid] = b.q0;
  v_sh[lid] = b.v0;
  v_sh[lid + WG] = b.v1;
  if (lid < TB) {
    alpha_sh[lid] = b.alpha;
    beta_sh[lid] = b.beta;
  }
}

fn hsum(x: vec4<f32>) -> f32 {
  return (x.x + x.y) + (x.z + x.w);
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
  let c = lid / 4u;
  let lane = lid % 4u;
  let col = wk.col0 + c;
  let live = col < p.dv;

  var nxt = load_batch(wk, 0u, lid);
  var s: array<vec4<f32>, 8>;
  for (var m = 0u; m < M4; m++) {
    s[m] = vec4<f32>(0.0);
  }
  if (p.has_state_in != 0u) {
    // Rows past dk and columns past dv read the last one and are zeroed.
    let at = p.si_off + h * p.dk * p.dv + min(col, p.dv - 1u);
    let last = p.dk - 1u;
    for (var m = 0u; m < M4; m++) {
      let i = 16u * m + 4u * lane;
      let x = vec4<f32>(state_in[at + min(i, last) * p.dv], state_in[at + min(i + 1u, last) * p.dv],
                        state_in[at + min(i + 2u, last) * p.dv], state_in[at + min(i + 3u, last) * p.dv]);
      let inside = (vec4<u32>(i, i + 1u, i + 2u, i + 3u) < vec4<u32>(p.dk)) & vec4<bool>(live);
      s[m] = select(vec4<f32>(0.0), x, inside);
    }
  }
  var sigma = 1.0;
  var a = 0.0;  // S̃ᵀk of the next token
  for (var tb = 0u; tb < cn; tb += TB) {
    workgroupBarrier();  // the previous batch's readers are done
    store_batch(nxt, lid);
    workgroupBarrier();
    if (tb + TB < cn) {
      nxt = load_batch(wk, tb + TB, lid);
    }
    if (tb == 0u) {
      var a4 = vec4<f32>(0.0);
      for (var m = 0u; m < M4; m++) {
        a4 = fma(s[m], k_sh[4u * m + lane], a4);
      }
      a = quad_sum2(vec2<f32>(hsum(a4), 0.0), lid).x;
    }
    let nb = min(TB, cn - tb);
    for (var tt = 0u; tt < nb; tt++) {
      var s1 = sigma * alpha_sh[tt];
      let u = v_sh[tt * NC + c] - s1 * a;
      if (s1 < FOLD_BELOW) {
        for (var m = 0u; m < M4; m++) {
          s[m] = s[m] * s1;
        }
        s1 = 1.0;
      }
      sigma = s1;
      let w = vec4<f32>(beta_sh[tt] * u / s1);
      var b4 = vec4<f32>(0.0);
      var a4 = vec4<f32>(0.0);
      for (var m = 0u; m < M4; m++) {
        let at = tt * D4 + 4u * m + lane;
        s[m] = fma(k_sh[at], w, s[m]);
        b4 = fma(s[m], q_sh[at], b4);
        a4 = fma(s[m], k_sh[at + D4], a4);
      }
      let ob = quad_sum2(vec2<f32>(hsum(b4), hsum(a4)), lid);
      a = ob.y;
      if (lane == 0u && live) {
        out[p.o_off + (t0 + tb + tt) * p.o_st0 + h * p.o_st1 + col] = sigma * ob.x;
      }
    }
  }
}
