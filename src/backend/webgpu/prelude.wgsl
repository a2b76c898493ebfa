// Prepended to every kernel file at pipeline creation (device.cpp): helpers shared by all kernels.
//
// Dispatch folding: the host folds a linear count of workgroups into a 2-D grid (x up to the
// per-dimension limit, then y), so a kernel's linear workgroup index is wid.x + wid.y * nwg.x and
// indices past the kernel's own count return early.
// BF16 values are read from u32 words: element e lives in word e >> 1, low half when e is even.

fn linear_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.x + wid.y * nwg.x;
}

fn bf16_from_word(word: u32, e: u32) -> f32 {
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
}

// Round to nearest even; NaN stays a quiet NaN (as common/bf16.h).
fn f32_to_bf16_bits(f: f32) -> u32 {
  let u = bitcast<u32>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return ((u >> 16u) | 0x40u) & 0xffffu;
  }
  return ((u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u) & 0xffffu;
}

// Overflow-free logistic: exp of a non-positive argument only.
fn sigmoid(x: f32) -> f32 {
  if (x >= 0.0) {
    return 1.0 / (1.0 + exp(-x));
  }
  let e = exp(x);
  return e / (1.0 + e);
}

fn silu(x: f32) -> f32 {
  return x * sigmoid(x);
}

// log(1 + x) without the cancellation of log(1 + x) for small x (Goldberg's correction).
fn log1p_accurate(x: f32) -> f32 {
  let u = 1.0 + x;
  if (u == 1.0) {
    return x;
  }
  return log(u) * x / (u - 1.0);
}

// Offset of row r of a tensor whose outer dims are (s0, s1, s2) (padded with 1 at the front) and
// strides (st.x, st.y, st.z); rows are enumerated row-major over the outer dims.
fn row_offset3(r: u32, s1: u32, s2: u32, st: vec3<u32>) -> u32 {
  let i2 = r % s2;
  let q = r / s2;
  let i1 = q % s1;
  let i0 = q / s1;
  return i0 * st.x + i1 * st.y + i2 * st.z;
}

// Slot of quad x of k row kk in a [16][16 quads] tile whose quads are XOR-swizzled by kk (the GDN
// tiled kernels' layout): the 16 invocations storing one k row hit distinct banks, and so do those
// reading one quad column across k rows.
fn swz(kk: u32, x: u32) -> u32 {
  return kk * 16u + (x ^ (kk & 7u));
}

// A 4×4 block of accumulators (the tiled matmul and the GDN output): rj holds block row j, four
// output columns.
struct Block4 {
  r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32>,
}

fn zero_block4() -> Block4 {
  return Block4(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// One k of a 4×4 block: xv holds the block's four rows of the left operand, wv its four columns of
// the right one.
fn fma4(a: Block4, xv: vec4<f32>, wv: vec4<f32>) -> Block4 {
  return Block4(fma(vec4<f32>(xv.x), wv, a.r0), fma(vec4<f32>(xv.y), wv, a.r1),
                fma(vec4<f32>(xv.z), wv, a.r2), fma(vec4<f32>(xv.w), wv, a.r3));
}

// The two vec4 sums group8_sum adds over a lane group (reduce_subgroups.wgsl or reduce_workgroup.wgsl,
// whichever the device takes, both after this file).
struct Pair4 {
  a: vec4<f32>, b: vec4<f32>,
}
