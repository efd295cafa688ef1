// softmax_last / log_softmax_last over the last axis of a contiguous [rows, cols]: a group of
// invocations per row (see `Slot`), the row's maximum and sum of exponentials combined in
// workgroup memory; and the softmax's gradient from its output (src) and the output gradient.
// f32 math.
// params: [rows, cols, group]
// causal_softmax (attention's weights): dropout(softmax(src * scale)) over rows of t scores, row
// r seeing keys 0 ..= r % t, the rest 0; its backward from the scores (src) and the output
// gradient, the weights computed again and the mask drawn again.
// params: [rows, t, scale, dropout (0 or 1), seed_lo, seed_hi, counter_lo, counter_hi, p, keep, group]

override LOG: bool = false;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;
@group(0) @binding(3) var<storage, read> grad: array<T>;

@compute @workgroup_size(256)
fn softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let group = params[2];
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * cols;
    var local_max = -f32_inf();
    for (var c = s.lane; c < cols; c += group) {
        local_max = max_nan(local_max, f32(src[base + c]));
    }
    let row_max = group_combine(lid, s.lane, group, local_max, true);
    var local_sum = 0.0;
    for (var c = s.lane; c < cols; c += group) {
        local_sum += exp(f32(src[base + c]) - row_max);
    }
    let sum = group_combine(lid, s.lane, group, local_sum, false);
    if (row >= rows) {
        return;
    }
    let log_sum = log(sum);
    // A row whose maximum is not finite is NaN throughout, as on the CPU (said explicitly: with
    // finite math assumed, exp(inf - inf) need not be NaN).
    let poisoned = !is_finite(row_max);
    for (var c = s.lane; c < cols; c += group) {
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
    let group = params[2];
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * cols;
    var local_dot = 0.0;
    for (var c = s.lane; c < cols; c += group) {
        local_dot += f32(grad[base + c]) * f32(src[base + c]);
    }
    let dot = group_combine(lid, s.lane, group, local_dot, false);
    if (row >= rows) {
        return;
    }
    for (var c = s.lane; c < cols; c += group) {
        out[base + c] = T(f32(src[base + c]) * (f32(grad[base + c]) - dot));
    }
}

// What dropout leaves of flat element e: `keep` where the stream's uniform is at least p, else 0;
// 1 without dropout.
fn causal_dropout(e: u32) -> f32 {
    if (params[3] == 0u) {
        return 1.0;
    }
    let kept = unit_float(stream_block(4u, e)[e % 4u]) >= param_f32(8u);
    return select(0.0, param_f32(9u), kept);
}

// A group's row: its index (past the last row for spare groups), the invocation's lane, the first
// element of the row it reads, the keys it sees, and the row's maximum (x) and sum of
// exponentials (y) over them, of the scaled scores.
struct CausalRow {
    row: u32,
    lane: u32,
    base: u32,
    seen: u32,
    stats: vec2<f32>,
}

fn causal_group() -> u32 {
    return params[10];
}

fn causal_row(lid: u32, wid: vec3<u32>, groups: vec3<u32>) -> CausalRow {
    let group = causal_group();
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let r = min(row, params[0] - 1u);
    let base = r * params[1];
    let seen = r % params[1] + 1u;
    let scale = param_f32(2u);
    var local_max = -f32_inf();
    for (var c = s.lane; c < seen; c += group) {
        local_max = max_nan(local_max, f32(src[base + c]) * scale);
    }
    let row_max = group_combine(lid, s.lane, group, local_max, true);
    var local_sum = 0.0;
    for (var c = s.lane; c < seen; c += group) {
        local_sum += exp(f32(src[base + c]) * scale - row_max);
    }
    let sum = group_combine(lid, s.lane, group, local_sum, false);
    return CausalRow(row, s.lane, base, seen, vec2<f32>(row_max, sum));
}

// The softmax weight of element c of the row, before dropout.
fn causal_weight(at: CausalRow, c: u32) -> f32 {
    return exp(f32(src[at.base + c]) * param_f32(2u) - at.stats.x) / at.stats.y;
}

@compute @workgroup_size(256)
fn causal_softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let at = causal_row(lid, wid, groups);
    if (at.row >= params[0]) {
        return;
    }
    // A row whose maximum is not finite is NaN throughout, as softmax_last makes it.
    let poisoned = !is_finite(at.stats.x);
    for (var c = at.lane; c < params[1]; c += causal_group()) {
        var w = 0.0;
        if (c < at.seen) {
            w = causal_weight(at, c) * causal_dropout(at.base + c);
        }
        out[at.base + c] = T(select(w, f32_nan(), poisoned));
    }
}

// scale * y * (dy - sum(y * dy)) on the keys seen, 0 on the rest; dy = grad through dropout.
@compute @workgroup_size(256)
fn causal_softmax_backward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let at = causal_row(lid, wid, groups);
    var local_dot = 0.0;
    for (var c = at.lane; c < at.seen; c += causal_group()) {
        local_dot += causal_weight(at, c) * f32(grad[at.base + c]) * causal_dropout(at.base + c);
    }
    let dot = group_combine(lid, at.lane, causal_group(), local_dot, false);
    if (at.row >= params[0]) {
        return;
    }
    let poisoned = !is_finite(at.stats.x);
    for (var c = at.lane; c < params[1]; c += causal_group()) {
        var d = 0.0;
        if (c < at.seen) {
            let dy = f32(grad[at.base + c]) * causal_dropout(at.base + c);
            d = select(causal_weight(at, c) * (dy - dot) * param_f32(2u), f32_nan(), poisoned);
        }
        out[at.base + c] = T(d);
    }
}
