// softmax_last / log_softmax_last over the last axis of a contiguous [rows, cols]: one workgroup
// per row, the row's maximum and sum of exponentials combined in workgroup memory; and the
// softmax's gradient from its output (src) and the output gradient. f32 math.
// params: [rows, cols]

override LOG: bool = false;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;
@group(0) @binding(3) var<storage, read> grad: array<T>;

var<workgroup> scratch: array<f32, 256>;

// Combines every invocation's value into scratch[0]: the maximum, or the sum.
fn combine(lid: u32, value: f32, take_max: bool) -> f32 {
    scratch[lid] = value;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width = width / 2u) {
        if (lid < width) {
            let other = scratch[lid + width];
            scratch[lid] = select(scratch[lid] + other, max_nan(scratch[lid], other), take_max);
        }
        workgroupBarrier();
    }
    let result = scratch[0];
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(256)
fn softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let row = wid.x + wid.y * groups.x;
    let base = min(row, rows - 1u) * cols;
    var local_max = -f32_inf();
    for (var c = lid; c < cols; c += WG) {
        local_max = max_nan(local_max, f32(src[base + c]));
    }
    let row_max = combine(lid, local_max, true);
    var local_sum = 0.0;
    for (var c = lid; c < cols; c += WG) {
        local_sum += exp(f32(src[base + c]) - row_max);
    }
    let sum = combine(lid, local_sum, false);
    if (row >= rows) {
        return;
    }
    let log_sum = log(sum);
    // A row whose maximum is not finite is NaN throughout, as on the CPU (said explicitly: with
    // finite math assumed, exp(inf - inf) need not be NaN).
    let poisoned = !is_finite(row_max);
    for (var c = lid; c < cols; c += WG) {
        let shifted = f32(src[base + c]) - row_max;
        out[base + c] = T(select(select(exp(shifted) / sum, shifted - log_sum, LOG), f32_nan(), poisoned));
    }
}

// out = y * (grad - sum(grad * y)) per row, where src holds the softmax's output y.
@compute @workgroup_size(256)
fn softmax_backward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let row = wid.x + wid.y * groups.x;
    let base = min(row, rows - 1u) * cols;
    var local_dot = 0.0;
    for (var c = lid; c < cols; c += WG) {
        local_dot += f32(grad[base + c]) * f32(src[base + c]);
    }
    let dot = combine(lid, local_dot, false);
    if (row >= rows) {
        return;
    }
    for (var c = lid; c < cols; c += WG) {
        out[base + c] = T(f32(src[base + c]) * (f32(grad[base + c]) - dot));
    }
}
