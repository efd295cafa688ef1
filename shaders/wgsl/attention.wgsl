// causal_attention and its backward pass fused (flash attention): nothing t x t is ever stored.
// f32 math for every T (bf16 read and written in its packed words). qkv is
// [batch, t, 3, heads, HEAD_DIM] with queries, keys and values in slots 0, 1, 2; y and dy are
// [batch, t, heads, HEAD_DIM]; lse and dots are f32 [batch, heads, t].
// A workgroup takes ROWS rows of one sequence's head, an invocation per row, and walks the other
// side's rows in tiles of `tile_rows()` staged in workgroup memory as f32.
// causal_attention: per query, over the keys up to itself, a running maximum m, sum l and sum of
// values weighted by exp(score - m), rescaled whenever m grows; y = acc / l, lse = m + log(l).
// A NaN or +inf score makes its row NaN.
// causal_attention_dq: per query, dot = dy·y (stored in dots for the next pass), then over its
// keys p = exp(score - lse), ds = p (dy·v - dot), dq += ds k; dq *= scale.
// causal_attention_dkdv: per key, over the queries that see it, dv += p dy, dk += ds q scale.
// Each pass writes its own slots of dqkv, each element once: no atomics, so every sum runs in
// one order and gives the same bits every run.
// params: [t, heads, tiles (workgroups per sequence's head), scale, batch * heads]

override HEAD_DIM: u32 = 64u;

const ROWS: u32 = 64u;
const MAX_DIM: u32 = 128u;
// f32 of each staged tile: 4 KiB, so the two tiles and the row values fit WebGPU's 16 KiB.
const STAGE: u32 = 1024u;

@group(0) @binding(1) var<storage, read> qkv: array<T>;
@group(0) @binding(2) var<storage, read_write> y: array<T>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<T>;
@group(0) @binding(5) var<storage, read_write> dots: array<f32>;
@group(0) @binding(6) var<storage, read_write> dqkv: array<T>;

var<workgroup> stage_a: array<f32, STAGE>;
var<workgroup> stage_b: array<f32, STAGE>;
var<workgroup> stage_lse: array<f32, ROWS>;
var<workgroup> stage_dot: array<f32, ROWS>;

// One sequence's head and the first of the workgroup's rows.
struct Head {
    seq: u32,
    head: u32,
    first: u32,
    // False for the workgroups a folded grid adds past the last head.
    valid: bool,
}

fn locate(wid: vec3<u32>, groups: vec3<u32>) -> Head {
    let g = wid.x + wid.y * groups.x;
    let tiles = params[2];
    let bh = g / tiles;
    return Head(bh / params[1], bh % params[1], (g % tiles) * ROWS, bh < params[4]);
}

// Rows of the other side staged at once.
fn tile_rows() -> u32 {
    return min(STAGE / HEAD_DIM, ROWS);
}

fn qkv_index(h: Head, pos: u32, slot: u32, c: u32) -> u32 {
    return (((h.seq * params[0] + pos) * 3u + slot) * params[1] + h.head) * HEAD_DIM + c;
}

fn out_index(h: Head, pos: u32, c: u32) -> u32 {
    return ((h.seq * params[0] + pos) * params[1] + h.head) * HEAD_DIM + c;
}

fn row_index(h: Head, pos: u32) -> u32 {
    return (h.seq * params[1] + h.head) * params[0] + pos;
}

fn qkv_value(i: u32) -> f32 {
    return T_load(qkv[T_word(i)], i);
}

fn y_value(i: u32) -> f32 {
    return T_load(y[T_word(i)], i);
}

fn dy_value(i: u32) -> f32 {
    return T_load(dy[T_word(i)], i);
}

// Keys (stage_a) and values (stage_b) of positions first .. first + tile_rows(); past t, zeros.
fn stage_keys(h: Head, first: u32, lid: u32) {
    let n = tile_rows() * HEAD_DIM;
    for (var e = lid; e < n; e += ROWS) {
        let pos = first + e / HEAD_DIM;
        let c = e % HEAD_DIM;
        var kv = vec2<f32>(0.0);
        if (pos < params[0]) {
            kv = vec2<f32>(qkv_value(qkv_index(h, pos, 1u, c)), qkv_value(qkv_index(h, pos, 2u, c)));
        }
        stage_a[e] = kv.x;
        stage_b[e] = kv.y;
    }
}

// Scaled queries (stage_a, rounded as the forward pass scales them), their output gradients
// (stage_b), lse and dots of positions first .. first + tile_rows(); past t, zeros.
fn stage_queries(h: Head, first: u32, lid: u32) {
    let n = tile_rows() * HEAD_DIM;
    let scale = param_f32(3u);
    for (var e = lid; e < n; e += ROWS) {
        let pos = first + e / HEAD_DIM;
        let c = e % HEAD_DIM;
        var qg = vec2<f32>(0.0);
        if (pos < params[0]) {
            qg = vec2<f32>(qkv_value(qkv_index(h, pos, 0u, c)) * scale, dy_value(out_index(h, pos, c)));
        }
        stage_a[e] = qg.x;
        stage_b[e] = qg.y;
    }
    if (lid < tile_rows()) {
        let pos = first + lid;
        var rd = vec2<f32>(0.0);
        if (pos < params[0]) {
            rd = vec2<f32>(lse[row_index(h, pos)], dots[row_index(h, pos)]);
        }
        stage_lse[lid] = rd.x;
        stage_dot[lid] = rd.y;
    }
}

// The last key any of the workgroup's queries sees.
fn last_key(h: Head) -> u32 {
    return min(h.first + ROWS, params[0]) - 1u;
}

@compute @workgroup_size(64)
fn causal_attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let h = locate(wid, groups);
    if (!h.valid) {
        return;
    }
    let t = params[0];
    let i = h.first + lid;
    let live = i < t;
    let row = min(i, t - 1u);
    var q: array<f32, MAX_DIM>;
    var acc: array<f32, MAX_DIM>;
    for (var c = 0u; c < HEAD_DIM; c++) {
        q[c] = qkv_value(qkv_index(h, row, 0u, c)) * param_f32(3u);
        acc[c] = 0.0;
    }
    // The maximum starts at the lowest finite float, so the first finite score replaces it.
    var m = -3.40282347e38;
    var l = 0.0;
    var poisoned = false;
    let rows = tile_rows();
    for (var first = 0u; first <= last_key(h); first += rows) {
        workgroupBarrier();
        stage_keys(h, first, lid);
        workgroupBarrier();
        let end = select(first, min(first + rows, i + 1u), live);
        for (var j = first; j < end; j++) {
            let at = (j - first) * HEAD_DIM;
            var s = 0.0;
            for (var c = 0u; c < HEAD_DIM; c++) {
                s += q[c] * stage_a[at + c];
            }
            // By their bits: compilers may assume finite math.
            let bits = bitcast<u32>(s);
            if (is_nan(s) || bits == 0x7f800000u) {
                poisoned = true;
                continue;
            }
            if (bits == 0xff800000u) {
                continue;
            }
            if (s > m) {
                let r = exp(m - s);
                l = l * r + 1.0;
                for (var c = 0u; c < HEAD_DIM; c++) {
                    acc[c] = acc[c] * r + stage_b[at + c];
                }
                m = s;
            } else {
                let p = exp(s - m);
                l += p;
                for (var c = 0u; c < HEAD_DIM; c++) {
                    acc[c] += p * stage_b[at + c];
                }
            }
        }
    }
    if (!live) {
        return;
    }
    let base = out_index(h, i, 0u);
    for (var c = 0u; c < HEAD_DIM; c += T_PER_WORD) {
        let lo = select(acc[c] / l, f32_nan(), poisoned);
        let hi = select(acc[min(c + 1u, MAX_DIM - 1u)] / l, f32_nan(), poisoned);
        y[T_word(base + c)] = T_pack(lo, hi);
    }
    lse[row_index(h, i)] = select(m + log(l), f32_nan(), poisoned);
}

@compute @workgroup_size(64)
fn causal_attention_dq(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let h = locate(wid, groups);
    if (!h.valid) {
        return;
    }
    let t = params[0];
    let i = h.first + lid;
    let live = i < t;
    let row = min(i, t - 1u);
    var q: array<f32, MAX_DIM>;
    var g: array<f32, MAX_DIM>;
    var dq: array<f32, MAX_DIM>;
    let out_row = out_index(h, row, 0u);
    var dot = 0.0;
    for (var c = 0u; c < HEAD_DIM; c++) {
        q[c] = qkv_value(qkv_index(h, row, 0u, c)) * param_f32(3u);
        g[c] = dy_value(out_row + c);
        dot += g[c] * y_value(out_row + c);
        dq[c] = 0.0;
    }
    let row_lse = lse[row_index(h, row)];
    if (live) {
        dots[row_index(h, i)] = dot;
    }
    let rows = tile_rows();
    for (var first = 0u; first <= last_key(h); first += rows) {
        workgroupBarrier();
        stage_keys(h, first, lid);
        workgroupBarrier();
        let end = select(first, min(first + rows, i + 1u), live);
        for (var j = first; j < end; j++) {
            let at = (j - first) * HEAD_DIM;
            var s = 0.0;
            var dp = 0.0;
            for (var c = 0u; c < HEAD_DIM; c++) {
                s += q[c] * stage_a[at + c];
                dp += g[c] * stage_b[at + c];
            }
            let ds = exp(s - row_lse) * (dp - dot);
            for (var c = 0u; c < HEAD_DIM; c++) {
                dq[c] += ds * stage_a[at + c];
            }
        }
    }
    if (!live) {
        return;
    }
    let scale = param_f32(3u);
    let base = qkv_index(h, i, 0u, 0u);
    for (var c = 0u; c < HEAD_DIM; c += T_PER_WORD) {
        dqkv[T_word(base + c)] = T_pack(dq[c] * scale, dq[min(c + 1u, MAX_DIM - 1u)] * scale);
    }
}

@compute @workgroup_size(64)
fn causal_attention_dkdv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let h = locate(wid, groups);
    if (!h.valid) {
        return;
    }
    let t = params[0];
    let j = h.first + lid;
    let live = j < t;
    let row = min(j, t - 1u);
    var k: array<f32, MAX_DIM>;
    var v: array<f32, MAX_DIM>;
    var dk: array<f32, MAX_DIM>;
    var dv: array<f32, MAX_DIM>;
    for (var c = 0u; c < HEAD_DIM; c++) {
        k[c] = qkv_value(qkv_index(h, row, 1u, c));
        v[c] = qkv_value(qkv_index(h, row, 2u, c));
        dk[c] = 0.0;
        dv[c] = 0.0;
    }
    let rows = tile_rows();
    // Queries before the workgroup's first key see none of its keys.
    for (var first = h.first; first < t; first += rows) {
        workgroupBarrier();
        stage_queries(h, first, lid);
        workgroupBarrier();
        let end = select(first, min(first + rows, t), live);
        for (var i = max(first, j); i < end; i++) {
            let r = i - first;
            let at = r * HEAD_DIM;
            var s = 0.0;
            var dp = 0.0;
            for (var c = 0u; c < HEAD_DIM; c++) {
                s += stage_a[at + c] * k[c];
                dp += stage_b[at + c] * v[c];
            }
            let p = exp(s - stage_lse[r]);
            let ds = p * (dp - stage_dot[r]);
            for (var c = 0u; c < HEAD_DIM; c++) {
                dv[c] += p * stage_b[at + c];
                dk[c] += ds * stage_a[at + c];
            }
        }
    }
    if (!live) {
        return;
    }
    let keys = qkv_index(h, j, 1u, 0u);
    let values = qkv_index(h, j, 2u, 0u);
    for (var c = 0u; c < HEAD_DIM; c += T_PER_WORD) {
        let next = min(c + 1u, MAX_DIM - 1u);
        dqkv[T_word(keys + c)] = T_pack(dk[c], dk[next]);
        dqkv[T_word(values + c)] = T_pack(dv[c], dv[next]);
    }
}
