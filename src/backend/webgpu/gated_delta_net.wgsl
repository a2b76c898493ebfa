// Gated delta rule, chunked (WY/UT form), part 2 of 2: the recurrence over a sequence's chunks.
// Per sequence and value head h the state S ∈ R^{dk×dv} starts from state_in[h] (has_state_in) or 0;
// per chunk, with Tβ, W, P, γ, dlast from gated_delta_net_prep.wgsl:
//   Δ = Tβ V − W S;   o_i = γ_i Sᵀq_i + Σ_{j<=i} P_ij Δ_j;   S ← γ_{cn−1} S + Σ_j dlast_j k_j Δ_jᵀ,
// which is the token recurrence S ← α_t S + β_t k_t (v_t − α_t Sᵀk_t)ᵀ, o_t = Sᵀq_t (KEV_SPEC §5.4)
// taken 64 tokens at a time (a ragged last chunk is the spec's zero padding).
//
// Layout: q, k [n,Hk,dk], v, out [n,Hv,dv] (outer strides free); state_in / state_out [Hv,dk,dv]
// contiguous, key-major; table (u32): sequence r at 4·r holds (first chunk, chunk count, first token,
// length); scratch as written by part 1. dk <= 128.
// Launch: one workgroup of 256 invocations per (dv slice of 16 columns, value head, sequence), i.e.
// ceil(dv/16)·Hv·R workgroups (folded); invocation (row group lid/16, column lid%16). The state slice
// S[dk×16] (8 KiB) and Δ[64×16] (4 KiB) live in workgroup memory; FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, o_off: u32, o_st0: u32, o_st1: u32,
  si_off: u32, so_off: u32, has_state_in: u32, has_state_out: u32,
  n_seqs: u32, n_slices: u32, region: u32, pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> state_in: array<f32>;
@group(0) @binding(5) var<storage, read_write> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read_write> state_out: array<f32>;

const C: u32 = 64u;
const VS: u32 = 16u;

var<workgroup> S: array<f32, 2048>;       // [dk][VS]
var<workgroup> delta: array<f32, 1024>;   // [C][VS]
var<workgroup> n_chunks_wg: u32;

@compute @workgroup_size(256)
fn recur(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_slices * p.hv * p.n_seqs) {
    return;
  }
  let slice = item % p.n_slices;
  let h = (item / p.n_slices) % p.hv;
  let r = item / (p.n_slices * p.hv);
  let kh = h / (p.hv / p.hk);
  let col = lid % VS;
  let c = slice * VS + col;
  let col_ok = c < p.dv;
  let group = lid / VS;
  let first_chunk = table[4u * r];
  let t_begin = table[4u * r + 2u];
  let len = table[4u * r + 3u];
  if (lid == 0u) {
    n_chunks_wg = table[4u * r + 1u];
  }
  for (var d = group; d < p.dk; d += 16u) {
    var sv = 0.0;
    if (p.has_state_in != 0u && col_ok) {
      sv = state_in[p.si_off + (h * p.dk + d) * p.dv + c];
    }
    S[d * VS + col] = sv;
  }
  let n_chunks = workgroupUniformLoad(&n_chunks_wg);
  let qb = p.q_off + kh * p.q_st1;
  let kb = p.k_off + kh * p.k_st1;
  for (var ch = 0u; ch < n_chunks; ch++) {
    let base = ((first_chunk + ch) * p.hv + h) * p.region;
    let tb_at = base;
    let p_at = base + C * C;
    let w_at = base + 2u * C * C;
    let gam_at = w_at + C * p.dk;
    let dl_at = gam_at + C;
    let t0 = t_begin + ch * C;
    let cn = min(C, len - ch * C);
    // Δ = Tβ V − W S.
    for (var i = group; i < C; i += 16u) {
      var acc = 0.0;
      if (i < cn && col_ok) {
        for (var j = 0u; j <= i; j++) {
          acc = fma(scratch[tb_at + i * C + j], v[p.v_off + (t0 + j) * p.v_st0 + h * p.v_st1 + c], acc);
        }
        for (var d = 0u; d < p.dk; d++) {
          acc = fma(-scratch[w_at + i * p.dk + d], S[d * VS + col], acc);
        }
      }
      delta[i * VS + col] = acc;
    }
    workgroupBarrier();
    // o_i = γ_i Sᵀq_i + Σ_{j<=i} P_ij Δ_j.
    for (var i = group; i < cn; i += 16u) {
      var qs = 0.0;
      let qi = qb + (t0 + i) * p.q_st0;
      for (var d = 0u; d < p.dk; d++) {
        qs = fma(q[qi + d], S[d * VS + col], qs);
      }
      var o = scratch[gam_at + i] * qs;
      for (var j = 0u; j <= i; j++) {
        o = fma(scratch[p_at + i * C + j], delta[j * VS + col], o);
      }
      if (col_ok) {
        out[p.o_off + (t0 + i) * p.o_st0 + h * p.o_st1 + c] = o;
      }
    }
    workgroupBarrier();
    // S ← γ_{cn−1} S + Σ_j dlast_j k_j Δ_jᵀ.
    let g_last = scratch[gam_at + cn - 1u];
    for (var d = group; d < p.dk; d += 16u) {
      var sv = g_last * S[d * VS + col];
      for (var j = 0u; j < cn; j++) {
        sv = fma(scratch[dl_at + j] * k[kb + (t0 + j) * p.k_st0 + d], delta[j * VS + col], sv);
      }
      S[d * VS + col] = sv;
    }
    workgroupBarrier();
  }
  if (p.has_state_out != 0u && col_ok) {
    for (var d = group; d < p.dk; d += 16u) {
      state_out[p.so_off + (h * p.dk + d) * p.dv + c] = S[d * VS + col];
    }
  }
}
