// bf16 at rest, f32 in flight. WGSL has no bf16, so a bf16 tensor is stored as 16-bit halves of
// u32 words (element 2w in the low half of word w) and every op runs on an f32 copy of it.
// widen:  params [elements]; f32 element i from packed element i (exact).
// narrow: params [elements, words]; word w from f32 elements 2w and 2w+1, rounded to nearest
//         even (NaN stays NaN); the high half of an odd tensor's last word is zero.

@group(0) @binding(1) var<storage, read> packed: array<u32>;
@group(0) @binding(2) var<storage, read_write> wide: array<f32>;
@group(0) @binding(3) var<storage, read> wide_src: array<f32>;
@group(0) @binding(4) var<storage, read_write> packed_dst: array<u32>;

@compute @workgroup_size(256)
fn widen(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let word = packed[i >> 1u];
    wide[i] = bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn round_to_bf16(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (bits >> 16u) | 0x40u; // a quiet NaN of the same sign
    }
    return (bits + 0x7fffu + ((bits >> 16u) & 1u)) >> 16u;
}

@compute @workgroup_size(256)
fn narrow(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    if (w >= params[1]) {
        return;
    }
    let lo = round_to_bf16(wide_src[2u * w]);
    var hi = 0u;
    if (2u * w + 1u < params[0]) {
        hi = round_to_bf16(wide_src[2u * w + 1u]);
    }
    packed_dst[w] = lo | (hi << 16u);
}
