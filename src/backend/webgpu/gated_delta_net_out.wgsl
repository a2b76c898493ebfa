// Gated delta rule, chunked (WY/UT form), part 3 of 3: every chunk's output at once, from the chunk's
// starting state S_c and Δ_c left by part 2 (gated_delta_net.wgsl) and Pᵀ, γ from part 1:
//   o_i = γ_i Sᵀ_c q_i + Σ_{j<=i} P_ij Δ_j   (i < cn),
// i.e. per chunk and value head one product [Q | P] · [S_c ; Δ] scaled between its two parts: the
// output rows accumulate Q S_c over dk (zero where S_c is zero: the first chunk of a sequence
// without state_in), are scaled by γ_i, then accumulate P Δ over the chunk's 64 rows (P is zero above
// the diagonal and past cn).
//
// Layout: q [n,Hk,dk], out [n,Hv,dv] (outer strides free); table (u32): chunk ci at chunk_base + 3·ci
// holds (t0, cn, S_c nonzero); scratch region of (ci, h) at (ci·Hv + h)·region as in part 1, with Δ
// in U's place and S_c [dk×dv] (key-major) in the S slot. dk <= 128.
// Launch: one workgroup of 256 invocations per (dv slice of 64 columns, value head, chunk), i.e.
// ceil(dv/64)·Hv·n_chunks workgroups (folded), tiled in 64×64: invocation
// (ty, tx) = (lid/16, lid%16) owns rows 4ty..4ty+3 and columns 4tx..4tx+3 in a 4×4 register block;
// the k walk (ceil(dk/16) steps of Q S_c, then 4 of P Δ; a chunk with S_c zero reads zeros rather
// than skipping, so that the step count stays uniform) goes in steps of 16 through two buffered
// pairs of [16][64] tiles (k-major, quads XOR-swizzled as in matmul.wgsl), one barrier per step, the
// next step's global loads issued before the current step's FMAs. q rows are loaded one k per
// invocation over four tokens (16 neighbours: 16 consecutive dims of a token), Pᵀ, S_c and Δ rows a
// quad per invocation (16 neighbours: 64 consecutive floats of a row). Until 2026-12-01 a workgroup
// owned a 16-column slice with one row per invocation, staged q in 8 slabs with two barriers each
// (no load ahead) and read Pᵀ straight from global memory inside its j loop. The op took as long for
// 35 rows of 64 tokens (a one-chunk recurrence) as for one row of 2,187 (H200, with a recurrence
// variant: 1.34 against 1.28 ms), so its time was in the parallel kernels; this kernel took it from
// 1.37 to 0.87 ms (H200, `DISABLED_GdnTiming`, the other two kernels the same). Workgroup memory:
// 16 KiB. FP32 throughout.

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
const VS: u32 = 64u;
const KT: u32 = 16u;

// Two tile pairs back to back: [Q | P] rows (as) and [S_c ; Δ] columns (bs), [KT][16 quads] each,
// quad x of k row kk at kk·16 + (x ^ (kk & 7)).
var<workgroup> as_sh: array<vec4<f32>, 512>;
var<workgroup> bs_sh: array<vec4<f32>, 512>;

// Where one chunk keeps what this kernel reads.
struct Chunk {
  t0: u32,
  cn: u32,
  live: bool,     // S_c nonzero
  p_at: u32,      // Pᵀ
  u_at: u32,      // Δ
  gam_at: u32,    // γ
  s_at: u32,      // S_c
  q_at: u32,      // q of key head kh, token 0, dim 0
}

// The left operand of step s at k offset kk, rows 4x .. 4x + 3: q (tokens past cn read token
// cn − 1 and dims past dk read dk − 1; their products reach only unstored rows or meet zero rows of
// S_c), then P (Pᵀ row j).
fn load_a(ck: Chunk, n_qs: u32, s: u32, kk: u32, x: u32) -> vec4<f32> {
  if (s < n_qs) {
    let last = ck.cn - 1u;
    let at = ck.q_at + min(KT * s + kk, p.dk - 1u) + ck.t0 * p.q_st0;
    let r0 = 4u * x;
    return vec4<f32>(q[at + min(r0, last) * p.q_st0], q[at + min(r0 + 1u, last) * p.q_st0],
                     q[at + min(r0 + 2u, last) * p.q_st0], q[at + min(r0 + 3u, last) * p.q_st0]);
  }
  let at = ck.p_at + (KT * (s - n_qs) + kk) * C + 4u * x;
  return vec4<f32>(scratch[at], scratch[at + 1u], scratch[at + 2u], scratch[at + 3u]);
}

// The right operand of step s at k offset kk, columns c .. c + 3 of the slice (a column past dv
// reads dv − 1: never stored): S_c row d (zero past dk or where S_c is zero), then Δ row j.
fn load_b(ck: Chunk, n_qs: u32, s: u32, kk: u32, c: u32) -> vec4<f32> {
  let last = p.dv - 1u;
  var at: u32;
  if (s < n_qs) {
    let d = KT * s + kk;
    if (!ck.live || d >= p.dk) {
      return vec4<f32>(0.0);
    }
    at = ck.s_at + d * p.dv;
  } else {
    at = ck.u_at + (KT * (s - n_qs) + kk) * p.dv;
  }
  return vec4<f32>(scratch[at + min(c, last)], scratch[at + min(c + 1u, last)],
                   scratch[at + min(c + 2u, last)], scratch[at + min(c + 3u, last)]);
}

// Where step s's loads go in a tile: q is loaded one k per invocation (kk = lid % 16, row quad
// lid / 16), the rest a quad per invocation (quad lid % 16, kk = lid / 16).
fn a_slot(n_qs: u32, s: u32, lid: u32) -> u32 {
  if (s < n_qs) {
    return swz(lid % KT, lid / KT);
  }
  return swz(lid / 16u, lid % 16u);
}

fn stage(n_qs: u32, s: u32, lid: u32, buf: u32, a: vec4<f32>, b: vec4<f32>) {
  as_sh[buf + a_slot(n_qs, s, lid)] = a;
  bs_sh[buf + swz(lid / 16u, lid % 16u)] = b;
}

fn fetch_a(ck: Chunk, n_qs: u32, s: u32, lid: u32) -> vec4<f32> {
  if (s < n_qs) {
    return load_a(ck, n_qs, s, lid % KT, lid / KT);
  }
  return load_a(ck, n_qs, s, lid / 16u, lid % 16u);
}

// Row i (< cn) of the output, columns c .. c + 3 (those < dv).
fn store_row(ck: Chunk, h: u32, i: u32, c: u32, v: vec4<f32>) {
  if (i >= ck.cn) {
    return;
  }
  let at = p.o_off + h * p.o_st1 + (ck.t0 + i) * p.o_st0;
  for (var e = 0u; e < 4u; e++) {
    if (c + e < p.dv) {
      out[at + c + e] = v[e];
    }
  }
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
  let base = (ci * p.hv + h) * p.region;
  let u_at = base + C * C + C * p.dk;
  let gam_at = u_at + C * p.dv;
  let ck = Chunk(table[p.chunk_base + 3u * ci], table[p.chunk_base + 3u * ci + 1u],
                 table[p.chunk_base + 3u * ci + 2u] != 0u, base, u_at, gam_at, gam_at + 2u * C,
                 p.q_off + kh * p.q_st1);
  let c0 = slice * VS;
  // The row quad masked to 0..15 (a no-op) so that every shared read index is provably in range.
  let ty = (lid / 16u) & 15u;
  let tx = lid % 16u;
  let cb = c0 + 4u * (lid % 16u);  // this invocation's load columns
  let n_qs = (p.dk + KT - 1u) / KT;
  let n_steps = n_qs + C / KT;

  var pa = fetch_a(ck, n_qs, 0u, lid);
  var pb = load_b(ck, n_qs, 0u, lid / 16u, cb);
  stage(n_qs, 0u, lid, 0u, pa, pb);
  workgroupBarrier();
  var acc = zero_block4();
  var cur = 0u;  // the tile pair being read: 0 or 256
  for (var s = 0u; s < n_steps; s++) {
    let more = s + 1u < n_steps;
    if (more) {
      pa = fetch_a(ck, n_qs, s + 1u, lid);
      pb = load_b(ck, n_qs, s + 1u, lid / 16u, cb);
    }
    if (s == n_qs) {
      let g = vec4<f32>(scratch[gam_at + 4u * ty], scratch[gam_at + 4u * ty + 1u],
                        scratch[gam_at + 4u * ty + 2u], scratch[gam_at + 4u * ty + 3u]);
      acc = Block4(g.x * acc.r0, g.y * acc.r1, g.z * acc.r2, g.w * acc.r3);
    }
    for (var kk = 0u; kk < KT; kk++) {
      let at = cur + kk * 16u;
      let sw = kk & 7u;
      acc = fma4(acc, as_sh[at + (ty ^ sw)], bs_sh[at + (tx ^ sw)]);
    }
    // The other pair was last read before the previous barrier, so it can be refilled now; the
    // barrier below publishes it (and ends this step's reads of `cur`).
    cur ^= 256u;
    if (more) {
      stage(n_qs, s + 1u, lid, cur, pa, pb);
    }
    workgroupBarrier();
  }
  let c = c0 + 4u * tx;
  store_row(ck, h, 4u * ty, c, acc.r0);
  store_row(ck, h, 4u * ty + 1u, c, acc.r1);
  store_row(ck, h, 4u * ty + 2u, c, acc.r2);
  store_row(ck, h, 4u * ty + 3u, c, acc.r3);
}
