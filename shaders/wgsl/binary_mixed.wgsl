// binary_mixed: out[i] = f(wide[wide_view(i)], narrow[narrow_view(i)]) (the narrow operand first
// when NARROW_FIRST) for an f32 operand and a 16-bit one `N`, read as it is (bf16 two elements a
// word) and widened exactly: the bits of a cast, then binary in f32 (Backend::binary_mixed; the
// f32 residual stream plus a bf16 branch). OP, the op's index in core's BinaryOp::ALL, and
// NARROW_FIRST are pipeline constants.
// params: [n, rank, dims[rank], wide view [offset, strides[rank]], narrow view [offset, strides[rank]]]

override OP: u32 = 0u;
override NARROW_FIRST: bool = false;

@group(0) @binding(1) var<storage, read> wide: array<f32>;
@group(0) @binding(2) var<storage, read> narrow: array<N>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn binary_mixed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let w = wide[strided_index(i, rank, 2u, 2u + rank)];
    let at = strided_index(i, rank, 2u, 3u + 2u * rank);
    let n = N_load(narrow[N_word(at)], at);
    out[i] = select(apply_binary(OP, w, n), apply_binary(OP, n, w), NARROW_FIRST);
}
