// layer_norm_last over the last axis of a contiguous [rows, cols] with its optional affine part,
// and its gradients: a group of invocations per row (see `Slot`), the row's sums combined in
// workgroup memory. f32 math; the statistics are recomputed by the backward pass instead of
// stored. The weight's and bias's gradients are column sums over the rows, in an order fixed by
// the shape: each group sums its chunk of rows into `parts` in row order (each column of a
// chunk written by the one invocation that owns it, no atomics), then `layer_norm_column_sums`
// sums the chunks in order.
// params: [rows, cols, eps (f32 bits), group, flags, rows per chunk, chunks]
// flags: 1 a weight, 2 a bias (an absent one's binding holds the input, never read), 4 the
// backward pass sums the columns into `parts`.

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> grad: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;
@group(0) @binding(4) var<storage, read> weight: array<T>;
@group(0) @binding(5) var<storage, read> bias: array<T>;
// [2, chunks, cols]: each chunk's sums of grad * normed, then of grad.
@group(0) @binding(6) var<storage, read_write> parts: array<f32>;
@group(0) @binding(7) var<storage, read_write> dweight: array<T>;
@group(0) @binding(8) var<storage, read_write> dbias: array<T>;

const HAS_WEIGHT: u32 = 1u;
const HAS_BIAS: u32 = 2u;
const SUMS_COLUMNS: u32 = 4u;

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

// The weight of column c, 1 without one.
fn scale(c: u32) -> f32 {
    if ((params[4] & HAS_WEIGHT) == 0u) {
        return 1.0;
    }
    return f32(weight[c]);
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
    let has_bias = (params[4] & HAS_BIAS) != 0u;
    let s = slot(wid, groups, lid, group);
    let row = s.index;
    let base = min(row, rows - 1u) * cols;
    let stats = statistics(lid, s.lane, base, cols, bitcast<f32>(params[2]));
    if (row >= rows) {
        return;
    }
    for (var c = s.lane; c < cols; c += group) {
        var y = (f32(src[base + c]) - stats.x) * stats.y * scale(c);
        if (has_bias) {
            y += f32(bias[c]);
        }
        out[base + c] = T(y);
    }
}

// A group per chunk of rows, taking them in order: every invocation runs every row's combines
// (their barriers), a row past the end writing nothing.
@compute @workgroup_size(256)
fn layer_norm_backward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let rows = params[0];
    let cols = params[1];
    let group = params[3];
    let sums = (params[4] & SUMS_COLUMNS) != 0u;
    let chunk_rows = params[5];
    let chunks = params[6];
    let s = slot(wid, groups, lid, group);
    let chunk = s.index;
    for (var i = 0u; i < chunk_rows; i++) {
        let row = chunk * chunk_rows + i;
        let base = min(row, rows - 1u) * cols;
        let stats = statistics(lid, s.lane, base, cols, bitcast<f32>(params[2]));
        var local_gw = 0.0;
        var local_gwn = 0.0;
        for (var c = s.lane; c < cols; c += group) {
            let gw = f32(grad[base + c]) * scale(c);
            local_gw += gw;
            local_gwn += gw * (f32(src[base + c]) - stats.x) * stats.y;
        }
        let gw_mean = total(lid, s.lane, local_gw) / f32(cols);
        let gwn_mean = total(lid, s.lane, local_gwn) / f32(cols);
        if (row < rows) {
            for (var c = s.lane; c < cols; c += group) {
                let g = f32(grad[base + c]);
                let normed = (f32(src[base + c]) - stats.x) * stats.y;
                out[base + c] = T(stats.y * (g * scale(c) - gw_mean - normed * gwn_mean));
                if (sums) {
                    // The chunk's first row starts its sums.
                    let at = chunk * cols + c;
                    let earlier = select(vec2<f32>(parts[at], parts[chunks * cols + at]), vec2<f32>(0.0), i == 0u);
                    parts[at] = earlier.x + g * normed;
                    parts[chunks * cols + at] = earlier.y + g;
                }
            }
        }
    }
}

// An invocation per column: the weight's and bias's gradients, the chunks' sums added in order.
@compute @workgroup_size(256)
fn layer_norm_column_sums(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let cols = params[1];
    let chunks = params[6];
    let c = flat_index(gid, groups);
    if (c >= cols) {
        return;
    }
    var dw = 0.0;
    var db = 0.0;
    for (var k = 0u; k < chunks; k++) {
        dw += parts[k * cols + c];
        db += parts[(chunks + k) * cols + c];
    }
    dweight[c] = T(dw);
    dbias[c] = T(db);
}
