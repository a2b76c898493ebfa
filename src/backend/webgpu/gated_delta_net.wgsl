// Gated delta rule, chunked (WY/UT form), part 2 of 3: the state recurrence over a sequence's chunks,
// the only sequential part. Per sequence and value head h the state S ∈ R^{dk×dv} starts from
// state_in[h] (has_state_in) or 0; per chunk c, with γ, dlast from gated_delta_net_prep.wgsl and Wᵀ, U
// from gated_delta_net_wu.wgsl:
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
// reads 16 consecutive rows of Wᵀ per load. Per chunk: W S (at most 64 FMAs), one barrier; the
// half-0 invocations form Δ row rg (U, dlast and γ were loaded before the W S loop), store it and
// put dlast_rg·Δ_rg in workgroup memory, one barrier; the update (cn FMAs), one barrier. The walk is
// bound by the latency of its global loads, not by FMAs, so the W and k loads go in batches of 32
// independent loads ahead of their FMAs (one latency per 32 steps instead of one per step). Measured
// against it and dropped (2026-12-01, H200, `DISABLED_GdnTiming`): every load of a chunk issued a whole
// chunk ahead into registers (W S over four 32-dim groups, the update over two 32-token halves, four
// barriers per chunk): 2,187 tokens 0.87 against 0.88 ms, but 250 tokens 0.27 against 0.22, 6 × 37
// rows 0.27 against 0.22 and 35 × 64 rows 0.87 against 0.75 (more registers and barriers per
// one-chunk workgroup). Also dropped (2026-12-01, one H200 run, 2,187 tokens against 0.83–0.89 ms):
// four independent accumulator chains per invocation 0.96 ms, with 64 loads per batch 0.92, and
// 16-column slices (128 workgroups, two quads per invocation, 20 KiB) 0.99; and (2026-12-02, H200, two
// rounds against main's binaries at 0.878 / 0.880) 4-column slices (512 workgroups, W S over four
// 32-dim quarters, the update over two 32-token halves summed through workgroup memory, four barriers
// per chunk, 9 KiB) 0.933 / 0.915 ms, and 0.950 / 0.926 against 0.756 / 0.767 for 35 × 64 rows (with
// the tiled-product prep variant at 0.906 / 0.876 and 0.818 / 0.766). The walk is about a
// third of the op at 2,187 tokens (0.28–0.35 ms, timed by swapping in a kernel that returns at once).
// Workgroup memory: S[dk×8] (4 KiB), the two W S halves [2×64×8] (4 KiB), dlast·Δ [64×8] (2 KiB):
// 10 KiB. FP32 throughout.

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
const B: u32 = 32u;  // loads in flight per batch (the batch bodies below are written out for 32)

// All only ever written as whole vec4s: WGSL lets a write to one component access the whole vector,
// so invocations writing neighbouring components would race.
var<workgroup> S: array<vec4<f32>, 256>;      // [dk][VS/4]
var<workgroup> ws_sh: array<vec4<f32>, 256>;  // W S over dims 64·half.., [half][C][VS/4]
var<workgroup> dd_sh: array<vec4<f32>, 128>;  // dlast_j Δ_j, [C][VS/4]
var<workgroup> n_chunks_wg: u32;

// Row `row` of S (columns c0 .. c0 + n_cols − 1) to the S slot of chunk region `base`.
fn store_state(base: u32, row: u32, c0: u32, n_cols: u32, sv: vec4<f32>) {
  let at = base + C * C + C * p.dk + C * p.dv + 2u * C + row * p.dv + c0;
  for (var e = 0u; e < n_cols; e++) {
    scratch[at + e] = sv[e];
  }
}

// acc + Σ_{i<4} a[i]·rows[at + 2i] (rows: S or dlast·Δ, two quads per row).
fn fma_rows(a: vec4<f32>, rows_at: u32, from_s: bool, acc: vec4<f32>) -> vec4<f32> {
  if (from_s) {
    return fma(vec4<f32>(a.w), S[rows_at + 6u], fma(vec4<f32>(a.z), S[rows_at + 4u],
               fma(vec4<f32>(a.y), S[rows_at + 2u], fma(vec4<f32>(a.x), S[rows_at], acc))));
  }
  return fma(vec4<f32>(a.w), dd_sh[rows_at + 6u], fma(vec4<f32>(a.z), dd_sh[rows_at + 4u],
             fma(vec4<f32>(a.y), dd_sh[rows_at + 2u], fma(vec4<f32>(a.x), dd_sh[rows_at], acc))));
}

// Four scratch values at stride st from `at`.
fn scratch4(at: u32, st: u32) -> vec4<f32> {
  return vec4<f32>(scratch[at], scratch[at + st], scratch[at + 2u * st], scratch[at + 3u * st]);
}

// Four k values of consecutive tokens from `at`.
fn k_rows4(at: u32) -> vec4<f32> {
  return vec4<f32>(k[at], k[at + p.k_st0], k[at + 2u * p.k_st0], k[at + 3u * p.k_st0]);
}

// acc + Σ_{d0 <= d < d1} Wᵀ[d][rg] S[d][cq-th quad], with Wᵀ[d][rg] at w_at + d·C.
fn w_times_s(w_at: u32, d0: u32, d1: u32, cq: u32, acc: vec4<f32>) -> vec4<f32> {
  var ws = acc;
  var d = d0;
  for (; d + B <= d1; d += B) {
    let a = w_at + d * C;
    let w0 = scratch4(a, C);
    let w1 = scratch4(a + 4u * C, C);
    let w2 = scratch4(a + 8u * C, C);
    let w3 = scratch4(a + 12u * C, C);
    let w4 = scratch4(a + 16u * C, C);
    let w5 = scratch4(a + 20u * C, C);
    let w6 = scratch4(a + 24u * C, C);
    let w7 = scratch4(a + 28u * C, C);
    let at = d * 2u + cq;
    ws = fma_rows(w3, at + 24u, true, fma_rows(w2, at + 16u, true,
                  fma_rows(w1, at + 8u, true, fma_rows(w0, at, true, ws))));
    ws = fma_rows(w7, at + 56u, true, fma_rows(w6, at + 48u, true,
                  fma_rows(w5, at + 40u, true, fma_rows(w4, at + 32u, true, ws))));
  }
  for (; d < d1; d++) {
    ws = fma(vec4<f32>(scratch[w_at + d * C]), S[d * 2u + cq], ws);
  }
  return ws;
}

// acc + Σ_{j < cn} k[t0 + j][kd] (dlast_j Δ_j)[cq-th quad], with k[t0 + j][kd] at k_at + j·k_st0.
fn k_times_delta(k_at: u32, cn: u32, cq: u32, acc: vec4<f32>) -> vec4<f32> {
  var sv = acc;
  var j = 0u;
  for (; j + B <= cn; j += B) {
    let a = k_at + j * p.k_st0;
    let k0 = k_rows4(a);
    let k1 = k_rows4(a + 4u * p.k_st0);
    let k2 = k_rows4(a + 8u * p.k_st0);
    let k3 = k_rows4(a + 12u * p.k_st0);
    let k4 = k_rows4(a + 16u * p.k_st0);
    let k5 = k_rows4(a + 20u * p.k_st0);
    let k6 = k_rows4(a + 24u * p.k_st0);
    let k7 = k_rows4(a + 28u * p.k_st0);
    let at = j * 2u + cq;
    sv = fma_rows(k3, at + 24u, false, fma_rows(k2, at + 16u, false,
                  fma_rows(k1, at + 8u, false, fma_rows(k0, at, false, sv))));
    sv = fma_rows(k7, at + 56u, false, fma_rows(k6, at + 48u, false,
                  fma_rows(k5, at + 40u, false, fma_rows(k4, at + 32u, false, sv))));
  }
  for (; j < cn; j++) {
    sv = fma(vec4<f32>(k[k_at + j * p.k_st0]), dd_sh[j * 2u + cq], sv);
  }
  return sv;
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
    // Loads that do not wait for S go first, so their latency overlaps the W S loop.
    let gam = scratch[gam_at + cn - 1u];
    var uv = vec4<f32>(0.0);
    var dl = 0.0;
    if (half == 0u) {
      for (var e = 0u; e < n_cols; e++) {
        uv[e] = scratch[u_at + rg * p.dv + c0 + e];
      }
      dl = scratch[dl_at + rg];
    }
    // This half of W S for row rg (rows >= cn of Wᵀ are zero, so they are skipped).
    var ws = vec4<f32>(0.0);
    if ((ch > 0u || p.has_state_in != 0u) && rg < cn) {
      ws = w_times_s(w_at + rg, d_begin, d_end, cq, ws);
    }
    ws_sh[lid] = ws;
    workgroupBarrier();
    // Δ = U − W S (zero in rows >= cn), in place of U for part 3; dlast·Δ for the update.
    if (half == 0u) {
      let dlt = uv - (ws + ws_sh[lid + 128u]);
      for (var e = 0u; e < n_cols; e++) {
        scratch[u_at + rg * p.dv + c0 + e] = dlt[e];
      }
      dd_sh[lid] = dl * dlt;
    }
    workgroupBarrier();
    // S ← γ_{cn−1} S + Kᵀ diag(dlast) Δ over j < cn, unless it is dead. Every read of S by other
    // invocations (W S) came before the barriers above.
    if (ch + 1u < n_chunks || p.has_state_out != 0u) {
      sv = k_times_delta(p.k_off + kh * p.k_st1 + t0 * p.k_st0 + kd, cn, cq, sv * gam);
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
