// unary: out[i] = f(src[view(i)]), computed in f32 for every `T`. OP (the op's index in core's
// UnaryOp::ALL) picks the function when the pipeline is built (one compiled variant per op); p0/p1 are its parameters.
// params: [n, rank, dims[rank], src view [offset, strides[rank]], p0, p1]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let params_at = 3u + 2u * rank;
    let x = f32(src[strided_index(i, rank, 2u, 2u + rank)]);
    out[i] = T(apply_unary(OP, x, param_f32(params_at), param_f32(params_at + 1u)));
}
