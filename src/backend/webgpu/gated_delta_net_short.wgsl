// Gated delta rule for passes whose sequences all fit one 64-token chunk and that write no state_out
// (Kev's question rows from the prefix state): the token recurrence itself, per token (KEV_SPEC §5.4)
//   S̄ = α_t S;  S = S̄ + k_t (β_t (v_t − S̄ᵀk_t))ᵀ;  o_t = Sᵀq_t,   α_t = e^{g_t},
// over at most 64 tokens a row. The prefill (any longer sequence) keeps the chunked kernels
// (gated_delta_net_prep / _wu / gated_delta_net / _out): a token loop there is the known trap, 2,187
// sequential steps; here a row's ~40 steps replace four dispatches whose chunk products a one-chunk
// row cannot amortise.
// Scaled state: an invocation keeps its column of S as σ S̃ with the scalar σ (the product of the α
// since the last fold), so a token costs three FMAs per state element and no decay multiply:
//   σ' = σ α_t;  u = v_t − σ' S̃ᵀk_t;  S̃ += k_t (β_t u / σ');  o_t = σ' S̃ᵀq_t;
// σ' is folded into S̃ (S̃ ← σ' S̃, σ' = 1) when it falls below 2⁻³², so S̃ stays within 2³² of S.
//
// Layout: q, k [n,Hk,dk], v, out [n,Hv,dv] (token and head strides free, elements contiguous), g, beta
// [n,Hv] (token stride free), state_in [Hv,dk,dv] contiguous, key-major; offsets [R+1] I32. dk <= 128.
// Launch: one workgroup of 64 invocations per (64-column dv slice, value head, sequence), i.e.
// ceil(dv/64)·Hv·R workgroups (folded). Invocation i owns state column 64·slice + i, all dk rows, in
// registers (32 vec4; rows past dk are zero and so are the k and q entries staged for them, so every
// loop runs its constant 32 steps). k and q rows arrive through workgroup memory 8 tokens at a time
// (two barriers a batch, none in a token step); each invocation reads v and writes out for its own
// column. Workgroup memory: two [8][32] vec4 tiles, 16 gates and the row length: 8.1 KiB. FP32 throughout.

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

const NC: u32 = 64u;   // state columns per workgroup, one per invocation
const D4: u32 = 32u;   // vec4 rows of the state (dk <= 128)
const TB: u32 = 8u;    // tokens staged per batch
const FOLD_BELOW: f32 = 2.3283064e-10;  // 2⁻³²

var<workgroup> k_sh: array<vec4<f32>, 256>;  // [TB][D4]
var<workgroup> q_sh: array<vec4<f32>, 256>;
var<workgroup> alpha_sh: array<f32, 8>;
var<workgroup> beta_sh: array<f32, 8>;
var<workgroup> cn_wg: u32;

// Four entries of row `at` of q or k from dimension 4·m (zero past dk).
fn qk_quad(from_q: bool, at: u32, m: u32) -> vec4<f32> {
  var x = vec4<f32>(0.0);
  for (var e = 0u; e < 4u; e++) {
    let i = 4u * m + e;
    if (i < p.dk) {
      if (from_q) {
        x[e] = q[at + i];
      } else {
        x[e] = k[at + i];
      }
    }
  }
  return x;
}

@compute @workgroup_size(64)
fn short_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_slices * p.hv * p.n_seqs) {
    return;
  }
  let slice = item % p.n_slices;
  let h = (item / p.n_slices) % p.hv;
  let r = item / (p.n_slices * p.hv);
  let kh = h / (p.hv / p.hk);
  let col = slice * NC + lid;
  let live = col < p.dv;
  let t0 = u32(offsets[r]);
  if (lid == 0u) {
    cn_wg = u32(offsets[r + 1u]) - t0;
  }
  let cn = workgroupUniformLoad(&cn_wg);  // the token loop holds barriers

  var s: array<vec4<f32>, 32>;
  for (var m = 0u; m < D4; m++) {
    var x = vec4<f32>(0.0);
    if (p.has_state_in != 0u && live) {
      for (var e = 0u; e < 4u; e++) {
        let i = 4u * m + e;
        if (i < p.dk) {
          x[e] = state_in[p.si_off + (h * p.dk + i) * p.dv + col];
        }
      }
    }
    s[m] = x;
  }
  var sigma = 1.0;
  for (var tb = 0u; tb < cn; tb += TB) {
    let nb = min(TB, cn - tb);
    workgroupBarrier();  // the previous batch's readers are done
    for (var x = lid; x < TB * D4; x += NC) {
      let tt = x / D4;
      var kv = vec4<f32>(0.0);
      var qv = vec4<f32>(0.0);
      if (tt < nb) {
        let tok = t0 + tb + tt;
        kv = qk_quad(false, p.k_off + tok * p.k_st0 + kh * p.k_st1, x % D4);
        qv = qk_quad(true, p.q_off + tok * p.q_st0 + kh * p.q_st1, x % D4);
      }
      k_sh[x] = kv;
      q_sh[x] = qv;
    }
    if (lid < nb) {
      let tok = t0 + tb + lid;
      alpha_sh[lid] = exp(g[p.g_off + tok * p.g_st + h]);
      beta_sh[lid] = beta[p.b_off + tok * p.b_st + h];
    }
    workgroupBarrier();
    for (var tt = 0u; tt < nb; tt++) {
      let tok = t0 + tb + tt;
      var vt = 0.0;
      if (live) {
        vt = v[p.v_off + tok * p.v_st0 + h * p.v_st1 + col];
      }
      var a4 = vec4<f32>(0.0);
      for (var m = 0u; m < D4; m++) {
        a4 = fma(s[m], k_sh[tt * D4 + m], a4);
      }
      var s1 = sigma * alpha_sh[tt];
      let u = vt - s1 * (a4.x + a4.y + a4.z + a4.w);
      if (s1 < FOLD_BELOW) {
        for (var m = 0u; m < D4; m++) {
          s[m] = s[m] * s1;
        }
        s1 = 1.0;
      }
      sigma = s1;
      let w = vec4<f32>(beta_sh[tt] * u / s1);
      var b4 = vec4<f32>(0.0);
      for (var m = 0u; m < D4; m++) {
        s[m] = fma(k_sh[tt * D4 + m], w, s[m]);
        b4 = fma(s[m], q_sh[tt * D4 + m], b4);
      }
      if (live) {
        out[p.o_off + tok * p.o_st0 + h * p.o_st1 + col] = sigma * (b4.x + b4.y + b4.z + b4.w);
      }
    }
  }
}
