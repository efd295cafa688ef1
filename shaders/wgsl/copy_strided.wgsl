// copy_strided: dst[dst_view(i)] = src[src_view(i)] for every element i of one shape. `T` is a
// storage word of the element's size (u32 for 4-byte, vec2<u32> for 8-byte, f16 for 2-byte
// elements): a copy moves bits and never converts.
// params: [n, rank, dims[rank], src view [offset, strides[rank]], dst view [offset, strides[rank]]]

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> dst: array<T>;

@compute @workgroup_size(256)
fn copy_strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let src_at = 2u + rank;
    let dst_at = src_at + 1u + rank;
    dst[strided_index(i, rank, 2u, dst_at)] = src[strided_index(i, rank, 2u, src_at)];
}
