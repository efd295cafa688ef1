// Convolution and pooling over contiguous NCHW.
//   im2col:     [n, c, h, w] -> columns [c*kh*kw, n*oh*ow] (zeros where padded), so a
//               convolution is one GEMM. An invocation finds its output pixels once and
//               writes them into each of its channel's kh*kw rows (finding them for every
//               element took nine integer divisions an element, which bounded the kernel).
//   col2im:     its adjoint; one invocation per input pixel sums the columns that read it (no
//               atomics, deterministic).
//   max_pool2d: values [n, c, oh, ow] and u32 argmax indices into each h*w plane (first maximum).
//   max_pool2d_backward: src holds the gradient [n, c, oh, ow] and out_index the argmax indices;
//               one invocation per input pixel sums, in window order, the gradients of the
//               windows covering it whose maximum it was (a gather: no atomics, deterministic).
// im2col and col2im read and write bf16 in its packed words; max pooling is f32 and f16 only
// (the host hands it f32 copies of bf16).
// params: [total, n, c, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, oh, ow]

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;
@group(0) @binding(3) var<storage, read_write> out_index: array<u32>;

struct Geometry {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    stride: vec2<u32>,
    pad: vec2<u32>,
    dil: vec2<u32>,
    oh: u32,
    ow: u32,
}

fn geometry() -> Geometry {
    return Geometry(params[1], params[2], params[3], params[4], params[5], params[6], vec2<u32>(params[7], params[8]),
        vec2<u32>(params[9], params[10]), vec2<u32>(params[11], params[12]), params[13], params[14]);
}

// Output pixel `col` of the columns as (image, oy, ox).
fn output_pixel(col: u32, g: Geometry) -> vec3<u32> {
    return vec3<u32>(col / (g.oh * g.ow), (col / g.ow) % g.oh, col % g.ow);
}

// The image value that output pixel `p` reads in channel ch at tap (ki, kj); src is the image.
fn im2col_tap(p: vec3<u32>, ch: u32, ki: u32, kj: u32, g: Geometry) -> f32 {
    // Signed: taps left of or above the image fall in the padding.
    let iy = i32(p.y * g.stride.x + ki * g.dil.x) - i32(g.pad.x);
    let ix = i32(p.z * g.stride.y + kj * g.dil.y) - i32(g.pad.y);
    let inside = iy >= 0 && iy < i32(g.h) && ix >= 0 && ix < i32(g.w);
    let at = min(((p.x * g.c + ch) * g.h + u32(max(iy, 0))) * g.w + u32(max(ix, 0)), arrayLength(&src) * T_PER_WORD - 1u);
    return select(0.0, T_load(src[T_word(at)], at), inside);
}

// One invocation per channel and storage word of a column row (one pixel, or two of bf16: the
// host sends bf16 here only when a row holds whole words, n*oh*ow even).
@compute @workgroup_size(256)
fn im2col(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = geometry();
    let cols = g.n * g.oh * g.ow;
    let row_words = cols / T_PER_WORD;
    let w = flat_index(gid, groups);
    if (w >= g.c * row_words) {
        return;
    }
    let ch = w / row_words;
    let first = (w % row_words) * T_PER_WORD;
    let p = output_pixel(first, g);
    let next = output_pixel(min(first + 1u, cols - 1u), g);
    for (var ki = 0u; ki < g.kh; ki++) {
        for (var kj = 0u; kj < g.kw; kj++) {
            var second = 0.0;
            if (T_PER_WORD == 2u) {
                second = im2col_tap(next, ch, ki, kj, g);
            }
            let at = ((ch * g.kh + ki) * g.kw + kj) * cols + first;
            out[T_word(at)] = T_pack(im2col_tap(p, ch, ki, kj, g), second);
        }
    }
}

// The output row (or column) whose tap at offset t from its origin reads this pixel: t / stride
// where the stride divides t, else none (u32 max). Stride 1, the common case, needs no division.
fn tap_source(t: i32, stride: u32) -> u32 {
    if (t < 0) {
        return 0xffffffffu;
    }
    if (stride == 1u) {
        return u32(t);
    }
    let q = u32(t) / stride;
    return select(0xffffffffu, q, q * stride == u32(t));
}

// Image element e, the sum of the columns that read it; src holds the columns.
fn col2im_at(e: u32, g: Geometry) -> f32 {
    let cols = g.n * g.oh * g.ow;
    let x = e % g.w;
    let y = (e / g.w) % g.h;
    let ch = (e / (g.w * g.h)) % g.c;
    let img = e / (g.w * g.h * g.c);
    var acc = 0.0;
    for (var ki = 0u; ki < g.kh; ki++) {
        let oy = tap_source(i32(y + g.pad.x) - i32(ki * g.dil.x), g.stride.x);
        if (oy >= g.oh) {
            continue;
        }
        let pixel_row = (img * g.oh + oy) * g.ow;
        for (var kj = 0u; kj < g.kw; kj++) {
            let ox = tap_source(i32(x + g.pad.y) - i32(kj * g.dil.y), g.stride.y);
            if (ox >= g.ow) {
                continue;
            }
            let i = ((ch * g.kh + ki) * g.kw + kj) * cols + pixel_row + ox;
            acc += T_load(src[T_word(i)], i);
        }
    }
    return acc;
}

// col2im writes a storage word per invocation: one element, or two of bf16.
@compute @workgroup_size(256)
fn col2im(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    let g = geometry();
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = col2im_at(first + 1u, g);
    }
    out[w] = T_pack(col2im_at(first, g), second);
}

@compute @workgroup_size(256)
fn max_pool2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e >= params[0]) {
        return;
    }
    let g = geometry();
    let ox = e % g.ow;
    let oy = (e / g.ow) % g.oh;
    let plane = e / (g.ow * g.oh);
    var best = -f32_inf();
    var best_index = 0xffffffffu;
    for (var ki = 0u; ki < g.kh; ki++) {
        let iy = i32(oy * g.stride.x + ki) - i32(g.pad.x);
        for (var kj = 0u; kj < g.kw; kj++) {
            let ix = i32(ox * g.stride.y + kj) - i32(g.pad.y);
            if (iy < 0 || iy >= i32(g.h) || ix < 0 || ix >= i32(g.w)) {
                continue;
            }
            let index = u32(iy) * g.w + u32(ix);
            let v = f32(src[plane * g.h * g.w + index]);
            if (best_index == 0xffffffffu || (!is_nan(best) && (is_nan(v) || v > best))) {
                best = v;
                best_index = index;
            }
        }
    }
    out[e] = T(best);
    out_index[e] = best_index;
}

// The first and last window (along one axis) whose taps cover input coordinate `y`, as a
// signed pair (last < first when none does).
fn covering(y: u32, pad: u32, k: u32, stride: u32, count: u32) -> vec2<i32> {
    let t = i32(y + pad);
    let last = min(t / i32(stride), i32(count) - 1);
    let reach = t - i32(k) + 1;
    let first = select(0, (reach + i32(stride) - 1) / i32(stride), reach > 0);
    return vec2<i32>(first, last);
}

@compute @workgroup_size(256)
fn max_pool2d_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = flat_index(gid, groups);
    if (e >= params[0]) {
        return;
    }
    let g = geometry();
    let x = e % g.w;
    let y = (e / g.w) % g.h;
    let plane = e / (g.w * g.h);
    let me = y * g.w + x;
    let rows = covering(y, g.pad.x, g.kh, g.stride.x, g.oh);
    let cols = covering(x, g.pad.y, g.kw, g.stride.y, g.ow);
    var acc = 0.0;
    for (var oy = rows.x; oy <= rows.y; oy++) {
        for (var ox = cols.x; ox <= cols.y; ox++) {
            let o = (plane * g.oh + u32(oy)) * g.ow + u32(ox);
            if (out_index[o] == me) {
                acc += f32(src[o]);
            }
        }
    }
    out[e] = T(acc);
}
