// Element-wise maps over same-shaped views (rank 1..4, innermost contiguous, outer strides free):
//   sigmoid_mul: out = x · σ(y);   swiglu: out = SiLU(x) · y;   add: out = x + y.
//
// Layout: outer dims folded to (s0, s1, s2) with per-tensor strides, innermost length d.
// Launch: one invocation per element, 256 per workgroup, ceil(rows·d / 256) workgroups (folded).
// In-place use (out the identical view of x or y) reaches the kernel with the input copied aside by
// the backend (WebGPU forbids a writable binding overlapping another binding of the same dispatch).

struct Params {
  d: u32, n_rows: u32, s1: u32, s2: u32,
  x_off: u32, y_off: u32, o_off: u32, pad0: u32,
  x_st: vec4<u32>,
  y_st: vec4<u32>,
  o_st: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

struct Slots {
  xi: u32, yi: u32, oi: u32, valid: bool,
}

fn slots(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Slots {
  let i = linear_group(wid, nwg) * 256u + lid;
  var s: Slots;
  s.valid = i < p.n_rows * p.d;
  let r = i / max(p.d, 1u);
  let j = i % max(p.d, 1u);
  s.xi = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz) + j;
  s.yi = p.y_off + row_offset3(r, p.s1, p.s2, p.y_st.xyz) + j;
  s.oi = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz) + j;
  return s;
}

@compute @workgroup_size(256)
fn sigmoid_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let s = slots(wid, nwg, lid);
  if (s.valid) {
    out[s.oi] = x[s.xi] * sigmoid(y[s.yi]);
  }
}

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let s = slots(wid, nwg, lid);
  if (s.valid) {
    out[s.oi] = silu(x[s.xi]) * y[s.yi];
  }
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
  let s = slots(wid, nwg, lid);
  if (s.valid) {
    out[s.oi] = x[s.xi] + y[s.yi];
  }
}
