// batch_norm: training-mode batch normalisation of a contiguous [outer, channels, inner] with the
// batch's own statistics, and its gradient, in three dispatches each way (the composed ops take
// about twenty). `T` is the input's and output's type (bf16 read and written in its packed
// words); weight, bias, statistics and every sum are f32. A channel's `count = outer * inner` values are cut into
// chunks whose length the host picks from the shape alone (core's gpu_plan); one workgroup
// reduces one (channel, chunk) in a fixed order and one invocation per channel folds its chunks
// in order, so every run gives the same bits. Statistics are Welford's per invocation and Chan's
// rule to merge; the element ops are the CPU's, in its order.
// With channel_major = 1 the input x and its gradient dx are laid out [channels, outer, inner],
// as a convolution's product comes (read where it lies, no gather); y and its gradient g stay
// [outer, channels, inner].
// With relu = 1 the forward pass writes relu(y) and the backward pass masks g by that saved
// output (g · [y > 0]): a following ReLU costs no pass of its own. With residual = 1 the forward
// pass adds a residual block's shortcut (laid out as y) before the ReLU.
// params: [len, channels, inner, count, chunk_len, chunks, eps (f32 bits), channel_major, relu,
// residual],
// except for the running-statistics entries (see `running`).

@group(0) @binding(1) var<storage, read> x: array<T>;
// Per (channel, chunk), two words each: (mean, m2) forward, (Σg, Σg·x̂) backward.
@group(0) @binding(2) var<storage, read_write> parts: array<f32>;
@group(0) @binding(3) var<storage, read_write> mean: array<f32>;
@group(0) @binding(4) var<storage, read_write> var_: array<f32>;
@group(0) @binding(5) var<storage, read> weight: array<f32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;
// y forward, dx backward.
@group(0) @binding(7) var<storage, read_write> out: array<T>;
@group(0) @binding(8) var<storage, read> grad: array<T>;
@group(0) @binding(9) var<storage, read_write> dweight: array<f32>;
@group(0) @binding(10) var<storage, read_write> dbias: array<f32>;
// Per channel, five words the input gradient reads: mean, denom, weight / denom, dbias / count,
// dweight / count (one binding instead of six keeps the dispatch within 8 storage buffers).
@group(0) @binding(11) var<storage, read_write> coef: array<f32>;

// The shortcut added to y forward, with residual = 1.
@group(0) @binding(16) var<storage, read> residual: array<T>;
// The forward pass's output, backward with relu = 1.
@group(0) @binding(15) var<storage, read> saved_y: array<T>;

// The running statistics a training batch is blended into, in place, and the I64 count of those
// batches as (low, high) u32 words.
@group(0) @binding(12) var<storage, read_write> running_mean: array<f32>;
@group(0) @binding(13) var<storage, read_write> running_var: array<f32>;
@group(0) @binding(14) var<storage, read_write> batches: array<u32>;

var<workgroup> wg_n: array<f32, 256>;
var<workgroup> wg_mean: array<f32, 256>;
var<workgroup> wg_m2: array<f32, 256>;

struct Moments {
    n: f32,
    mean: f32,
    m2: f32,
}

fn merge(a: Moments, b: Moments) -> Moments {
    if (b.n == 0.0) {
        return a;
    }
    let n = a.n + b.n;
    let d = b.mean - a.mean;
    let share = b.n / n;
    return Moments(n, a.mean + d * share, a.m2 + b.m2 + d * d * a.n * share);
}

// Where value r (of count) of channel c sits in [outer, channels, inner].
fn image_major_offset(r: u32, c: u32) -> u32 {
    let channels = params[1];
    let inner = params[2];
    return (r / inner) * channels * inner + c * inner + r % inner;
}

fn channel_major() -> bool {
    return params[7] != 0u;
}

// Where value r (of count) of channel c sits in x (and dx).
fn channel_offset(r: u32, c: u32) -> u32 {
    if (channel_major()) {
        return c * params[3] + r;
    }
    return image_major_offset(r, c);
}

// The channel of element i of y (or g), and where the same value sits in x.
fn from_output(i: u32) -> vec2<u32> {
    let c = (i / params[2]) % params[1];
    if (!channel_major()) {
        return vec2<u32>(c, i);
    }
    let inner = params[2];
    let r = (i / (params[1] * inner)) * inner + i % inner;
    return vec2<u32>(c, c * params[3] + r);
}

// The channel of element i of x (or dx), and where the same value sits in y (and g).
fn from_input(i: u32) -> vec2<u32> {
    if (!channel_major()) {
        return vec2<u32>((i / params[2]) % params[1], i);
    }
    let c = i / params[3];
    return vec2<u32>(c, image_major_offset(i % params[3], c));
}

// The channel and chunk of workgroup `w` (w = channel * chunks + chunk), and the chunk's values.
fn chunk_of(wid: vec3<u32>, groups: vec3<u32>) -> vec4<u32> {
    let w = wid.x + wid.y * groups.x;
    let chunks = params[5];
    let chunk = w % chunks;
    let start = chunk * params[4];
    return vec4<u32>(w / chunks, chunk, start, min(start + params[4], params[3]));
}

// Pass 1 forward: the mean and m2 of each (channel, chunk).
@compute @workgroup_size(256)
fn moments(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let at = chunk_of(wid, groups);
    let live = at.x < params[1];
    var a = Moments(0.0, 0.0, 0.0);
    if (live) {
        for (var r = at.z + lid; r < at.w; r += WG) {
            let o = channel_offset(r, at.x);
            let v = T_load(x[T_word(o)], o);
            a.n += 1.0;
            let d = v - a.mean;
            a.mean += d / a.n;
            a.m2 += d * (v - a.mean);
        }
    }
    wg_n[lid] = a.n;
    wg_mean[lid] = a.mean;
    wg_m2[lid] = a.m2;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width = width / 2u) {
        if (lid < width) {
            let m = merge(
                Moments(wg_n[lid], wg_mean[lid], wg_m2[lid]),
                Moments(wg_n[lid + width], wg_mean[lid + width], wg_m2[lid + width]),
            );
            wg_n[lid] = m.n;
            wg_mean[lid] = m.mean;
            wg_m2[lid] = m.m2;
        }
        workgroupBarrier();
    }
    if (lid == 0u && live) {
        let part = 2u * (at.x * params[5] + at.y);
        parts[part] = wg_mean[0];
        parts[part + 1u] = wg_m2[0];
    }
}

// Pass 2 forward: each channel's mean and biased variance from its chunks, in chunk order.
@compute @workgroup_size(256)
fn statistics(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let c = flat_index(gid, groups);
    if (c >= params[1]) {
        return;
    }
    let count = params[3];
    let chunk_len = params[4];
    let chunks = params[5];
    var a = Moments(0.0, 0.0, 0.0);
    for (var k = 0u; k < chunks; k++) {
        let part = 2u * (c * chunks + k);
        a = merge(a, Moments(f32(min(chunk_len, count - k * chunk_len)), parts[part], parts[part + 1u]));
    }
    mean[c] = a.mean;
    var_[c] = a.m2 / f32(count);
}

fn relu_fused() -> bool {
    return params[8] != 0u;
}

fn normalized(i: u32) -> f32 {
    let at = from_output(i);
    let c = at.x;
    var y = (T_load(x[T_word(at.y)], at.y) - mean[c]) / sqrt(var_[c] + param_f32(6u)) * weight[c] + bias[c];
    if (params[9] != 0u) {
        // As the composed ops: y stored in T, then the sum rounded once (on the store).
        y = T_load(T_pack(y, 0.0), 0u) + T_load(residual[T_word(i)], i);
    }
    if (relu_fused()) {
        return max_nan(y, 0.0);
    }
    return y;
}

// Element i of the output's gradient, masked by a fused ReLU's saved output.
fn output_grad(i: u32) -> f32 {
    let g = T_load(grad[T_word(i)], i);
    if (relu_fused() && !(T_load(saved_y[T_word(i)], i) > 0.0)) {
        return 0.0;
    }
    return g;
}

// Pass 3 forward: y = (x - mean) / sqrt(var + eps) * weight + bias, a storage word of y per
// invocation.
@compute @workgroup_size(256)
fn normalize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = normalized(first + 1u);
    }
    out[w] = T_pack(normalized(first), second);
}

// Pass 1 backward: Σg and Σg·x̂ of each (channel, chunk), x̂ = (x - mean) / sqrt(var + eps).
@compute @workgroup_size(256)
fn grad_sums(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let at = chunk_of(wid, groups);
    let live = at.x < params[1];
    var a = 0.0;
    var b = 0.0;
    if (live) {
        let m = mean[at.x];
        let denom = sqrt(var_[at.x] + param_f32(6u));
        for (var r = at.z + lid; r < at.w; r += WG) {
            let o = channel_offset(r, at.x);
            let g = output_grad(image_major_offset(r, at.x));
            a += g;
            b += g * ((T_load(x[T_word(o)], o) - m) / denom);
        }
    }
    wg_n[lid] = a;
    wg_mean[lid] = b;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width = width / 2u) {
        if (lid < width) {
            wg_n[lid] = wg_n[lid] + wg_n[lid + width];
            wg_mean[lid] = wg_mean[lid] + wg_mean[lid + width];
        }
        workgroupBarrier();
    }
    if (lid == 0u && live) {
        let part = 2u * (at.x * params[5] + at.y);
        parts[part] = wg_n[0];
        parts[part + 1u] = wg_mean[0];
    }
}

// Pass 2 backward: dbias = Σg and dweight = Σg·x̂ per channel, in chunk order, and the
// per-channel factors of the input gradient.
@compute @workgroup_size(256)
fn grad_totals(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let c = flat_index(gid, groups);
    if (c >= params[1]) {
        return;
    }
    let chunks = params[5];
    var a = 0.0;
    var b = 0.0;
    for (var k = 0u; k < chunks; k++) {
        let part = 2u * (c * chunks + k);
        a += parts[part];
        b += parts[part + 1u];
    }
    dbias[c] = a;
    dweight[c] = b;
    let count = f32(params[3]);
    let denom = sqrt(var_[c] + param_f32(6u));
    coef[5u * c] = mean[c];
    coef[5u * c + 1u] = denom;
    coef[5u * c + 2u] = weight[c] / denom;
    coef[5u * c + 3u] = a / count;
    coef[5u * c + 4u] = b / count;
}

// Element i of dx, laid out as x.
fn input_grad_at(i: u32) -> f32 {
    let at = from_input(i);
    let k = 5u * at.x;
    let x_hat = (T_load(x[T_word(i)], i) - coef[k]) / coef[k + 1u];
    return coef[k + 2u] * (output_grad(at.y) - coef[k + 3u] - x_hat * coef[k + 4u]);
}

// Pass 3 backward: dx = weight / denom · (g - dbias / count - x̂ · dweight / count), a storage
// word of dx per invocation.
@compute @workgroup_size(256)
fn input_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = input_grad_at(first + 1u);
    }
    out[w] = T_pack(input_grad_at(first), second);
}

// Channel c's running statistics blended with the batch's (mean, biased var_), with the host's
// f32 factors, as the composed element ops compute it: running * keep + batch * take, the
// variance made unbiased first.
// params: [channels, keep (f32 bits), take (f32 bits), unbias (f32 bits)]
fn blend_running(c: u32) {
    let keep = param_f32(1u);
    let take = param_f32(2u);
    running_mean[c] = running_mean[c] * keep + mean[c] * take;
    running_var[c] = running_var[c] * keep + var_[c] * param_f32(3u) * take;
}

// A training batch's bookkeeping in one dispatch: the running statistics of every channel.
@compute @workgroup_size(256)
fn running(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let c = flat_index(gid, groups);
    if (c < params[0]) {
        blend_running(c);
    }
}

// `running`, and the batch counted: the I64 count gains 1, carried into its high word.
@compute @workgroup_size(256)
fn running_counted(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let c = flat_index(gid, groups);
    if (c < params[0]) {
        blend_running(c);
    }
    if (c == 0u) {
        let low = batches[0] + 1u;
        batches[0] = low;
        batches[1] = batches[1] + select(0u, 1u, low == 0u);
    }
}
