// cross_entropy: the mean cross-entropy's row losses and gradient in one pass per row of
// contiguous [rows, classes] logits (src) against u32 targets, f32 math for every T (bf16 read
// and written in its packed words). A group of invocations per row (see `Slot`) keeps running
// pairs (maximum m, sum of exp(x - m)) over its strided classes, merged in workgroup memory in
// a fixed order (the same bits every run); a second read of the row writes
// out = (exp(x - lse) - onehot) * inv_rows. A row whose maximum is not finite has a NaN loss and
// gradient (its lse is stored NaN); a target out of range gives loss 0 and gradient 0, as the
// composed gather and scatter_add do here.
// params: [rows, classes, group, inv_rows, write_grad]
// In bf16 with odd classes two rows share the word at every other seam: the row pass writes the
// words wholly its own, then `cross_entropy_seams` (an invocation per row) the word holding the
// row's last element when that is a word's low half, from the lse the row pass stored.
// cross_entropy_backward: out = src * upstream[0] (src the saved gradient), a word per invocation.
// params: [n, words]

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;
@group(0) @binding(5) var<storage, read_write> lse_of_row: array<f32>;
@group(0) @binding(6) var<storage, read> upstream: array<f32>;

var<workgroup> row_sums: array<f32, 256>;

fn logit(i: u32) -> f32 {
    return T_load(src[T_word(i)], i);
}

// A running (m, s) after logit x. The maximum starts at the lowest finite float and -inf adds
// nothing, so a row of only -inf keeps s = 0. NaN by its bits (compilers may assume finite math).
fn add_logit(ms: vec2<f32>, x: f32) -> vec2<f32> {
    if (is_nan(x) || is_nan(ms.y)) {
        return vec2<f32>(ms.x, f32_nan());
    }
    if (bitcast<u32>(x) == 0xff800000u) {
        return ms;
    }
    if (x > ms.x) {
        return vec2<f32>(x, ms.y * exp(ms.x - x) + 1.0);
    }
    return vec2<f32>(ms.x, ms.y + exp(x - ms.x));
}

fn merge_logits(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    if (is_nan(a.y) || is_nan(b.y)) {
        return vec2<f32>(max(a.x, b.x), f32_nan());
    }
    let hi = select(a.x, b.x, b.x > a.x);
    return vec2<f32>(hi, a.y * exp(a.x - hi) + b.y * exp(b.x - hi));
}

// The group's (m, s) pairs merged, returned to every member. Every invocation calls it.
fn combine_logits(lid: u32, lane: u32, group: u32, ms: vec2<f32>) -> vec2<f32> {
    group_scratch[lid] = ms.x;
    row_sums[lid] = ms.y;
    workgroupBarrier();
    for (var width = group / 2u; width > 0u; width = width / 2u) {
        if (lane < width) {
            let merged = merge_logits(
                vec2<f32>(group_scratch[lid], row_sums[lid]),
                vec2<f32>(group_scratch[lid + width], row_sums[lid + width]),
            );
            group_scratch[lid] = merged.x;
            row_sums[lid] = merged.y;
        }
        workgroupBarrier();
    }
    let result = vec2<f32>(group_scratch[lid - lane], row_sums[lid - lane]);
    workgroupBarrier();
    return result;
}

// The gradient at flat element i of `row`, whose lse is NaN when the row is poisoned.
fn dlogit(i: u32, row: u32, lse: f32) -> f32 {
    let classes = params[1];
    let label = targets[row];
    let onehot = select(0.0, 1.0, i - row * classes == label);
    let d = select(0.0, (exp(logit(i) - lse) - onehot) * param_f32(3u), label < classes);
    return select(d, f32_nan(), is_nan(lse));
}

@compute @workgroup_size(256)
fn cross_entropy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let classes = params[1];
    let group = params[2];
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * classes;
    var ms = vec2<f32>(-3.40282347e38, 0.0);
    for (var c = s.lane; c < classes; c += group) {
        ms = add_logit(ms, logit(base + c));
    }
    ms = combine_logits(lid, s.lane, group, ms);
    if (row >= rows) {
        return;
    }
    let poisoned = !is_finite(ms.x) || is_nan(ms.y) || ms.y == 0.0;
    let lse = select(ms.x + log(ms.y), f32_nan(), poisoned);
    if (s.lane == 0u) {
        let label = targets[row];
        var loss = 0.0;
        if (label < classes) {
            loss = lse - logit(base + label);
        }
        losses[row] = loss;
        lse_of_row[row] = lse;
    }
    if (params[4] == 0u) {
        return;
    }
    // The words wholly inside the row.
    let first = (base + T_PER_WORD - 1u) / T_PER_WORD;
    let end = (base + classes) / T_PER_WORD;
    for (var w = first + s.lane; w < end; w += group) {
        let i = w * T_PER_WORD;
        var second = 0.0;
        if (T_PER_WORD == 2u) {
            second = dlogit(i + 1u, row, lse);
        }
        out[w] = T_pack(dlogit(i, row, lse), second);
    }
}

@compute @workgroup_size(256)
fn cross_entropy_seams(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let row = flat_index(gid, groups);
    let rows = params[0];
    let last = (row + 1u) * params[1] - 1u;
    if (row >= rows || (last & 1u) == 1u) {
        return;
    }
    var second = 0.0;
    if (row + 1u < rows) {
        second = dlogit(last + 1u, row + 1u, lse_of_row[row + 1u]);
    }
    out[last >> 1u] = T_pack(dlogit(last, row, lse_of_row[row]), second);
}

@compute @workgroup_size(256)
fn cross_entropy_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    if (w >= params[1]) {
        return;
    }
    let g = upstream[0];
    let i = w * T_PER_WORD;
    var second = 0.0;
    if (T_PER_WORD == 2u && i + 1u < params[0]) {
        second = logit(i + 1u) * g;
    }
    out[w] = T_pack(logit(i) * g, second);
}
