// Row sums of the 64-invocation kernels (norms, pointer head) without subgroups: a tree reduction in
// workgroup memory (six barriers); and the sums over groups of 8 lanes (the question rows' gated delta
// rule, the norms' short rows) through workgroup memory (two barriers). Prepended to every kernel file
// on devices where the subgroup variant (reduce_subgroups.wgsl) is not used; the two define the same
// workgroup_sum, group8_sum and group8_sum_scalar.

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

var<workgroup> group_parts: array<Pair4, 128>;

// Two vec4 sums over the 8 invocations 8⌊lid/8⌋ .. +7, returned to all eight, as ((x₀ + x₄) + (x₂ + x₆))
// + ((x₁ + x₅) + (x₃ + x₇)) (reduce_subgroups.wgsl's bits); called from uniform control flow in a
// workgroup of at most 128 invocations.
fn group8_sum(x: Pair4, lid: u32) -> Pair4 {
  group_parts[lid] = x;
  workgroupBarrier();
  let g = lid & ~7u;
  let a = ((group_parts[g].a + group_parts[g + 4u].a) + (group_parts[g + 2u].a + group_parts[g + 6u].a)) +
          ((group_parts[g + 1u].a + group_parts[g + 5u].a) + (group_parts[g + 3u].a + group_parts[g + 7u].a));
  let b = ((group_parts[g].b + group_parts[g + 4u].b) + (group_parts[g + 2u].b + group_parts[g + 6u].b)) +
          ((group_parts[g + 1u].b + group_parts[g + 5u].b) + (group_parts[g + 3u].b + group_parts[g + 7u].b));
  workgroupBarrier();
  return Pair4(a, b);
}

var<workgroup> lane_parts: array<f32, 64>;

// A sum over the 8 invocations 8⌊lid/8⌋ .. +7, returned to all eight, as group8_sum's order
// (reduce_subgroups.wgsl's bits); called from uniform control flow in a workgroup of at most 64.
fn group8_sum_scalar(x: f32, lid: u32) -> f32 {
  lane_parts[lid] = x;
  workgroupBarrier();
  let g = lid & ~7u;
  let a = ((lane_parts[g] + lane_parts[g + 4u]) + (lane_parts[g + 2u] + lane_parts[g + 6u])) +
          ((lane_parts[g + 1u] + lane_parts[g + 5u]) + (lane_parts[g + 3u] + lane_parts[g + 7u]));
  workgroupBarrier();
  return a;
}
