// where_cond: out[i] = cond[i] != 0 ? on_true[i] : on_false[i], operands broadcast to one shape.
// `T` is the storage word of the values (a select moves bits, so any dtype of that size works).
// params: [n, rank, dims[rank], cond view, true view, false view (each [offset, strides[rank]])]

@group(0) @binding(1) var<storage, read> cond: array<u32>;
@group(0) @binding(2) var<storage, read> on_true: array<T>;
@group(0) @binding(3) var<storage, read> on_false: array<T>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn where_cond(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let cond_at = 2u + rank;
    let true_at = cond_at + 1u + rank;
    let false_at = true_at + 1u + rank;
    if (cond[strided_index(i, rank, 2u, cond_at)] != 0u) {
        out[i] = on_true[strided_index(i, rank, 2u, true_at)];
    } else {
        out[i] = on_false[strided_index(i, rank, 2u, false_at)];
    }
}
