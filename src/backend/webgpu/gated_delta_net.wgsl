// Gated delta rule, chunked (WY/UT form), part 2 of 2: the recurrence over a sequence's chunks.
// Per sequence and value head h the state S ∈ R^{dk×dv} starts from state_in[h] (has_state_in) or 0;
// per chunk, with Pᵀ, Wᵀ, U, γ, dlast from gated_delta_net_prep.wgsl:
//   Δ = U − W S;   o_i = γ_i Sᵀq_i + Σ_{j<=i} P_ij Δ_j;   S ← γ_{cn−1} S + Σ_j dlast_j k_j Δ_jᵀ,
// which is the token recurrence S ← α_t S + β_t k_t (v_t − α_t Sᵀk_t)ᵀ, o_t = Sᵀq_t (KEV_SPEC §5.4)
// taken 64 tokens at a time (a ragged last chunk is the spec's zero padding). The S products are
// skipped while S is zero (first chunk without state_in) and for rows past a short chunk's end, and
// the last update when nobody reads it (no state_out).
//
// Layout: q, k [n,Hk,dk], out [n,Hv,dv] (outer strides free); state_in / state_out [Hv,dk,dv]
// contiguous, key-major; table (u32): sequence r at 4·r holds (first chunk, chunk count, first token,
// length); scratch as written by part 1. dk <= 128.
// Launch: one workgroup of 256 invocations per (dv slice of 16 columns, value head, sequence), i.e.
// ceil(dv/16)·Hv·R workgroups (folded). Invocation (rg, cq) = (lid/4, lid%4) owns columns 4cq..4cq+3
// of the slice (vec4 registers): row rg of Δ and o, rows rg and rg + 64 of S. A warp thus reads 8
// consecutive rows of Wᵀ, Pᵀ, k (one cache line) per load. S[dk×16] (8 KiB) lives in
// workgroup memory; q goes through it in slabs of 16 dims × 64 tokens, dim-major (row stride 68),
// that share 4.25 KiB with Δ[64×16]: 12.25 KiB in all. FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, o_off: u32, o_st0: u32,
  o_st1: u32, si_off: u32, so_off: u32, has_state_in: u32,
  has_state_out: u32, n_seqs: u32, n_slices: u32, region: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> state_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> table: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<storage, read_write> state_out: array<f32>;

const C: u32 = 64u;
const VS: u32 = 16u;
const QT: u32 = 68u;  // stride of the staged q slab's dims, in floats (a multiple of 4)

var<workgroup> S: array<vec4<f32>, 512>;    // [dk][VS/4]
// The q slab [VS][QT] floats while Q S is accumulated, then Δ [C][VS/4]. Only ever written as
// whole vec4s: WGSL lets a write to one component access the whole vector, so invocations writing
// neighbouring components would race.
var<workgroup> shared_rows: array<vec4<f32>, 272>;
var<workgroup> n_chunks_wg: u32;

fn q_slab(e: u32) -> f32 {
  return shared_rows[e / 4u][e % 4u];
}

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
  let cq = lid % 4u;
  let rg = lid / 4u;
  let c0 = slice * VS + 4u * cq;
  // Columns c0 .. c0 + n_cols − 1 exist (dv need not be a multiple of 4).
  let n_cols = min(4u, max(p.dv, c0) - c0);
  let first_chunk = table[4u * r];
  let t_begin = table[4u * r + 2u];
  let len = table[4u * r + 3u];
  if (lid == 0u) {
    n_chunks_wg = table[4u * r + 1u];
  }
  for (var d = rg; d < p.dk; d += 64u) {
    var sv = vec4<f32>(0.0);
    if (p.has_state_in != 0u) {
      let at = p.si_off + (h * p.dk + d) * p.dv + c0;
      for (var e = 0u; e < n_cols; e++) {
        sv[e] = state_in[at + e];
      }
    }
    S[d * 4u + cq] = sv;
  }
  let n_chunks = workgroupUniformLoad(&n_chunks_wg);
  let qb = p.q_off + kh * p.q_st1;
  let kb = p.k_off + kh * p.k_st1;
  let i0 = rg;
  for (var ch = 0u; ch < n_chunks; ch++) {
    let base = ((first_chunk + ch) * p.hv + h) * p.region;
    let p_at = base;
    let w_at = base + C * C;
    let u_at = w_at + C * p.dk;
    let gam_at = u_at + C * p.dv;
    let dl_at = gam_at + C;
    let t0 = t_begin + ch * C;
    let cn = min(C, len - ch * C);
    // W S and Q S for row i0 (rows >= cn of Wᵀ and of the q slab are zero).
    var ws0 = vec4<f32>(0.0);
    var qs0 = vec4<f32>(0.0);
    if (ch > 0u || p.has_state_in != 0u) {
      for (var d0 = 0u; d0 < p.dk; d0 += VS) {
        // Tokens 4·(e / VS) .. +3 of dim e % VS (consecutive invocations: consecutive dims).
        for (var e = lid; e < C * VS / 4u; e += 256u) {
          let t = 4u * (e / VS);
          let d = d0 + e % VS;
          var qv = vec4<f32>(0.0);
          if (d < p.dk) {
            for (var m = 0u; m < 4u; m++) {
              if (t + m < cn) {
                qv[m] = q[qb + (t0 + t + m) * p.q_st0 + d];
              }
            }
          }
          shared_rows[((e % VS) * QT + t) / 4u] = qv;
        }
        workgroupBarrier();
        // Rows past cn would only add zeros (a short chunk leaves whole warps idle here).
        let d_end = select(0u, min(VS, p.dk - d0), i0 < cn);
        for (var dd = 0u; dd < d_end; dd++) {
          let d = d0 + dd;
          let s = S[d * 4u + cq];
          ws0 = fma(vec4<f32>(scratch[w_at + d * C + i0]), s, ws0);
          qs0 = fma(vec4<f32>(q_slab(dd * QT + i0)), s, qs0);
        }
        workgroupBarrier();
      }
    }
    // Δ = U − W S, zero in rows >= cn.
    var u0 = vec4<f32>(0.0);
    for (var e = 0u; e < n_cols; e++) {
      u0[e] = scratch[u_at + i0 * p.dv + c0 + e];
    }
    shared_rows[i0 * 4u + cq] = u0 - ws0;
    workgroupBarrier();
    // o = γ⊙(Q S) + P Δ and, unless it is dead, S ← γ_{cn−1} S + Kᵀ diag(dlast) Δ, both over j < cn.
    var o0 = scratch[gam_at + i0] * qs0;
    let update = ch + 1u < n_chunks || p.has_state_out != 0u;
    if (update) {
      let g_last = scratch[gam_at + cn - 1u];
      // Rows of S past dk read k at row dk − 1, and their sums are never stored.
      let d0 = min(rg, p.dk - 1u);
      let d1 = min(rg + 64u, p.dk - 1u);
      var s0 = vec4<f32>(0.0);
      var s1 = vec4<f32>(0.0);
      if (rg < p.dk) {
        s0 = g_last * S[rg * 4u + cq];
      }
      if (rg + 64u < p.dk) {
        s1 = g_last * S[(rg + 64u) * 4u + cq];
      }
      for (var j = 0u; j < cn; j++) {
        let dj = shared_rows[j * 4u + cq];
        o0 = fma(vec4<f32>(scratch[p_at + j * C + i0]), dj, o0);
        let kr = kb + (t0 + j) * p.k_st0;
        let dl = scratch[dl_at + j];
        s0 = fma(vec4<f32>(dl * k[kr + d0]), dj, s0);
        s1 = fma(vec4<f32>(dl * k[kr + d1]), dj, s1);
      }
      // Every read of S by other invocations (W S, Q S) came before the barrier above.
      if (rg < p.dk) {
        S[rg * 4u + cq] = s0;
      }
      if (rg + 64u < p.dk) {
        S[(rg + 64u) * 4u + cq] = s1;
      }
    } else {
      for (var j = 0u; j < cn; j++) {
        o0 = fma(vec4<f32>(scratch[p_at + j * C + i0]), shared_rows[j * 4u + cq], o0);
      }
    }
    let ob = p.o_off + h * p.o_st1 + c0;
    if (i0 < cn) {
      for (var e = 0u; e < n_cols; e++) {
        out[ob + (t0 + i0) * p.o_st0 + e] = o0[e];
      }
    }
    workgroupBarrier();
  }
  if (p.has_state_out != 0u) {
    for (var d = rg; d < p.dk; d += 64u) {
      let sv = S[d * 4u + cq];
      let at = p.so_off + (h * p.dk + d) * p.dv + c0;
      for (var e = 0u; e < n_cols; e++) {
        state_out[at + e] = sv[e];
      }
    }
  }
}
