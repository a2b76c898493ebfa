// Row sums of the 64-invocation kernels (norms, pointer head) with subgroups: subgroupAdd within each
// subgroup, one barrier, then the subgroups' totals summed in subgroup order; and the sums over groups
// of 8 lanes (the question rows' gated delta rule, the norms' short rows) by three xor shuffles. Prepended (under
// `enable subgroups;`) to every kernel file on devices whose subgroups passed subgroup_check.wgsl
// (run on its own pipeline; the layout it finds is taken to hold for every pipeline of the device):
// full subgroups of consecutive invocation indices, starting at multiples of the size, which may be
// any power of two from 8 to 64 (read here, so it may differ between pipelines). A row's sum depends
// only on its values and the pipeline, not on the batch around it. reduce_workgroup.wgsl is the
// fallback.

var<workgroup> subgroup_totals: array<f32, 8>;  // 64 invocations / the smallest subgroup (8)

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

// Two vec4 sums over a lane group, the 8 invocations 8⌊lid/8⌋ .. +7, returned to all eight: three xor
// shuffles (partners 4, 2, 1), each adding the partner's running sum to the lane's own. Every lane
// ends with ((x₀ + x₄) + (x₂ + x₆)) + ((x₁ + x₅) + (x₃ + x₇)) (float addition commutes, so partners
// agree bit for bit), as reduce_workgroup.wgsl's version computes it. Called from uniform control flow
// (subgroups of at least 8 consecutive indices: the device's check).
fn group8_sum(x: Pair4, lid: u32) -> Pair4 {
  var a = x.a + subgroupShuffleXor(x.a, 4u);
  var b = x.b + subgroupShuffleXor(x.b, 4u);
  a += subgroupShuffleXor(a, 2u);
  b += subgroupShuffleXor(b, 2u);
  a += subgroupShuffleXor(a, 1u);
  b += subgroupShuffleXor(b, 1u);
  return Pair4(a, b);
}

// A sum over the lane group 8⌊lid/8⌋ .. +7, returned to all eight, in group8_sum's order (the norms'
// short rows); called from uniform control flow.
fn group8_sum_scalar(x: f32, lid: u32) -> f32 {
  var a = x + subgroupShuffleXor(x, 4u);
  a += subgroupShuffleXor(a, 2u);
  a += subgroupShuffleXor(a, 1u);
  return a;
}
