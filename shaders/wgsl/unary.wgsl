// unary: out[i] = f(src[view(i)]), computed in f32 for every `T`. OP (the op's index in core's
// UnaryOp::ALL) picks the function when the pipeline is built (one compiled variant per op); p0/p1 are its parameters.
// params: [n, rank, dims[rank], src view [offset, strides[rank]], p0, p1]

override OP: u32 = 0u;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

const INV_SQRT2: f32 = 0.70710678118654752;
const INV_SQRT_2PI: f32 = 0.39894228040143268;

// erf to within 2e-7 absolute (Abramowitz & Stegun 7.1.26 is 1.5e-7); WGSL has no erf.
fn erf_approx(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.5) {
        // Maclaurin series: accurate near 0, where 7.1.26's absolute error would dominate.
        let x2 = x * x;
        return x * (1.1283791671 + x2 * (-0.3761263890 + x2 * (0.1128379167 + x2 * (-0.0268661706 + x2 * 0.0052239776))));
    }
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-a * a));
}

// tanh without overflow for large |x| and without cancellation near 0.
fn tanh_stable(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.125) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333333 + x2 * (0.13333333 + x2 * -0.05396825)));
    }
    let e = exp(-2.0 * a);
    return sign(x) * (1.0 - e) / (1.0 + e);
}

fn apply(x: f32, p0: f32, p1: f32) -> f32 {
    switch OP {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return exp(x); }
        case 3u: { return log(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return 1.0 / x; }
        case 6u: { return tanh_stable(x); }
        case 7u: { return 1.0 / (1.0 + exp(-x)); }
        case 8u: { return max(x, 0.0); }
        case 9u: { return x * 0.5 * (1.0 + erf_approx(x * INV_SQRT2)); }
        case 10u: { return 0.5 * (1.0 + erf_approx(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x); }
        case 11u: { return pow_real(x, p0); }
        case 12u: { return x * p0 + p1; }
        case 13u: { return max(x, p0); }
        case 14u: { return min(x, p0); }
        default: { return x; }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let params_at = 3u + 2u * rank;
    let x = f32(src[strided_index(i, rank, 2u, 2u + rank)]);
    out[i] = T(apply(x, param_f32(params_at), param_f32(params_at + 1u)));
}
