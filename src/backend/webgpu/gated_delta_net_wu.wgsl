// Gated delta rule, chunked (WY/UT form), part 1b: W = T diag(β⊙γ) K and U = T diag(β) V for all
// chunks at once, from T (Tᵀ in the chunk's S slot) and γ left by part 1 (gated_delta_net_prep.wgsl),
// i.e. per chunk and value head one product T · X with X = [diag(β⊙γ) K | diag(β) V] [C × (dk + dv)].
// T is lower triangular and X is zero from row cn on (the FMAs of a k step wholly right of an
// invocation's rows or past cn are skipped), so W and U are zero in rows >= cn.
//
// Layout: k [n,Hk,dk], v [n,Hv,dv], beta [n,Hv] (outer strides free); table (u32): chunk ci at
// chunk_base + 3·ci holds (t0, cn, ·); scratch region of (ci, h) at (ci·Hv + h)·region as in part 1:
// Wᵀ [dk×C] (Wᵀ[d·C + i]), U [C×dv] (row-major), γ, and Tᵀ [C×C] (Tᵀ[j·C + i]) in the S slot, which
// part 2 overwrites with the chunk's starting state only after this kernel.
// Launch: one workgroup of 256 invocations per (64-column slice of [K | V], value head, chunk), i.e.
// ceil((dk+dv)/64)·Hv·n_chunks workgroups (folded), tiled as gated_delta_net_out.wgsl: invocation
// (ty, tx) = (lid/16, lid%16) owns rows 4ty..4ty+3 and columns 4tx..4tx+3 in a 4×4 register block;
// the k walk (over j, 16 at a time) goes through two buffered pairs of [16][64] tiles (k-major, quads
// XOR-swizzled), one barrier per step, the next step's global loads issued before the current
// step's FMAs; Tᵀ rows and X rows are loaded a quad per invocation (16 neighbours: 64 consecutive
// floats of a row). Workgroup memory: 16 KiB. A kernel of its own so that the product gets 4×4
// register blocks and four times part 1's workgroups without adding workgroup memory to part 1, whose
// time follows it; until 2026-12-02 part 1 formed W and U itself (H200 numbers in its header).
// FP32 throughout.

struct Params {
  hk: u32, hv: u32, dk: u32, dv: u32,
  q_off: u32, q_st0: u32, q_st1: u32, k_off: u32,
  k_st0: u32, k_st1: u32, v_off: u32, v_st0: u32,
  v_st1: u32, g_off: u32, g_st: u32, b_off: u32,
  b_st: u32, n_chunks: u32, chunk_base: u32, region: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> table: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;

const C: u32 = 64u;
const NS: u32 = 64u;
const KT: u32 = 16u;

// Two tile pairs back to back: Tᵀ rows (as) and X rows (bs), [KT][16 quads] each, quad x of k row kk
// at kk·16 + (x ^ (kk & 7)).
var<workgroup> as_sh: array<vec4<f32>, 512>;
var<workgroup> bs_sh: array<vec4<f32>, 512>;

struct Chunk {
  t0: u32,
  cn: u32,
  t_at: u32,      // Tᵀ
  w_at: u32,      // Wᵀ
  u_at: u32,      // U
  gam_at: u32,    // γ
  kb: u32,        // k of key head kh, token 0, dim 0
  vb: u32,        // v of value head h, token 0, dim 0
  bb: u32,        // β of value head h, token 0
}

// Rows 4x .. 4x + 3 of T's column j.
fn load_t(ck: Chunk, j: u32, x: u32) -> vec4<f32> {
  let at = ck.t_at + j * C + 4u * x;
  return vec4<f32>(scratch[at], scratch[at + 1u], scratch[at + 2u], scratch[at + 3u]);
}

// X[j][col] (j < cn), zero past dk + dv; b = β_j, bg = β_j γ_j.
fn x_elem(ck: Chunk, j: u32, col: u32, b: f32, bg: f32) -> f32 {
  if (col < p.dk) {
    return bg * k[ck.kb + (ck.t0 + j) * p.k_st0 + col];
  }
  if (col < p.dk + p.dv) {
    return b * v[ck.vb + (ck.t0 + j) * p.v_st0 + col - p.dk];
  }
  return 0.0;
}

// Columns c .. c + 3 of X's row j, zero from cn on.
fn load_x(ck: Chunk, j: u32, c: u32) -> vec4<f32> {
  if (j >= ck.cn) {
    return vec4<f32>(0.0);
  }
  let b = beta[ck.bb + (ck.t0 + j) * p.b_st];
  let bg = b * scratch[ck.gam_at + j];
  return vec4<f32>(x_elem(ck, j, c, b, bg), x_elem(ck, j, c + 1u, b, bg), x_elem(ck, j, c + 2u, b, bg),
                   x_elem(ck, j, c + 3u, b, bg));
}

// Column col of the result, rows i .. i + 3: into Wᵀ (col < dk) or U.
fn store_col(ck: Chunk, i: u32, col: u32, x: vec4<f32>) {
  if (col < p.dk) {
    let at = ck.w_at + col * C + i;
    scratch[at] = x.x;
    scratch[at + 1u] = x.y;
    scratch[at + 2u] = x.z;
    scratch[at + 3u] = x.w;
  } else if (col < p.dk + p.dv) {
    let at = ck.u_at + i * p.dv + col - p.dk;
    scratch[at] = x.x;
    scratch[at + p.dv] = x.y;
    scratch[at + 2u * p.dv] = x.z;
    scratch[at + 3u * p.dv] = x.w;
  }
}

@compute @workgroup_size(256)
fn wu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lid: u32) {
  let n_slices = (p.dk + p.dv + NS - 1u) / NS;
  let item = linear_group(wid, nwg);
  if (item >= n_slices * p.hv * p.n_chunks) {
    return;
  }
  let slice = item % n_slices;
  let h = (item / n_slices) % p.hv;
  let ci = item / (n_slices * p.hv);
  let kh = h / (p.hv / p.hk);
  let base = (ci * p.hv + h) * p.region;
  let w_at = base + C * C;
  let u_at = w_at + C * p.dk;
  let gam_at = u_at + C * p.dv;
  let cn = table[p.chunk_base + 3u * ci + 1u];
  let ck = Chunk(table[p.chunk_base + 3u * ci], cn, gam_at + 2u * C, w_at, u_at, gam_at,
                 p.k_off + kh * p.k_st1, p.v_off + h * p.v_st1, p.b_off + h);
  let c0 = slice * NS;
  // The row quad masked to 0..15 (a no-op) so that every shared read index is provably in range.
  let ty = (lid / 16u) & 15u;
  let tx = lid % 16u;
  let kl = lid / 16u;  // this invocation's load row within a step
  let cb = c0 + 4u * tx;
  let n_steps = C / KT;

  var pa = load_t(ck, kl, tx);
  var pb = load_x(ck, kl, cb);
  as_sh[swz(kl, tx)] = pa;
  bs_sh[swz(kl, tx)] = pb;
  workgroupBarrier();
  var acc = zero_block4();
  var cur = 0u;  // the tile pair being read: 0 or 256
  for (var s = 0u; s < n_steps; s++) {
    let more = s + 1u < n_steps;
    if (more) {
      pa = load_t(ck, KT * (s + 1u) + kl, tx);
      pb = load_x(ck, KT * (s + 1u) + kl, cb);
    }
    // X is zero from row cn on and T_ij = 0 for j > i: a step wholly past cn or right of the
    // invocation's rows adds nothing (uniform per warp).
    if (KT * s < cn && KT * s <= 4u * ty + 3u) {
      for (var kk = 0u; kk < KT; kk++) {
        let at = cur + kk * 16u;
        let sw = kk & 7u;
        acc = fma4(acc, as_sh[at + (ty ^ sw)], bs_sh[at + (tx ^ sw)]);
      }
    }
    // The other pair was last read before the previous barrier, so it can be refilled now; the
    // barrier below publishes it (and ends this step's reads of `cur`).
    cur ^= 256u;
    if (more) {
      as_sh[cur + swz(kl, tx)] = pa;
      bs_sh[cur + swz(kl, tx)] = pb;
    }
    workgroupBarrier();
  }
  let i = 4u * ty;
  store_col(ck, i, cb, vec4<f32>(acc.r0.x, acc.r1.x, acc.r2.x, acc.r3.x));
  store_col(ck, i, cb + 1u, vec4<f32>(acc.r0.y, acc.r1.y, acc.r2.y, acc.r3.y));
  store_col(ck, i, cb + 2u, vec4<f32>(acc.r0.z, acc.r1.z, acc.r2.z, acc.r3.z));
  store_col(ck, i, cb + 3u, vec4<f32>(acc.r0.w, acc.r1.w, acc.r2.w, acc.r3.w));
}
