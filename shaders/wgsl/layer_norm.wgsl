// layer_norm_last over the last axis of a contiguous [rows, cols], and its gradient: one
// workgroup per row, the row's sums combined in workgroup memory. f32 math; the statistics are
// recomputed by the backward pass instead of stored.
// params: [rows, cols], eps (f32 bits)

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> grad: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

var<workgroup> scratch: array<f32, 256>;

// The sum of every invocation's value, returned to all.
fn total(lid: u32, value: f32) -> f32 {
    scratch[lid] = value;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width = width / 2u) {
        if (lid < width) {
            scratch[lid] = scratch[lid] + scratch[lid + width];
        }
        workgroupBarrier();
    }
    let result = scratch[0];
    workgroupBarrier();
    return result;
}

// The row's mean and 1 / sqrt(var + eps) (biased variance, two passes).
fn statistics(lid: u32, base: u32, cols: u32, eps: f32) -> vec2<f32> {
    var local = 0.0;
    for (var c = lid; c < cols; c += WG) {
        local += f32(src[base + c]);
    }
    let mean = total(lid, local) / f32(cols);
    var squares = 0.0;
    for (var c = lid; c < cols; c += WG) {
        let d = f32(src[base + c]) - mean;
        squares += d * d;
    }
    return vec2<f32>(mean, inverseSqrt(total(lid, squares) / f32(cols) + eps));
}

@compute @workgroup_size(256)
fn layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let row = wid.x + wid.y * groups.x;
    let base = min(row, rows - 1u) * cols;
    let stats = statistics(lid, base, cols, bitcast<f32>(params[2]));
    if (row >= rows) {
        return;
    }
    for (var c = lid; c < cols; c += WG) {
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
    let row = wid.x + wid.y * groups.x;
    let base = min(row, rows - 1u) * cols;
    let stats = statistics(lid, base, cols, bitcast<f32>(params[2]));
    var local_g = 0.0;
    var local_gn = 0.0;
    for (var c = lid; c < cols; c += WG) {
        let g = f32(grad[base + c]);
        local_g += g;
        local_gn += g * (f32(src[base + c]) - stats.x) * stats.y;
    }
    let g_mean = total(lid, local_g) / f32(cols);
    let gn_mean = total(lid, local_gn) / f32(cols);
    if (row >= rows) {
        return;
    }
    for (var c = lid; c < cols; c += WG) {
        let normed = (f32(src[base + c]) - stats.x) * stats.y;
        out[base + c] = T(stats.y * (f32(grad[base + c]) - g_mean - normed * gn_mean));
    }
}
