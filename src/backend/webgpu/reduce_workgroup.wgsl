// Row sums of the 64-invocation kernels (norms, pointer head) without subgroups: a tree reduction in
// workgroup memory (six barriers). Prepended to every kernel file on devices where the subgroup
// variant (reduce_subgroups.wgsl) is not used; the two define the same workgroup_sum.

var<workgroup> partials: array<f32, 64>;

// The sum of every invocation's s, returned to all of them; called once per invocation, from
// uniform control flow, in a 64-invocation workgroup.
fn workgroup_sum(s: f32, lid: u32) -> f32 {
  partials[lid] = s;
  workgroupBarrier();
  for (var half = 32u; half > 0u; half >>= 1u) {
    if (lid < half) {
      partials[lid] += partials[lid + half];
    }
    workgroupBarrier();
  }
  return partials[0];
}
