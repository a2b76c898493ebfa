// Gated DeltaNet gates: beta = σ(b); g = −exp(A_log) · softplus(a + dt_bias), with the overflow-free
// softplus(u) = max(u, 0) + log1p(e^−|u|).
//
// Layout: b, a, beta, g [n,Hv] (row strides free: b and a are columns of a projection); a_log,
// dt_bias [Hv] contiguous. Launch: one invocation per (token, head), 256 per workgroup (folded).

struct Params {
  n: u32, hv: u32, b_off: u32, b_st: u32,
  a_off: u32, a_st: u32, al_off: u32, dt_off: u32,
  beta_off: u32, beta_st: u32, g_off: u32, g_st: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> a_log: array<f32>;
@group(0) @binding(4) var<storage, read_write> dt_bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> g: array<f32>;

@compute @workgroup_size(256)
fn gdn_gates(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
  let i = linear_group(wid, nwg) * 256u + lid;
  if (i >= p.n * p.hv) {
    return;
  }
  let t = i / p.hv;
  let h = i % p.hv;
  beta[p.beta_off + t * p.beta_st + h] = sigmoid(b[p.b_off + t * p.b_st + h]);
  let u = a[p.a_off + t * p.a_st + h] + dt_bias[p.dt_off + h];
  let softplus = max(u, 0.0) + log1p_accurate(exp(-abs(u)));
  g[p.g_off + t * p.g_st + h] = -exp(a_log[p.al_off + h]) * softplus;
}
