// layer_norm_last over the last axis of a contiguous [rows, cols], and its gradient: a group of
// invocations per row (see `Slot`), the row's sums combined in workgroup memory. f32 math; the
// statistics are recomputed by the backward pass instead of stored.
// params: [rows, cols, eps (f32 bits), group]

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> grad: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

// The sum of the values of lid's group, returned to each of its invocations.
fn total(lid: u32, lane: u32, value: f32) -> f32 {
    return group_combine(lid, lane, params[3], value, false);
}

// The row's mean and 1 / sqrt(var + eps) (biased variance, two passes).
fn statistics(lid: u32, lane: u32, base: u32, cols: u32, eps: f32) -> vec2<f32> {
    let group = params[3];
    var local = 0.0;
    for (var c = lane; c < cols; c += group) {
        local += f32(src[base + c]);
    }
    let mean = total(lid, lane, local) / f32(cols);
    var squares = 0.0;
    for (var c = lane; c < cols; c += group) {
        let d = f32(src[base + c]) - mean;
        squares += d * d;
    }
    return vec2<f32>(mean, inverseSqrt(total(lid, lane, squares) / f32(cols) + eps));
}

@compute @workgroup_size(256)
fn layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let group = params[3];
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * cols;
    let stats = statistics(lid, s.lane, base, cols, bitcast<f32>(params[2]));
    if (row >= rows) {
        return;
    }
    for (var c = s.lane; c < cols; c += group) {
        out[base + c] = T((f32(src[base + c]) - stats.x) * stats.y);
    }
}

@compute @workgroup_size(256)
fn layer_norm_backward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let group = params[3];
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * cols;
    let stats = statistics(lid, s.lane, base, cols, bitcast<f32>(params[2]));
    var local_g = 0.0;
    var local_gn = 0.0;
    for (var c = s.lane; c < cols; c += group) {
        let g = f32(grad[base + c]);
        local_g += g;
        local_gn += g * (f32(src[base + c]) - stats.x) * stats.y;
    }
    let g_mean = total(lid, s.lane, local_g) / f32(cols);
    let gn_mean = total(lid, s.lane, local_gn) / f32(cols);
    if (row >= rows) {
        return;
    }
    for (var c = s.lane; c < cols; c += group) {
        let normed = (f32(src[base + c]) - stats.x) * stats.y;
        out[base + c] = T(stats.y * (f32(grad[base + c]) - g_mean - normed * gn_mean));
    }
}
