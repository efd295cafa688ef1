// Convolutions (one group, contiguous NCHW) as implicit GEMM: the products of a convolution and
// of its two gradients, tiled as matmul.wgsl's `matmul` (a 16x16 workgroup computes a 64x64 block,
// each invocation 4x4, through k-major 64x16 tiles of vec4s in workgroup memory), except that
// staging gathers the im2col operand straight from the image or the gradient: no column matrix
// is ever written, and no col2im scatters one back.
//
// PRODUCT (a pipeline constant) says which product, out[m, n] = sum over k of lhs * rhs:
//   FORWARD     out [o, n*oh*ow]      = weight [o, c*kh*kw] @ im2col(x)        (lhs weight, rhs x)
//   INPUT_GRAD  out [n, c, h, w]      = weight^T @ grad, gathered per pixel   (lhs weight, rhs grad)
//               m = c, n = n*h*w, k = (o, ki, kj): each input pixel sums the outputs whose taps
//               read it (a gather, no atomics), the stride's skipped taps masked to 0
//   WEIGHT_GRAD out [o, c*kh*kw]      = grad [o, n*oh*ow] @ im2col(x)^T         (lhs grad, rhs x)
// Each output sums its k in order, one fma a k, so a product's bits depend on the shape alone.
// `conv_gemm_split` sums chunks of k (params[3]) into f32 partials [split, m, n], which
// matmul.wgsl's `matmul_split_sum` adds up in split order (FORWARD and WEIGHT_GRAD only, whose
// outputs are [m, n] row-major).
// Each column of the block decodes its place once, each k step its tap once (shared by the four
// columns an invocation stages), so a gathered element costs an add and a bounds test, not the
// divisions of decoding it from scratch.
// bf16 is read from its packed words and written two columns a word: the host sends bf16 here
// only where a pair never straddles two rows (n even; for INPUT_GRAD, h*w even).
// The module is compiled *unchecked*, as matmul.wgsl is (pipelines.rs, SELF_BOUNDED): every read
// of lhs and rhs is clamped into the operand by min (what lies outside is masked to 0; the host
// never dispatches with an empty operand or k), workgroup-memory and register indices are in
// range by construction, every divisor is a size the host validated nonzero, and each write is
// guarded by the output's shape.
// params: [m, n, k, k chunk, images, c, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h,
//          dil_w, oh, ow]

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

const FORWARD: u32 = 0u;
const INPUT_GRAD: u32 = 1u;
const WEIGHT_GRAD: u32 = 2u;
override PRODUCT: u32 = FORWARD;

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

// [TILE_K][TILE / 4] each: lhs_tile[k][row / 4], rhs_tile[k][col / 4].
var<workgroup> lhs_tile: array<vec4<f32>, 256>;
var<workgroup> rhs_tile: array<vec4<f32>, 256>;

struct Geometry {
    images: u32,
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
    return Geometry(params[4], params[5], params[6], params[7], params[8], params[9], vec2<u32>(params[10], params[11]),
        vec2<u32>(params[12], params[13]), vec2<u32>(params[14], params[15]), params[16], params[17]);
}

// One column of the product, decoded once: where its gather starts in rhs and the (y, x) its
// taps offset from (signed: padding lies left of and above the image).
struct Column {
    base: u32,
    y: i32,
    x: i32,
    inside: bool,
}

// One k of the product, decoded once a step: its offset within a row of lhs, its offset in rhs
// and the (y, x) it adds to a column's origin.
struct Step {
    lhs: u32,
    rhs: u32,
    dy: i32,
    dx: i32,
    inside: bool,
}

// (x / d, x % d) by one division: integer division is the costliest step of decoding an index
// (a CPU adapter such as lavapipe has no vector form of it).
fn divide(x: u32, d: u32) -> vec2<u32> {
    let q = x / d;
    return vec2<u32>(q, x - q * d);
}

// (t / kw, t % kw) of tap t scaled by the dilation: the tap's (dy, dx).
fn tap_offset(t: u32, g: Geometry) -> vec2<i32> {
    let at = divide(t, g.kw);
    return vec2<i32>(at * g.dil);
}

fn column(col: u32, g: Geometry) -> Column {
    let at = min(col, params[1] - 1u);
    let inside = col < params[1];
    if (PRODUCT == FORWARD) {
        // (image, oy, ox): the image's first pixel, the window's top left corner.
        let p = divide(at, g.oh * g.ow);
        let corner = vec2<i32>(divide(p.y, g.ow) * g.stride) - vec2<i32>(g.pad);
        return Column(p.x * g.c * g.h * g.w, corner.x, corner.y, inside);
    }
    if (PRODUCT == INPUT_GRAD) {
        // (image, y, x): the image's first gradient pixel, the pixel padded.
        let p = divide(at, g.h * g.w);
        let padded = vec2<i32>(divide(p.y, g.w) + g.pad);
        return Column(p.x * g.oh * g.ow, padded.x, padded.y, inside);
    }
    // WEIGHT_GRAD, (channel, ki, kj): the channel's plane, the tap's offset from a window's corner.
    let t = divide(at, g.kh * g.kw);
    let reach = tap_offset(t.y, g) - vec2<i32>(g.pad);
    return Column(t.x * g.h * g.w, reach.x, reach.y, inside);
}

fn step(kk: u32, k_end: u32, g: Geometry) -> Step {
    let at = min(kk, k_end - 1u);
    let inside = kk < k_end;
    let taps = g.kh * g.kw;
    if (PRODUCT == FORWARD) {
        // (channel, ki, kj)
        let t = divide(at, taps);
        let d = tap_offset(t.y, g);
        return Step(at, t.x * g.h * g.w, d.x, d.y, inside);
    }
    if (PRODUCT == INPUT_GRAD) {
        // (o, ki, kj): weight [o, c, kh, kw] read as [c, o*kh*kw]; the tap's reach back from a pixel.
        let t = divide(at, taps);
        let d = tap_offset(t.y, g);
        return Step(t.x * g.c * taps + t.y, t.x * g.images * g.oh * g.ow, -d.x, -d.y, inside);
    }
    // WEIGHT_GRAD, (image, oy, ox)
    let p = divide(at, g.oh * g.ow);
    let d = vec2<i32>(divide(p.y, g.ow) * g.stride);
    return Step(at, p.x * g.c * g.h * g.w, d.x, d.y, inside);
}

// The stride of lhs' rows: k, but kh*kw for INPUT_GRAD (whose rows are the weight's channels).
fn lhs_row_stride(g: Geometry) -> u32 {
    if (PRODUCT == INPUT_GRAD) {
        return g.kh * g.kw;
    }
    return params[2];
}

fn lhs_value(i: u32) -> f32 {
    return T_load(lhs[T_word(i)], i);
}

// The output row (column) whose tap at offset t from its origin reaches this pixel: t / stride
// where the stride divides t and the row exists, else -1. Stride 1, the common case, needs no
// division.
fn tap_source(t: i32, stride: u32, count: u32) -> i32 {
    if (stride == 1u) {
        return select(-1, t, t >= 0 && t < i32(count));
    }
    let q = t / i32(stride);
    return select(-1, q, t >= 0 && q * i32(stride) == t && q < i32(count));
}

// rhs at (step, column): the image pixel a tap reads (FORWARD, WEIGHT_GRAD) or the gradient of
// the output a tap reaches (INPUT_GRAD); 0 in the padding, past the stride's taps or outside.
fn rhs_value(c: Column, s: Step, g: Geometry) -> f32 {
    var i: u32;
    var inside: bool;
    if (PRODUCT == INPUT_GRAD) {
        let oy = tap_source(c.y + s.dy, g.stride.x, g.oh);
        let ox = tap_source(c.x + s.dx, g.stride.y, g.ow);
        inside = oy >= 0 && ox >= 0;
        i = c.base + s.rhs + u32(max(oy, 0)) * g.ow + u32(max(ox, 0));
    } else {
        let iy = c.y + s.dy;
        let ix = c.x + s.dx;
        inside = iy >= 0 && iy < i32(g.h) && ix >= 0 && ix < i32(g.w);
        i = c.base + s.rhs + u32(max(iy, 0)) * g.w + u32(max(ix, 0));
    }
    let at = min(i, arrayLength(&rhs) * T_PER_WORD - 1u);
    return select(0.0, T_load(rhs[T_word(at)], at), inside && c.inside && s.inside);
}

// Invocation (lid, flat)'s 4x4 share of the TILE x TILE block at (row0, col0), summed over k in
// [k_begin, k_end). The whole workgroup must call it (it holds barriers).
fn block_product(row0: u32, col0: u32, k_begin: u32, k_end: u32, lid: vec3<u32>, flat: u32) -> array<vec4<f32>, 4> {
    let g = geometry();
    // Staging: invocation `flat` fills one vec4 of each tile (4 rows of lhs, 4 columns of rhs).
    let stage_k = flat / 16u;
    let stage_quad = (flat % 16u) * 4u;
    var lhs_start: vec4<u32>;
    var lhs_inside: vec4<bool>;
    var cols: array<Column, 4>;
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + stage_quad + i;
        lhs_start[i] = min(row, params[0] - 1u) * lhs_row_stride(g);
        lhs_inside[i] = row < params[0];
        cols[i] = column(col0 + stage_quad + i, g);
    }
    let lhs_last = arrayLength(&lhs) * T_PER_WORD - 1u;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = k_begin; k0 < k_end; k0 += TILE_K) {
        let s = step(k0 + stage_k, k_end, g);
        let li = min(lhs_start + vec4<u32>(s.lhs), vec4<u32>(lhs_last));
        lhs_tile[flat] = select(
            vec4<f32>(0.0),
            vec4<f32>(lhs_value(li.x), lhs_value(li.y), lhs_value(li.z), lhs_value(li.w)),
            lhs_inside & vec4<bool>(s.inside),
        );
        rhs_tile[flat] = vec4<f32>(rhs_value(cols[0], s, g), rhs_value(cols[1], s, g), rhs_value(cols[2], s, g),
            rhs_value(cols[3], s, g));
        workgroupBarrier();
        for (var t = 0u; t < TILE_K; t++) {
            let a = lhs_tile[t * 16u + lid.y];
            let r = rhs_tile[t * 16u + lid.x];
            acc[0] = fma(vec4<f32>(a.x), r, acc[0]);
            acc[1] = fma(vec4<f32>(a.y), r, acc[1]);
            acc[2] = fma(vec4<f32>(a.z), r, acc[2]);
            acc[3] = fma(vec4<f32>(a.w), r, acc[3]);
        }
        workgroupBarrier();
    }
    return acc;
}

// The (split, first row, first column) of workgroup wid's block, blocks numbered along n, then m.
fn block_origin(wid: vec3<u32>, groups: vec3<u32>) -> vec3<u32> {
    let blocks_n = (params[1] + TILE - 1u) / TILE;
    let blocks = blocks_n * ((params[0] + TILE - 1u) / TILE);
    let block = wid.x + wid.y * groups.x;
    let in_split = block % blocks;
    return vec3<u32>(block / blocks, in_split / blocks_n * TILE, in_split % blocks_n * TILE);
}

// Where out[row, col] of the product lives: [m, n] row-major, or NCHW for INPUT_GRAD.
fn out_index(row: u32, col: u32, g: Geometry) -> u32 {
    if (PRODUCT == INPUT_GRAD) {
        let plane = g.h * g.w;
        return ((col / plane) * g.c + row) * plane + col % plane;
    }
    return row * params[1] + col;
}

struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) flat: u32,
}

@compute @workgroup_size(16, 16)
fn conv_gemm(at: Invocation) {
    let origin = block_origin(at.wid, at.groups);
    // Uniform across the workgroup, so no invocation is left waiting at a barrier.
    if (origin.x >= 1u) {
        return;
    }
    let acc = block_product(origin.y, origin.z, 0u, params[2], at.lid, at.flat);
    let g = geometry();
    for (var i = 0u; i < 4u; i++) {
        let row = origin.y + at.lid.y * 4u + i;
        for (var j = 0u; j < 4u; j += T_PER_WORD) {
            let col = origin.z + at.lid.x * 4u + j;
            if (row < params[0] && col < params[1]) {
                out[T_word(out_index(row, col, g))] = T_pack(acc[i][j], acc[i][min(j + 1u, 3u)]);
            }
        }
    }
}

@compute @workgroup_size(16, 16)
fn conv_gemm_split(at: Invocation) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let chunk = params[3];
    let origin = block_origin(at.wid, at.groups);
    if (origin.x >= (k + chunk - 1u) / chunk) {
        return;
    }
    let k_begin = origin.x * chunk;
    let acc = block_product(origin.y, origin.z, k_begin, min(k, k_begin + chunk), at.lid, at.flat);
    for (var i = 0u; i < 4u; i++) {
        let row = origin.y + at.lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = origin.z + at.lid.x * 4u + j;
            if (row < m && col < n) {
                partials[(origin.x * m + row) * n + col] = acc[i][j];
            }
        }
    }
}
