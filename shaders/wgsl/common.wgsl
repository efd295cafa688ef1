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
    // A contiguous operand (the host merges its dimensions into one) needs no division.
    if (rank == 1u) {
        return params[view_at] + i * params[view_at + 1u];
    }
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

// NaN and infinities by their bits: WGSL lets compilers assume finite floats (Metal compiles with
// fast math), so `x != x`, `max` and comparisons with infinity may not see them.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// The larger / smaller of a and b, NaN if either is (PyTorch's maximum, relu, clamp and max
// reductions; WGSL's max leaves NaN undefined).
fn max_nan(a: f32, b: f32) -> f32 {
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, is_nan(a) || a > b);
}
fn min_nan(a: f32, b: f32) -> f32 {
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, is_nan(a) || a < b);
}

// Binary op `op` (its index in core's BinaryOp::ALL) in f32: binary.wgsl and binary_mixed.wgsl.
fn apply_binary(op: u32, x: f32, y: f32) -> f32 {
    switch op {
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

// x^y with C's rules (what the CPU and CUDA compute): x^±0 and 1^y are 1 even for NaN, else NaN
// in gives NaN out; infinite powers and bases follow IEEE's limits; a negative finite base is
// real only for an integer power. WGSL's pow leaves x < 0 undefined.
fn pow_real(x: f32, y: f32) -> f32 {
    if (y == 0.0 || x == 1.0) {
        return 1.0;
    }
    if (is_nan(x) || is_nan(y)) {
        return f32_nan();
    }
    let ax = abs(x);
    if (!is_finite(y)) {
        if (ax == 1.0) {
            return 1.0;
        }
        return select(0.0, f32_inf(), (ax > 1.0) == (y > 0.0));
    }
    if (x == 0.0) {
        return select(f32_inf(), 0.0, y > 0.0);
    }
    let magnitude = exp2(y * log2(ax));
    if (x > 0.0) {
        return magnitude;
    }
    let integer = fract(y) == 0.0;
    if (!integer && is_finite(x)) {
        return f32_nan();
    }
    return select(magnitude, -magnitude, integer && fract(y * 0.5) != 0.0);
}

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

// Unary op number `op` (its index in core's UnaryOp::ALL) with parameters p0, p1; shaders pass
// a pipeline constant, so the driver keeps only one case.
fn apply_unary(op: u32, x: f32, p0: f32, p1: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return exp(x); }
        case 3u: { return log(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return 1.0 / x; }
        case 6u: { return tanh_stable(x); }
        case 7u: { return 1.0 / (1.0 + exp(-x)); }
        case 8u: { return max_nan(x, 0.0); }
        case 9u: { return x * 0.5 * (1.0 + erf_approx(x * INV_SQRT2)); }
        case 10u: { return 0.5 * (1.0 + erf_approx(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x); }
        case 11u: { return pow_real(x, p0); }
        case 12u: { return x * p0 + p1; }
        case 13u: { return max_nan(x, p0); }
        case 14u: { return min_nan(x, p0); }
        case 15u: { return select(1.0, 0.0, is_finite(x)); }
        default: { return x; }
    }
}

// Philox4x32-10, the counter-based generator of core/src/rng.rs (rand and dropout draw from it,
// and the fused attention weights' dropout).
// The 64-bit product of two u32 as (low, high): WGSL has no 64-bit integers.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let ll = (a & 0xffffu) * (b & 0xffffu);
    let lh = (a & 0xffffu) * (b >> 16u);
    let hl = (a >> 16u) * (b & 0xffffu);
    let hh = (a >> 16u) * (b >> 16u);
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>((mid << 16u) | (ll & 0xffffu), hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}

fn philox(key_in: vec2<u32>, counter: vec2<u32>) -> vec4<u32> {
    var k = key_in;
    var c = vec4<u32>(counter.x, counter.y, 0u, 0u);
    for (var round = 0u; round < 10u; round++) {
        let p0 = mul_wide(0xD2511F53u, c.x);
        let p1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

fn unit_float(word: u32) -> f32 {
    return f32(word >> 8u) * (1.0 / 16777216.0);
}

// The four words of element i's block of the stream whose seed and counter are the four u32
// params from `at` (seed low, seed high, counter low, counter high): block counter + i / 4
// under key seed, the 64-bit sum carried by hand.
fn stream_block(at: u32, i: u32) -> vec4<u32> {
    let block = i / 4u;
    let low = params[at + 2u] + block;
    let carry = select(0u, 1u, low < block);
    return philox(vec2<u32>(params[at], params[at + 1u]), vec2<u32>(low, params[at + 3u] + carry));
}

// Rows (or chunks) taken by groups of `group` invocations, a power of two the host picks from a
// row's length (`gpu_plan::group_len`): WG / group groups a workgroup, so short rows share one
// instead of leaving most of it idle. A group's index across the dispatch, and an invocation's
// lane in its group.
struct Slot {
    index: u32,
    lane: u32,
}

fn slot(wid: vec3<u32>, groups: vec3<u32>, lid: u32, group: u32) -> Slot {
    return Slot((wid.x + wid.y * groups.x) * (WG / group) + lid / group, lid % group);
}

var<workgroup> group_scratch: array<f32, 256>;

// The sum of the values of the invocations in lid's group (or with take_max their maximum, NaN
// first), in a fixed order, returned to each of them. Every invocation of the workgroup calls it.
fn group_combine(lid: u32, lane: u32, group: u32, value: f32, take_max: bool) -> f32 {
    group_scratch[lid] = value;
    workgroupBarrier();
    for (var width = group / 2u; width > 0u; width = width / 2u) {
        if (lane < width) {
            let other = group_scratch[lid + width];
            group_scratch[lid] = select(group_scratch[lid] + other, max_nan(group_scratch[lid], other), take_max);
        }
        workgroupBarrier();
    }
    let result = group_scratch[lid - lane];
    workgroupBarrier();
    return result;
}

// Element i of a bf16 tensor (exact), from the u32 word holding it: element 2w is the low half of
// word w.
fn bf16_at(word: u32, i: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

// f32 to bf16's bits (the high half of the f32), rounded to nearest even; NaN stays NaN.
fn round_to_bf16(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (bits >> 16u) | 0x40u; // a quiet NaN of the same sign
    }
    return (bits + 0x7fffu + ((bits >> 16u) & 1u)) >> 16u;
}
