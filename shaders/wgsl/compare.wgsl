// compare: out[i] = 1 where lhs[i] OP rhs[i] holds, else 0 (u32), over operands broadcast to
// one shape; `T` may be a float or u32. `compare_i64` compares i64 operands, stored as
// (low, high) u32 pairs. OP is the op's index in core's `CmpOp::ALL`.
// params: [n, rank, dims[rank], lhs view [offset, strides[rank]], rhs view [offset, strides[rank]]]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<storage, read> lhs_i64: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read> rhs_i64: array<vec2<u32>>;

fn holds(x: T, y: T) -> bool {
    // NaN tested by its bits (compilers may assume floats are never NaN); a u32 never is.
    if (is_nan(f32(x)) || is_nan(f32(y))) {
        return outcome(false, false, false);
    }
    return outcome(x == y, (x < y), (x > y));
}

// From the three relations (all false for NaN, so every comparison but != fails on NaN).
fn outcome(equal: bool, less: bool, greater: bool) -> bool {
    switch OP {
        case 0u: { return equal; }
        case 1u: { return !equal; }
        case 2u: { return less; }
        case 3u: { return less || equal; }
        case 4u: { return greater; }
        case 5u: { return greater || equal; }
        default: { return false; }
    }
}

@compute @workgroup_size(256)
fn compare(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let lhs_at = 2u + rank;
    let rhs_at = lhs_at + 1u + rank;
    out[i] = select(0u, 1u, holds(lhs[strided_index(i, rank, 2u, lhs_at)], rhs[strided_index(i, rank, 2u, rhs_at)]));
}

@compute @workgroup_size(256)
fn compare_i64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let lhs_at = 2u + rank;
    let rhs_at = lhs_at + 1u + rank;
    let x = lhs_i64[strided_index(i, rank, 2u, lhs_at)];
    let y = rhs_i64[strided_index(i, rank, 2u, rhs_at)];
    // Signed on the high words, unsigned on the low ones.
    let less = bitcast<i32>(x.y) < bitcast<i32>(y.y) || (x.y == y.y && x.x < y.x);
    out[i] = select(0u, 1u, outcome(all(x == y), less, !less && any(x != y)));
}
