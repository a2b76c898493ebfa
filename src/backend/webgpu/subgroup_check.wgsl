// Subgroup layout check, run once when a device opens with subgroups (device.cpp): reduce_subgroups.wgsl
// puts the total of the subgroup holding invocation lid in slot lid / size of 8 slots (64-invocation
// workgroups), and its group8_sum shuffles within aligned groups of eight (128-invocation workgroups),
// so every subgroup must be full, of 8 to 64 consecutive local invocation indices starting at a multiple
// of the size. WGSL leaves that layout to the implementation, so it is tested, in a workgroup of 256.
// Launch: one workgroup of 256; ok[lid] = 1 where invocation lid sees that layout, else 0.

@group(0) @binding(1) var<storage, read_write> ok: array<u32>;

@compute @workgroup_size(256)
fn check(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32,
         @builtin(subgroup_size) size: u32) {
  let first = subgroupBroadcastFirst(lid);
  let count = subgroupAdd(1u);
  ok[lid] = select(0u, 1u, count == size && size >= 8u && size <= 64u && first % size == 0u && lid == first + lane);
}
