// zeros / full: writes a two-word pattern over a buffer's words. The host packs the value: an f32
// or u32 twice, two f16 halves in each word, or the low and high words of an i64.
// params: [words, pattern_0, pattern_1]

@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    dst[i] = params[1u + (i & 1u)];
}
