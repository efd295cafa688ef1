// bf16 at rest, f32 in flight. WGSL has no bf16, so a bf16 tensor is stored as 16-bit halves of
// u32 words (element 2w in the low half of word w). The shaders of a training step's main ops
// (matmul, im2col, col2im, unary, binary, bias_act, batch norm) read and write the words
// themselves through the `bf16` element functions; the others run on the f32 copies below.
// widen:  params [elements]; f32 element i from packed element i (exact).
// narrow: params [elements, words]; word w from f32 elements 2w and 2w+1, rounded to nearest
//         even (NaN stays NaN); the high half of an odd tensor's last word is zero.
// copy:   params [n, rank, dims[rank], src view [offset, strides[rank]], dst offset]; copies the
//         n elements of a strided bf16 view into n contiguous ones from dst offset on, a word of
//         the destination per invocation (bits only), keeping the halves outside the copy.

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
    wide[i] = bf16_at(packed[i >> 1u], i);
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

@compute @workgroup_size(256)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let n = params[0];
    let rank = params[1];
    let view = 2u + rank;
    let first = params[view + 1u + rank];
    let word = (first >> 1u) + flat_index(gid, groups);
    if (n == 0u || word > (first + n - 1u) >> 1u) {
        return;
    }
    // A word the copy fills only in part keeps its other half.
    var halves = 0u;
    if (2u * word < first || 2u * word + 1u >= first + n) {
        halves = packed_dst[word];
    }
    for (var h = 0u; h < 2u; h++) {
        let e = 2u * word + h;
        if (e >= first && e < first + n) {
            let s = strided_index(e - first, rank, 2u, view);
            let bits = (packed[s >> 1u] >> (16u * (s & 1u))) & 0xffffu;
            halves = (halves & ~(0xffffu << (16u * h))) | (bits << (16u * h));
        }
    }
    packed_dst[word] = halves;
}
