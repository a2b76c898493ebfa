// Gated delta rule, chunked (WY/UT form), part 3 of 3: every chunk's output at once, from the chunk's
// starting state S_c and Δ_c left by part 2 (gated_delta_net.wgsl) and Pᵀ, γ from part 1:
//   o_i = γ_i Sᵀ_c q_i + Σ_{j<=i} P_ij Δ_j   (i < cn),
// the Q S product skipped for a chunk whose S_c is zero (first chunk of a sequence without state_in).
//
// Layout: q [n,Hk,dk], out [n,Hv,dv] (outer strides free); table (u32): chunk ci at chunk_base + 3·ci
// holds (t0, cn, S_c nonzero); scratch region of (ci, h) at (ci·Hv + h)·region as in part 1, with Δ
// in U's place and S_c [dk×dv] (key-major) in the S slot. dk <= 128.
// Launch: one workgroup of 256 invocations per (dv slice of 16 columns, value head, chunk), i.e.
// ceil(dv/16)·Hv·n_chunks workgroups (folded). Invocation (rg, cq) = (lid/4, lid%4) owns row rg and
// columns 4cq..4cq+3 of the slice (vec4 registers), so a warp reads 8 consecutive rows of Pᵀ (one
// cache line) per load. Workgroup memory: S_c's slice [dk×16] (8 KiB, later Δ's [64×16]) and q in
// slabs of 16 dims × 64 tokens, dim-major (row stride 68, 4.25 KiB): 12.25 KiB. FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, o_off: u32,
  o_st0: u32, o_st1: u32, n_chunks: u32, chunk_base: u32,
  n_slices: u32, region: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const C: u32 = 64u;
const VS: u32 = 16u;
const QT: u32 = 68u;  // stride of the staged q slab's dims, in floats (a multiple of 4)

// Both only ever written as whole vec4s: WGSL lets a write to one component access the whole vector,
// so invocations writing neighbouring components would race.
var<workgroup> rows: array<vec4<f32>, 512>;     // S_c [dk][VS/4], then Δ [C][VS/4]
var<workgroup> q_sl: array<vec4<f32>, 272>;     // [VS][QT] floats
var<workgroup> live_wg: u32;

fn q_slab(e: u32) -> f32 {
  return q_sl[e / 4u][e % 4u];
}

@compute @workgroup_size(256)
fn output(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let item = linear_group(wid, nwg);
  if (item >= p.n_slices * p.hv * p.n_chunks) {
    return;
  }
  let slice = item % p.n_slices;
  let h = (item / p.n_slices) % p.hv;
  let ci = item / (p.n_slices * p.hv);
  let kh = h / (p.hv / p.hk);
  let cq = lid % 4u;
  let rg = lid / 4u;
  let i0 = rg;
  let c0 = slice * VS + 4u * cq;
  // Columns c0 .. c0 + n_cols − 1 exist (dv need not be a multiple of 4).
  let n_cols = min(4u, max(p.dv, c0) - c0);
  let t0 = table[p.chunk_base + 3u * ci];
  let cn = table[p.chunk_base + 3u * ci + 1u];
  if (lid == 0u) {
    live_wg = table[p.chunk_base + 3u * ci + 2u];
  }
  let live = workgroupUniformLoad(&live_wg);
  let base = (ci * p.hv + h) * p.region;
  let p_at = base;
  let u_at = base + C * C + C * p.dk;
  let gam_at = u_at + C * p.dv;
  let s_at = gam_at + 2u * C;
  let qb = p.q_off + kh * p.q_st1;

  var qs0 = vec4<f32>(0.0);
  if (live != 0u) {
    for (var d = rg; d < p.dk; d += 64u) {
      var sv = vec4<f32>(0.0);
      for (var e = 0u; e < n_cols; e++) {
        sv[e] = scratch[s_at + d * p.dv + c0 + e];
      }
      rows[d * 4u + cq] = sv;
    }
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
        q_sl[((e % VS) * QT + t) / 4u] = qv;
      }
      workgroupBarrier();
      // Rows past cn are never stored.
      let d_end = select(0u, min(VS, p.dk - d0), i0 < cn);
      for (var dd = 0u; dd < d_end; dd++) {
        qs0 = fma(vec4<f32>(q_slab(dd * QT + i0)), rows[(d0 + dd) * 4u + cq], qs0);
      }
      workgroupBarrier();
    }
  }
  var dv4 = vec4<f32>(0.0);
  for (var e = 0u; e < n_cols; e++) {
    dv4[e] = scratch[u_at + i0 * p.dv + c0 + e];
  }
  rows[i0 * 4u + cq] = dv4;
  workgroupBarrier();
  if (i0 < cn) {
    // Pᵀ is zero above the diagonal (j > i).
    var o0 = scratch[gam_at + i0] * qs0;
    for (var j = 0u; j <= i0; j++) {
      o0 = fma(vec4<f32>(scratch[p_at + j * C + i0]), rows[j * 4u + cq], o0);
    }
    let ob = p.o_off + h * p.o_st1 + (t0 + i0) * p.o_st0 + c0;
    for (var e = 0u; e < n_cols; e++) {
      out[ob + e] = o0[e];
    }
  }
}
