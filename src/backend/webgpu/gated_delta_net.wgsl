// Gated delta rule, chunked (WY/UT form), part 2 of 3: the state recurrence over a sequence's chunks,
// the only sequential part. Per sequence and value head h the state S ∈ R^{dk×dv} starts from
// state_in[h] (has_state_in) or 0; per chunk c, with Wᵀ, U, γ, dlast from gated_delta_net_prep.wgsl:
//   Δ_c = U − W S_c;   S_{c+1} = γ_{cn−1} S_c + Σ_j dlast_j k_j Δ_jᵀ,
// which is the token recurrence S ← α_t S + β_t k_t (v_t − α_t Sᵀk_t)ᵀ (KEV_SPEC §5.4) taken 64 tokens
// at a time (a ragged last chunk is the spec's zero padding). Δ_c replaces U in the chunk's scratch
// region and S_c (when not zero) goes to its S slot, so that part 3 (gated_delta_net_out.wgsl) computes
// every chunk's output o = γ⊙(Q S_c) + P Δ_c in parallel. W S is skipped while S is zero (first chunk
// without state_in) and for rows past a short chunk's end, and the last update when nobody reads it
// (no state_out).
//
// Layout: k [n,Hk,dk] (outer strides free); state_in / state_out [Hv,dk,dv] contiguous, key-major;
// table (u32): sequence r at 4·r holds (first chunk, chunk count, first token, length); scratch as in
// part 1. dk <= 128.
// Launch: one workgroup of 256 invocations per (dv slice of 8 columns, value head, sequence), i.e.
// ceil(dv/8)·Hv·R workgroups (folded): narrow slices put two workgroups on each multiprocessor of
// a large GPU for the 0.8b shapes, and halve each invocation's serial work. Invocation
// (half, rg, cq) = (lid/128, lid/2 % 64, lid%2) owns columns 4cq..4cq+3 of the slice (vec4
// registers): the part of row rg of W S over dims 64·half .. 64·half + 63, and row lid/2 of S. A warp
// reads 16 consecutive rows of Wᵀ per load. Per chunk: W S (at most 64 FMAs), one barrier, the update
// (cn FMAs, Δ_j = U_j − (both halves of W S)_j read from workgroup memory), one barrier. Workgroup
// memory: S[dk×8] (4 KiB), U and the two W S halves [64×8] (2 KiB each): 10 KiB. FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  k_off: u32, k_st0: u32, k_st1: u32, si_off: u32,
  so_off: u32, has_state_in: u32, has_state_out: u32, n_seqs: u32,
  n_slices: u32, region: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> state_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> table: array<u32>;
@group(0) @binding(4) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(5) var<storage, read_write> state_out: array<f32>;

const C: u32 = 64u;
const VS: u32 = 8u;

// All only ever written as whole vec4s: WGSL lets a write to one component access the whole vector,
// so invocations writing neighbouring components would race.
var<workgroup> S: array<vec4<f32>, 256>;      // [dk][VS/4]
var<workgroup> u_sh: array<vec4<f32>, 128>;   // U [C][VS/4]
var<workgroup> ws_sh: array<vec4<f32>, 256>;  // W S over dims 64·half.., [half][C][VS/4]
var<workgroup> n_chunks_wg: u32;

// Row `row` of S (columns c0 .. c0 + n_cols − 1) to the S slot of chunk region `base`.
fn store_state(base: u32, row: u32, c0: u32, n_cols: u32, sv: vec4<f32>) {
  let at = base + C * C + C * p.dk + C * p.dv + 2u * C + row * p.dv + c0;
  for (var e = 0u; e < n_cols; e++) {
    scratch[at + e] = sv[e];
  }
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
  let cq = lid % 2u;
  let rg = (lid / 2u) % 64u;
  let half = lid / 128u;
  let row = lid / 2u;  // this invocation's row of S
  let c0 = slice * VS + 4u * cq;
  // Columns c0 .. c0 + n_cols − 1 exist (dv need not be a multiple of 4).
  let n_cols = min(4u, max(p.dv, c0) - c0);
  let first_chunk = table[4u * r];
  let t_begin = table[4u * r + 2u];
  let len = table[4u * r + 3u];
  if (lid == 0u) {
    n_chunks_wg = table[4u * r + 1u];
  }
  let has_row = row < p.dk;
  var sv = vec4<f32>(0.0);
  if (p.has_state_in != 0u && has_row) {
    let at = p.si_off + (h * p.dk + row) * p.dv + c0;
    for (var e = 0u; e < n_cols; e++) {
      sv[e] = state_in[at + e];
    }
  }
  if (has_row) {
    S[row * 2u + cq] = sv;
  }
  let n_chunks = workgroupUniformLoad(&n_chunks_wg);
  if (p.has_state_in != 0u && n_chunks > 0u && has_row) {
    store_state((first_chunk * p.hv + h) * p.region, row, c0, n_cols, sv);
  }
  let kb = p.k_off + kh * p.k_st1;
  // Rows of S past dk read k at row dk − 1, and their sums are never stored.
  let kd = min(row, p.dk - 1u);
  let d_begin = 64u * half;
  let d_end = min(p.dk, d_begin + 64u);
  for (var ch = 0u; ch < n_chunks; ch++) {
    let base = ((first_chunk + ch) * p.hv + h) * p.region;
    let w_at = base + C * C;
    let u_at = w_at + C * p.dk;
    let gam_at = u_at + C * p.dv;
    let dl_at = gam_at + C;
    let t0 = t_begin + ch * C;
    let cn = min(C, len - ch * C);
    // This half of W S for row rg (rows >= cn of Wᵀ are zero, so they are skipped).
    var ws = vec4<f32>(0.0);
    if ((ch > 0u || p.has_state_in != 0u) && rg < cn) {
      for (var d = d_begin; d < d_end; d++) {
        ws = fma(vec4<f32>(scratch[w_at + d * C + rg]), S[d * 2u + cq], ws);
      }
    }
    ws_sh[lid] = ws;
    if (half == 0u) {
      var uv = vec4<f32>(0.0);
      for (var e = 0u; e < n_cols; e++) {
        uv[e] = scratch[u_at + rg * p.dv + c0 + e];
      }
      u_sh[rg * 2u + cq] = uv;
    }
    workgroupBarrier();
    // Δ = U − W S (zero in rows >= cn), in place of U for part 3.
    if (half == 0u) {
      let dlt = u_sh[lid] - (ws_sh[lid] + ws_sh[lid + 128u]);
      for (var e = 0u; e < n_cols; e++) {
        scratch[u_at + rg * p.dv + c0 + e] = dlt[e];
      }
    }
    // S ← γ_{cn−1} S + Kᵀ diag(dlast) Δ over j < cn, unless it is dead. Every read of S by other
    // invocations (W S) came before the barrier above.
    if (ch + 1u < n_chunks || p.has_state_out != 0u) {
      sv *= scratch[gam_at + cn - 1u];
      for (var j = 0u; j < cn; j++) {
        let e = j * 2u + cq;
        let dj = u_sh[e] - (ws_sh[e] + ws_sh[e + 128u]);
        let dk_j = scratch[dl_at + j] * k[kb + (t0 + j) * p.k_st0 + kd];
        sv = fma(vec4<f32>(dk_j), dj, sv);
      }
      if (has_row) {
        S[row * 2u + cq] = sv;
        if (ch + 1u < n_chunks) {
          store_state(base + p.hv * p.region, row, c0, n_cols, sv);
        }
      }
    }
    workgroupBarrier();
  }
  if (p.has_state_out != 0u && has_row) {
    let at = p.so_off + (h * p.dk + row) * p.dv + c0;
    for (var e = 0u; e < n_cols; e++) {
      state_out[at + e] = sv[e];
    }
  }
}
