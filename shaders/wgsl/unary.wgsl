// unary: out[i] = f(src[view(i)]), computed in f32 for every `T` (bf16 two elements a word). OP (the op's index in core's
// UnaryOp::ALL) picks the function when the pipeline is built (one compiled variant per op); p0/p1 are its parameters.
// params: [n, rank, dims[rank], src view [offset, strides[rank]], p0, p1]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

fn unary_at(i: u32) -> f32 {
    let rank = params[1];
    let params_at = 3u + 2u * rank;
    let s = strided_index(i, rank, 2u, 2u + rank);
    return apply_unary(OP, T_load(src[T_word(s)], s), param_f32(params_at), param_f32(params_at + 1u));
}

// A storage word of the output per invocation.
@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = unary_at(first + 1u);
    }
    out[w] = T_pack(unary_at(first), second);
}
