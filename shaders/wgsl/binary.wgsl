// binary: out[i] = f(lhs[lhs_view(i)], rhs[rhs_view(i)]) over operands already broadcast to one
// shape, computed in f32 for every `T` (bf16 two elements a word). OP, the op's index in core's
// BinaryOp::ALL, is a pipeline constant (one compiled variant per op).
// params: [n, rank, dims[rank], lhs view [offset, strides[rank]], rhs view [offset, strides[rank]]]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

fn binary_at(i: u32) -> f32 {
    let rank = params[1];
    let x = strided_index(i, rank, 2u, 2u + rank);
    let y = strided_index(i, rank, 2u, 3u + 2u * rank);
    return apply_binary(OP, T_load(lhs[T_word(x)], x), T_load(rhs[T_word(y)], y));
}

// A storage word of the output per invocation.
@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = binary_at(first + 1u);
    }
    out[w] = T_pack(binary_at(first), second);
}
