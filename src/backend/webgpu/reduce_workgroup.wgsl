// Row sums of the 64-invocation kernels (norms, pointer head) without subgroups: a tree reduction in
// workgroup memory (six barriers); and quad sums through workgroup memory (two barriers). Prepended to
// every kernel file on devices where the subgroup variant (reduce_subgroups.wgsl) is not used; the two
// define the same workgroup_sum and quad_sum2.

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

var<workgroup> quad_parts: array<vec2<f32>, 256>;

// The sums of x over the four invocations 4⌊lid/4⌋ .. +3, returned to all four, as (x₀ + x₁) + (x₂ + x₃)
// (reduce_subgroups.wgsl's bits); called from uniform control flow in a 256-invocation workgroup.
fn quad_sum2(x: vec2<f32>, lid: u32) -> vec2<f32> {
  quad_parts[lid] = x;
  workgroupBarrier();
  let b = lid & ~3u;
  let sum = (quad_parts[b] + quad_parts[b + 1u]) + (quad_parts[b + 2u] + quad_parts[b + 3u]);
  workgroupBarrier();
  return sum;
}
