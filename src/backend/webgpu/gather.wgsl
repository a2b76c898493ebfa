// Row gathers: embedding (out[t,:] = table[ids[t],:]) and gather_rows (out[i,:] = x[idx[i],:]).
//
// Layout: src [V,d] (row stride src_stride elements; a split weight is bound one piece at a time and
// rows outside [row_begin, row_begin + row_count) are left to the other pieces' dispatches), ids [n]
// I32, out [n,d] F32 (row stride out_stride). The source is read as u32 words: F32 bit patterns
// (gather_f32) or BF16 pairs widened exactly (gather_bf16).
// Launch: one invocation per output element, 256 per workgroup, ceil(n·d / 256) workgroups (folded).
// Ids outside [0, total_rows) give zero rows (written by the dispatch with zero_invalid set); the
// engine validates token ids on the host before they are uploaded.

struct Params {
  n: u32, d: u32, src_off: u32, src_stride: u32,
  ids_off: u32, out_off: u32, out_stride: u32, row_begin: u32,
  row_count: u32, total_rows: u32, zero_invalid: u32, pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// The element index of (t, j) in src, or -1 when row ids[t] is not in this piece (-2: invalid id).
fn source_index(t: u32, j: u32) -> i32 {
  let id = ids[p.ids_off + t];
  if (id < 0 || u32(id) >= p.total_rows) {
    return -2;
  }
  let local = u32(id);
  if (local < p.row_begin || local >= p.row_begin + p.row_count) {
    return -1;
  }
  return i32(p.src_off + (local - p.row_begin) * p.src_stride + j);
}

@compute @workgroup_size(256)
fn gather_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.n * p.d) {
    return;
  }
  let t = i / p.d;
  let j = i % p.d;
  let e = source_index(t, j);
  if (e >= 0) {
    out[p.out_off + t * p.out_stride + j] = bitcast<f32>(src[u32(e)]);
  } else if (e == -2 && p.zero_invalid != 0u) {
    out[p.out_off + t * p.out_stride + j] = 0.0;
  }
}

@compute @workgroup_size(256)
fn gather_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.n * p.d) {
    return;
  }
  let t = i / p.d;
  let j = i % p.d;
  let e = source_index(t, j);
  if (e >= 0) {
    out[p.out_off + t * p.out_stride + j] = bf16_from_word(src[u32(e) >> 1u], u32(e));
  } else if (e == -2 && p.zero_invalid != 0u) {
    out[p.out_off + t * p.out_stride + j] = 0.0;
  }
}
