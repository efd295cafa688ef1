// layer_norm_last over the last axis of a contiguous [rows, cols] with its optional affine part,
// and its gradients: a group of invocations per row (see `Slot`), the row's sums combined in
// workgroup memory. f32 math; the statistics are recomputed by the backward pass instead of
// stored. The weight's and bias's gradients are column sums over the rows, in an order fixed by
// the shape: each group sums its chunk of rows into `parts` in row order (each column of a
// chunk written by the one invocation that owns it, no atomics), then `layer_norm_column_sums`
// sums the chunks in order.
// `layer_norm_to_bf16` writes an f32 LayerNorm's output as bf16 words (two columns a word, so
// an even number of columns: a row then starts on a word), the bits of `layer_norm` then a
// narrowing cast; with flag 8 the operand at `grad`'s bindings is read from bf16 words
// (`grad_words`, widened exactly) instead of `grad`.
// With flag 16 the forward entries normalise the residual add `src + branch` (the branch at
// `grad`'s bindings: Backend::add_layer_norm_last_to) and write that sum to `sum`; with flag 32
// the backward pass adds `accumulated` (the gradient the input's other uses delivered) to the
// input's gradient, rounded once as a separate add would.
// params: [rows, cols, eps (f32 bits), group, flags, rows per chunk, chunks]
// flags: 1 a weight, 2 a bias (an absent one's binding holds the input, never read), 4 the
// backward pass sums the columns into `parts`, 8 `grad` is bf16 (`grad` then holds the input,
// never read; otherwise `grad_words` holds `grad`, never read), 16 a branch added, 32 a gradient
// accumulated (unread bindings hold the input, or a one-element buffer where written).

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> grad: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;
@group(0) @binding(4) var<storage, read> weight: array<T>;
@group(0) @binding(5) var<storage, read> bias: array<T>;
// [2, chunks, cols]: each chunk's sums of grad * normed, then of grad.
@group(0) @binding(6) var<storage, read_write> parts: array<f32>;
@group(0) @binding(7) var<storage, read_write> dweight: array<T>;
@group(0) @binding(8) var<storage, read_write> dbias: array<T>;
@group(0) @binding(9) var<storage, read_write> out_words: array<u32>;
@group(0) @binding(10) var<storage, read> grad_words: array<u32>;
@group(0) @binding(11) var<storage, read_write> sum: array<T>;
@group(0) @binding(12) var<storage, read> accumulated: array<T>;

const HAS_WEIGHT: u32 = 1u;
const HAS_BIAS: u32 = 2u;
const SUMS_COLUMNS: u32 = 4u;
const GRAD_BF16: u32 = 8u;
const ADDS_BRANCH: u32 = 16u;
const ACCUMULATES: u32 = 32u;

// The sum of the values of lid's group, returned to each of its invocations.
fn total(lid: u32, lane: u32, value: f32) -> f32 {
    return group_combine(lid, lane, params[3], value, false);
}

// The row's mean and 1 / sqrt(var + eps) (biased variance, two passes).
fn statistics(lid: u32, lane: u32, base: u32, cols: u32, eps: f32) -> vec2<f32> {
    let group = params[3];
    var local = 0.0;
    for (var c = lane; c < cols; c += group) {
        local += x_at(base + c);
    }
    let mean = total(lid, lane, local) / f32(cols);
    var squares = 0.0;
    for (var c = lane; c < cols; c += group) {
        let d = x_at(base + c) - mean;
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

// The row an invocation's group normalises forward (past the last row: the last row's place,
// its statistics taken for their barriers and nothing written), where it starts, the
// invocation's lane in the group, and the row's statistics.
struct RowAt {
    row: u32,
    base: u32,
    lane: u32,
    stats: vec2<f32>,
}

fn row_of(wid: vec3<u32>, groups: vec3<u32>, lid: u32) -> RowAt {
    let s = slot(wid, groups, lid, params[3]);
    let base = min(s.index, params[0] - 1u) * params[1];
    return RowAt(s.index, base, s.lane, statistics(lid, s.lane, base, params[1], bitcast<f32>(params[2])));
}

// Column c of the row at `base` normalised, scaled and shifted; with a branch added, the sum
// written to `sum` too (by the one invocation that owns the column).
fn normalized(base: u32, c: u32, stats: vec2<f32>) -> f32 {
    let x = x_at(base + c);
    if ((params[4] & ADDS_BRANCH) != 0u) {
        sum[base + c] = T(x);
    }
    var y = (x - stats.x) * stats.y * scale(c);
    if ((params[4] & HAS_BIAS) != 0u) {
        y += f32(bias[c]);
    }
    return y;
}

// Element i of the operand at `grad`'s bindings (the output gradient, or the residual branch),
// from `grad` or from bf16 words.
fn grad_at(i: u32) -> f32 {
    if ((params[4] & GRAD_BF16) != 0u) {
        return bf16_at(grad_words[i >> 1u], i);
    }
    return f32(grad[i]);
}

// Element i of the rows normalised: `src`, or with a branch the residual add `src + branch`,
// rounded to T as the add stores it.
fn x_at(i: u32) -> f32 {
    let x = f32(src[i]);
    if ((params[4] & ADDS_BRANCH) == 0u) {
        return x;
    }
    return f32(T(x + grad_at(i)));
}

@compute @workgroup_size(256)
fn layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = row_of(wid, groups, lid);
    if (r.row >= params[0]) {
        return;
    }
    for (var c = r.lane; c < params[1]; c += params[3]) {
        out[r.base + c] = T(normalized(r.base, c, r.stats));
    }
}

// `layer_norm` with its output as bf16 words, a word (two columns) an invocation of the row's
// group at a time; `cols` is even.
@compute @workgroup_size(256)
fn layer_norm_to_bf16(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = row_of(wid, groups, lid);
    if (r.row >= params[0]) {
        return;
    }
    for (var w = r.lane; w < params[1] / 2u; w += params[3]) {
        let c = 2u * w;
        let lo = round_to_bf16(normalized(r.base, c, r.stats));
        out_words[r.base / 2u + w] = lo | (round_to_bf16(normalized(r.base, c + 1u, r.stats)) << 16u);
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
            let gw = grad_at(base + c) * scale(c);
            local_gw += gw;
            local_gwn += gw * (f32(src[base + c]) - stats.x) * stats.y;
        }
        let gw_mean = total(lid, s.lane, local_gw) / f32(cols);
        let gwn_mean = total(lid, s.lane, local_gwn) / f32(cols);
        if (row < rows) {
            for (var c = s.lane; c < cols; c += group) {
                let g = grad_at(base + c);
                let normed = (f32(src[base + c]) - stats.x) * stats.y;
                var dx = f32(T(stats.y * (g * scale(c) - gw_mean - normed * gwn_mean)));
                if ((params[4] & ACCUMULATES) != 0u) {
                    dx = f32(accumulated[base + c]) + dx;
                }
                out[base + c] = T(dx);
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
