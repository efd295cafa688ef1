// binary: out[i] = f(lhs[lhs_view(i)], rhs[rhs_view(i)]) over operands already broadcast to one
// shape, computed in f32 for every `T`. OP, the op's index in core's BinaryOp::ALL,
// is a pipeline constant (one compiled variant per op).
// params: [n, rank, dims[rank], lhs view [offset, strides[rank]], rhs view [offset, strides[rank]]]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

fn apply(x: f32, y: f32) -> f32 {
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return pow_real(x, y); }
        case 5u: { return max_nan(x, y); }
        case 6u: { return min_nan(x, y); }
        // relu_grad: the gradient x where the input y > 0.
        case 7u: { return select(0.0, x, y > 0.0); }
        default: { return x; }
    }
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let lhs_at = 2u + rank;
    let rhs_at = lhs_at + 1u + rank;
    let x = f32(lhs[strided_index(i, rank, 2u, lhs_at)]);
    let y = f32(rhs[strided_index(i, rank, 2u, rhs_at)]);
    out[i] = T(apply(x, y));
}
