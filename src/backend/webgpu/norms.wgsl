// Row normalisations over the innermost dimension d (rows = all outer indices):
//   rms_norm:       out = x / sqrt(mean(x²) + eps) · (1 + w)        (zero-centred gain)
//   add_rms_norm:   x ← x + y (in place), then out = rms_norm(x)     (y bound as z; the residual add)
//   l2_norm:        out = x / sqrt(Σx² + eps) · scale
//   rms_norm_gated: out = w · x / sqrt(mean(x²) + eps) · SiLU(z)    (x is o; plain gain)
//
// Layout: x, z, out [..., d] of rank 1..4, outer dims folded to (s0, s1, s2) with per-tensor strides
// (views of projections are fine); w [d] contiguous. Unused operands are bound to dummies.
// Launch: one workgroup of 64 invocations per row (folded); each invocation sums squares over
// j ≡ lid (mod 64), then workgroup_sum (reduce_subgroups.wgsl: subgroupAdd and one barrier where the
// device's subgroups allow, else reduce_workgroup.wgsl's tree in workgroup memory). FP32 throughout.
// (64, not 256: the model's rows are 32..2560 long, and short rows would leave most of a wider
// workgroup idle.) An invocation walks its elements in runs of RUN: a run's loads are all issued
// before the run's values are used, so a 1,024-float row costs one memory latency per invocation, not
// 16 (a question-row pass has only ~200 rows, too few workgroups to hide them); loads past the row's
// end read its last element, unused, so that a run's loads need no branch; the sums still add the
// elements in j order, so the results are those of a plain loop.
// l2_norm over short rows (d ≤ SHORT_MAX: the GDN q and k heads' 128), `l2_norm_short`: eight rows a
// workgroup, eight lanes a row (lanes 8g..8g+7 take row 8·workgroup + g), a lane's elements
// j ≡ lane (mod 8) loaded in one or two runs of RUN into registers, kept there for the output; the
// row's sum is the lane sums (each in j order) added by group8_sum_scalar. A row of 128 is then 8
// invocations issuing 16 loads each, where the one-row workgroup had 64 issuing 2 (and 14 clamped
// repeats) and a barrier. Lanes of rows past n_rows work on the last row (the sum needs all eight)
// and store nothing; in-place calls are safe, as a lane writes only the elements it read. The same
// layout for rms_norm and rms_norm_gated measured slower on the H100 than their one-row kernels (their
// w and z loads; docs/backends.md, "Twenty-first session"), so they keep those.
// add_rms_norm: each invocation writes x + y for its j and reads back only its own elements, so the
// second pass needs no barrier beyond the reduction's; out and y never alias x (the host checks).

struct Params {
  d: u32, n_rows: u32, s1: u32, s2: u32,
  x_off: u32, z_off: u32, w_off: u32, o_off: u32,
  x_st: vec4<u32>,
  z_st: vec4<u32>,
  o_st: vec4<u32>,
  eps: f32, scale: f32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> z: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const RUN: u32 = 16u;  // elements an invocation loads before using them
const SHORT_MAX: u32 = 16u * RUN;  // the longest short row: two runs of eight lanes

// Σ x² over the row starting at xb, shared by all invocations of the workgroup.
fn row_sum_squares(xb: u32, lid: u32) -> f32 {
  var s = 0.0;
  for (var j0 = lid; j0 < p.d; j0 += 64u * RUN) {
    var v: array<f32, RUN>;
    for (var u = 0u; u < RUN; u++) {
      v[u] = x[xb + min(j0 + 64u * u, p.d - 1u)];
    }
    for (var u = 0u; u < RUN; u++) {
      if (j0 + 64u * u < p.d) {
        s += v[u] * v[u];
      }
    }
  }
  return workgroup_sum(s, lid);
}

@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
  let r = linear_group(wid, nwg);
  if (r >= p.n_rows) {
    return;
  }
  let xb = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz);
  let ob = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz);
  let inv = 1.0 / sqrt(row_sum_squares(xb, lid) / f32(p.d) + p.eps);
  for (var j = lid; j < p.d; j += 64u) {
    out[ob + j] = x[xb + j] * inv * (1.0 + w[p.w_off + j]);
  }
}

@compute @workgroup_size(64)
fn add_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let r = linear_group(wid, nwg);
  if (r >= p.n_rows) {
    return;
  }
  let xb = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz);
  let yb = p.z_off + row_offset3(r, p.s1, p.s2, p.z_st.xyz);
  let ob = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz);
  var s = 0.0;
  for (var j0 = lid; j0 < p.d; j0 += 64u * RUN) {
    var v: array<f32, RUN>;
    for (var u = 0u; u < RUN; u++) {
      let j = min(j0 + 64u * u, p.d - 1u);
      v[u] = x[xb + j] + z[yb + j];
    }
    for (var u = 0u; u < RUN; u++) {
      let j = j0 + 64u * u;
      if (j < p.d) {
        x[xb + j] = v[u];
        s += v[u] * v[u];
      }
    }
  }
  let inv = 1.0 / sqrt(workgroup_sum(s, lid) / f32(p.d) + p.eps);
  for (var j0 = lid; j0 < p.d; j0 += 64u * RUN) {
    var v: array<f32, RUN>;
    var g: array<f32, RUN>;
    for (var u = 0u; u < RUN; u++) {
      let j = min(j0 + 64u * u, p.d - 1u);
      v[u] = x[xb + j];
      g[u] = w[p.w_off + j];
    }
    for (var u = 0u; u < RUN; u++) {
      let j = j0 + 64u * u;
      if (j < p.d) {
        out[ob + j] = v[u] * inv * (1.0 + g[u]);
      }
    }
  }
}

@compute @workgroup_size(64)
fn l2_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
  let r = linear_group(wid, nwg);
  if (r >= p.n_rows) {
    return;
  }
  let xb = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz);
  let ob = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz);
  let f = p.scale / sqrt(row_sum_squares(xb, lid) + p.eps);
  for (var j = lid; j < p.d; j += 64u) {
    out[ob + j] = x[xb + j] * f;
  }
}

@compute @workgroup_size(64)
fn rms_norm_gated(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let r = linear_group(wid, nwg);
  if (r >= p.n_rows) {
    return;
  }
  let xb = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz);
  let zb = p.z_off + row_offset3(r, p.s1, p.s2, p.z_st.xyz);
  let ob = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz);
  let inv = 1.0 / sqrt(row_sum_squares(xb, lid) / f32(p.d) + p.eps);
  for (var j = lid; j < p.d; j += 64u) {
    out[ob + j] = w[p.w_off + j] * (x[xb + j] * inv) * silu(z[zb + j]);
  }
}

@compute @workgroup_size(64)
fn l2_norm_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let r_lane = linear_group(wid, nwg) * 8u + lid / 8u;
  let r = min(r_lane, p.n_rows - 1u);  // past n_rows: the last row, for the sum's sake
  let xb = p.x_off + row_offset3(r, p.s1, p.s2, p.x_st.xyz);
  let lane = lid % 8u;
  // v[u] = x[xb + lane + 8u] (past the row's end: its last element, unused); the second run only for
  // rows over 8·RUN.
  var v: array<f32, SHORT_MAX / 8u>;
  for (var u = 0u; u < RUN; u++) {
    v[u] = x[xb + min(lane + 8u * u, p.d - 1u)];
  }
  if (p.d > 8u * RUN) {
    for (var u = RUN; u < 2u * RUN; u++) {
      v[u] = x[xb + min(lane + 8u * u, p.d - 1u)];
    }
  }
  var s = 0.0;
  for (var u = 0u; u < SHORT_MAX / 8u; u++) {
    if (lane + 8u * u < p.d) {
      s += v[u] * v[u];
    }
  }
  let f = p.scale / sqrt(group8_sum_scalar(s, lid) + p.eps);
  if (r_lane >= p.n_rows) {
    return;
  }
  let ob = p.o_off + row_offset3(r, p.s1, p.s2, p.o_st.xyz);
  for (var u = 0u; u < SHORT_MAX / 8u; u++) {
    let j = lane + 8u * u;
    if (j < p.d) {
      out[ob + j] = v[u] * f;
    }
  }
}
