// copy: out = x over same-shaped views, F32 or BF16 on either side (BF16 rounds to nearest even,
// NaN kept quiet, as common/bf16.h).
//
// Layout: outer dims folded to (s0, s1, s2) with per-tensor strides, innermost length d. Both sides
// are bound as u32 words (F32 bit patterns or BF16 pairs).
// Launch, 256 invocations per workgroup (folded):
// - copy_to_f32: one invocation per element (x F32 or BF16 per x_bf16);
// - copy_to_bf16: one invocation per output u32 word of a contiguous out (o_off counted in BF16
//   elements): it writes the word's halves that belong to out and keeps the others, so no two
//   invocations touch one word.

struct Params {
  d: u32, n_rows: u32, s1: u32, s2: u32,
  x_off: u32, o_off: u32, x_bf16: u32, n_words: u32,
  x_st: vec4<u32>,
  o_st: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// Element `flat` of x (row-major over the logical shape) as f32.
fn x_value(flat: u32) -> f32 {
  let r = flat / p.d;
  let j = flat % p.d;
  let e = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz) + j;
  if (p.x_bf16 != 0u) {
    return bf16_from_word(x[e >> 1u], e);
  }
  return bitcast<f32>(x[e]);
}

// Element `flat` of x as BF16 bits (exact when x is BF16).
fn x_bf16_bits(flat: u32) -> u32 {
  let r = flat / p.d;
  let j = flat % p.d;
  let e = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz) + j;
  if (p.x_bf16 != 0u) {
    return (x[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu;
  }
  return f32_to_bf16_bits(bitcast<f32>(x[e]));
}

@compute @workgroup_size(256)
fn copy_to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.n_rows * p.d) {
    return;
  }
  let r = i / p.d;
  let j = i % p.d;
  out[p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz) + j] = bitcast<u32>(x_value(i));
}

@compute @workgroup_size(256)
fn copy_to_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let wi = linear_group(wid, nwg) * 256u + lid;
  if (wi >= p.n_words) {
    return;
  }
  let total = p.n_rows * p.d;
  let word_index = (p.o_off >> 1u) + wi;
  var word = out[word_index];
  for (var h = 0u; h < 2u; h++) {
    let e = word_index * 2u + h;
    if (e >= p.o_off && e - p.o_off < total) {
      let shift = h * 16u;
      word = (word & ~(0xffffu << shift)) | (x_bf16_bits(e - p.o_off) << shift);
    }
  }
  out[word_index] = word;
}
