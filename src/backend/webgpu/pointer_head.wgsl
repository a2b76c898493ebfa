// Pointer-head logits: out[j] = (kappa[j] · u[question[j]]) · scale.
//
// Layout: u [Q,P], kappa [M,P] (row strides free), question [M] I32, out [M] F32 contiguous.
// Launch: one workgroup of 64 invocations per option (folded): strided partial dot products, then
// workgroup_sum (subgroups where the device allows, else a tree in workgroup memory). A question
// index outside [0, Q) gives 0 (the engine builds them; the op never reads outside u).

struct Params {
  m: u32, p_dim: u32, q_rows: u32, u_off: u32,
  u_st: u32, k_off: u32, k_st: u32, qi_off: u32,
  o_off: u32, scale: f32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> u: array<f32>;
@group(0) @binding(2) var<storage, read_write> kappa: array<f32>;
@group(0) @binding(3) var<storage, read_write> question: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn pointer_logits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let j = linear_group(wid, nwg);
  if (j >= p.m) {
    return;
  }
  let qi = question[p.qi_off + j];
  let in_range = qi >= 0 && u32(qi) < p.q_rows;
  var s = 0.0;
  if (in_range) {
    for (var d = lid; d < p.p_dim; d += 64u) {
      s = fma(kappa[p.k_off + j * p.k_st + d], u[p.u_off + u32(qi) * p.u_st + d], s);
    }
  }
  let total = workgroup_sum(s, lid);
  if (lid == 0u) {
    out[p.o_off + j] = total * p.scale;
  }
}
