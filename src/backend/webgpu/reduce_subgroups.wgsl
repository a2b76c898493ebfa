// Row sums of the 64-invocation kernels (norms, pointer head) with subgroups: subgroupAdd within each
// subgroup, one barrier, then the subgroups' totals summed in subgroup order; and quad sums (the
// question rows' gated delta rule) by two xor shuffles. Prepended (under
// `enable subgroups;`) to every kernel file on devices whose subgroups passed subgroup_check.wgsl
// (run on its own pipeline; the layout it finds is taken to hold for every pipeline of the device):
// full subgroups of consecutive invocation indices, starting at multiples of the size, which may be
// any power of two from 4 to 64 (read here, so it may differ between pipelines). A row's sum depends
// only on its values and the pipeline, not on the batch around it. reduce_workgroup.wgsl is the
// fallback.

var<workgroup> subgroup_totals: array<f32, 16>;  // 64 invocations / the smallest subgroup (4)

// The sum of every invocation's s, returned to all of them; called once per invocation, from
// uniform control flow, in a 64-invocation workgroup.
fn workgroup_sum(s: f32, lid: u32) -> f32 {
  let t = subgroupAdd(s);
  let size = subgroupAdd(1u);
  if (lid % size == 0u) {
    subgroup_totals[lid / size] = t;
  }
  workgroupBarrier();
  var total = subgroup_totals[0];
  for (var i = 1u; i < 64u / size; i++) {
    total += subgroup_totals[i];
  }
  return total;
}

// The sums of x over the four invocations 4⌊lid/4⌋ .. +3, returned to all four: (x₀ + x₁) + (x₂ + x₃)
// on every lane (float addition commutes, so the xor partners' sums agree bit for bit), as
// reduce_workgroup.wgsl's version computes it. Called from uniform control flow in a 256-invocation
// workgroup (subgroups of at least 4 consecutive indices: the device's check).
fn quad_sum2(x: vec2<f32>, lid: u32) -> vec2<f32> {
  let pair = x + subgroupShuffleXor(x, 1u);
  return pair + subgroupShuffleXor(pair, 2u);
}
