// coop_scales: for a product on the cooperative-matrix tier (matmul_coop.wgsl), which rounds its
// operands to f16, a power-of-two scale for each row of lhs and each column of rhs that brings the
// line's largest magnitude into [2^15, 2^16), and the scale's inverse. Scaled, a bf16 element is
// exact in f16 down to 2^-33 of its line's largest magnitude (bf16's 8 significant bits fit f16's
// 11), and smaller ones round to f16's subnormal steps, at most 2^-39 of it; unscaled, f16's range
// (6e-8 to 65504) would lose bf16's small gradients and overflow its large values. f16 elements
// only scale up, exactly. Powers of two scale without rounding, so the tier's product stays exact
// products summed in f32, like the SIMT kernel's.
//
// A group of invocations per line (see `Slot`): lines 0 .. batch*m are lhs's rows, then
// batch*n rhs's columns; scales[line] = (scale, 1 / scale).
// params: matmul.wgsl's 12 words (m, n, k, lhs offset and batch/m/k strides, rhs offset and
// batch/k/n strides, batch), then the group length.

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> scales: array<vec2<f32>>;

fn magnitude(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu);
}

// 2^shift as an f32, for shift in [-126, 127].
fn power_of_two(shift: i32) -> f32 {
    return bitcast<f32>(u32(shift + 127) << 23u);
}

// The scale for a line whose largest magnitude is `largest` (NaN if the line holds one): 1 for an
// all-zero line or one holding inf or NaN (they stay what they are); clamped where the exact
// scale would leave f32's normal range (the tiniest bf16 lines still land in f16's normal range).
fn scale_of(largest: f32) -> vec2<f32> {
    if (largest == 0.0 || !is_finite(largest)) {
        return vec2<f32>(1.0, 1.0);
    }
    // floor(log2(largest)) from the exponent bits (-127 for subnormals: clamped below anyway).
    let exponent = i32((bitcast<u32>(largest) >> 23u) & 0xffu) - 127;
    let shift = clamp(15 - exponent, -126, 126);
    return vec2<f32>(power_of_two(shift), power_of_two(-shift));
}

@compute @workgroup_size(WG)
fn coop_scales(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let batch = params[11];
    let group = params[12];
    let s = slot(wid, groups, lid, group);
    let rows = batch * m;
    let lines = rows + batch * n;
    // Groups past the last line repeat it and write nothing: every invocation reaches the
    // barriers of group_combine.
    let line = min(s.index, lines - 1u);
    var largest = 0.0;
    if (line < rows) {
        let base = params[3] + line / m * params[4] + line % m * params[5];
        for (var kk = s.lane; kk < k; kk += group) {
            let i = base + kk * params[6];
            largest = max_nan(largest, magnitude(T_load(lhs[T_word(i)], i)));
        }
    } else {
        let column = line - rows;
        let base = params[7] + column / n * params[8] + column % n * params[10];
        for (var kk = s.lane; kk < k; kk += group) {
            let i = base + kk * params[9];
            largest = max_nan(largest, magnitude(T_load(rhs[T_word(i)], i)));
        }
    }
    let top = group_combine(lid, s.lane, group, largest, true);
    if (s.index < lines && s.lane == 0u) {
        scales[s.index] = scale_of(top);
    }
}
