// Shared by every Lockstep shader: the host prepends the type aliases a shader names (`T`, or `S`
// and `D` for casts), then this file, then the shader.
//
// Binding 0 of every shader holds the dispatch's parameters as u32 words (floats as their bits),
// written once per submission into one arena: no buffer per dispatch, no uniform-layout padding.
@group(0) @binding(0) var<storage, read> params: array<u32>;

// Every 1-D shader runs 256 invocations per workgroup on a 2-D grid of workgroups (a grid
// dimension stops at 65535, so large tensors spill into y).
const WG: u32 = 256u;

fn flat_index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * WG;
}

fn param_f32(at: u32) -> f32 {
    return bitcast<f32>(params[at]);
}

// Where element `i` (row-major over the `rank` sizes at params[dims_at..]) lives in an operand
// whose view is stored at params[view_at..] as [offset, stride_0, .., stride_{rank-1}].
fn strided_index(i: u32, rank: u32, dims_at: u32, view_at: u32) -> u32 {
    var rest = i;
    var index = params[view_at];
    for (var d = i32(rank) - 1; d >= 0; d--) {
        let size = params[dims_at + u32(d)];
        index += (rest % size) * params[view_at + 1u + u32(d)];
        rest = rest / size;
    }
    return index;
}

// (Functions, not consts: naga cannot yet evaluate bitcast in a constant expression.)
fn f32_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}
fn f32_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// x^y with C's rules for a negative base (real only for integer y); WGSL's pow leaves x < 0 undefined.
fn pow_real(x: f32, y: f32) -> f32 {
    if (y == 0.0) {
        return 1.0;
    }
    if (x == 0.0) {
        return select(f32_inf(), 0.0, y > 0.0);
    }
    let magnitude = exp2(y * log2(abs(x)));
    if (x > 0.0) {
        return magnitude;
    }
    if (fract(y) != 0.0) {
        return f32_nan();
    }
    return select(magnitude, -magnitude, fract(y * 0.5) != 0.0);
}
