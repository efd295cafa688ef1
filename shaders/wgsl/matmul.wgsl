// matmul: out[b] = lhs[b] @ rhs[b], lhs [batch, m, k] and rhs [batch, k, n] with any strides
// (transposes and broadcast batches cost no copy), out contiguous [batch, m, n].
//
// `matmul` is tiled: a 16x16 workgroup computes a 64x64 block of the output, each invocation a
// 4x4 register block, staging 64x16 slices of lhs and 16x64 slices of rhs through workgroup
// memory so each loaded value is used 64 times; the inner step is two vec4 loads and four vec4
// FMAs. Accumulates in f32 for every `T`; bf16 operands are read from their packed words, and a
// bf16 product is written two columns to a word.
// `matmul_split` splits k into chunks of params[12] (split-K): a product with few output blocks
// and a long k (a convolution's weight gradient: 64 x 576 outputs summed over a batch's pixels,
// 9 blocks where a GPU runs hundreds) gives each chunk its own workgroups, which write f32 partial
// products; `matmul_split_sum` adds them up in split order (deterministic) and writes `out`.
// `matmul_wide` and `matmul_wide_split` are the same products over 128x128 blocks, or 64x128
// (WIDE_ROWS = 64), double-buffered and staged along each operand's contiguous axis (see the
// section "128x128 blocks" below); each output sums its k in the same order as in `matmul`, one
// fma a k, so all give the same bits for the same split (which the host chooses by 64x64 blocks
// whichever kernel runs).
// `matmul_naive` (one invocation per output, no reuse) is kept as the benchmark's baseline.
// All number their output blocks along n, then m, then the batch (then the split), on a grid that
// spills from x into y past 65535 workgroups (an im2col GEMM's n reaches millions).
// params: [m, n, k, lhs offset, lhs batch/m/k strides, rhs offset, rhs batch/k/n strides, batch,
//          k chunk (k or more when unsplit)]
//
// The module is compiled *unchecked* (no runtime index clamps, no loop bounding: pipelines.rs,
// SELF_BOUNDED), so it bounds every index itself, for any shape: each read of an operand clamps
// its row, column and k into the operand by min (what lies outside is masked to 0, and an empty
// k reads nothing), workgroup-memory and accumulator indices are in range by construction, and
// each write to `out` or `partials` is guarded by the output's shape.

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;
// [split, batch, m, n]: each split's product over its chunk of k.
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

// Both tiles are stored k-major in vec4 columns so an invocation reads its 4 rows of lhs and its
// 4 columns of rhs with one load each: lhs_tile[k][row / 4], rhs_tile[k][col / 4].
var<workgroup> lhs_tile: array<vec4<f32>, 256>; // [TILE_K][TILE / 4]
var<workgroup> rhs_tile: array<vec4<f32>, 256>; // [TILE_K][TILE / 4]

// Elements by storage index.
fn lhs_value(i: u32) -> f32 {
    return T_load(lhs[T_word(i)], i);
}

fn rhs_value(i: u32) -> f32 {
    return T_load(rhs[T_word(i)], i);
}

fn lhs_at(b: u32, row: u32, col: u32) -> f32 {
    return lhs_value(params[3] + b * params[4] + row * params[5] + col * params[6]);
}

fn rhs_at(b: u32, row: u32, col: u32) -> f32 {
    return rhs_value(params[7] + b * params[8] + row * params[9] + col * params[10]);
}

// The (split * batch + batch index, first row, first column) of the `rows` x `cols` output block
// of workgroup `wid`; the first is splits * batch or more for the workgroups past the last block.
fn block_origin_of(wid: vec3<u32>, groups: vec3<u32>, rows: u32, cols: u32) -> vec3<u32> {
    let blocks_n = (params[1] + cols - 1u) / cols;
    let blocks_m = (params[0] + rows - 1u) / rows;
    let block = wid.x + wid.y * groups.x;
    let in_batch = block % (blocks_n * blocks_m);
    return vec3<u32>(block / (blocks_n * blocks_m), in_batch / blocks_n * rows, in_batch % blocks_n * cols);
}

// The same for a square block.
fn block_origin(wid: vec3<u32>, groups: vec3<u32>, edge: u32) -> vec3<u32> {
    return block_origin_of(wid, groups, edge, edge);
}

// Invocation (lid, flat)'s 4x4 share of the TILE x TILE block at (row0, col0) of lhs[b] @ rhs[b],
// summed over k in [k_begin, k_end). The whole workgroup must call it (it holds barriers).
fn block_product(b: u32, row0: u32, col0: u32, k_begin: u32, k_end: u32, lid: vec3<u32>, flat: u32) -> array<vec4<f32>, 4> {
    // Staging: invocation `flat` fills one vec4 of each tile (4 rows of lhs, 4 columns of rhs).
    let stage_k = flat / 16u;
    let stage_quad = (flat % 16u) * 4u;
    // Where those rows and columns start (clamped into the matrices; what lies outside is masked
    // to 0), so a k step adds one offset instead of finding each element's index afresh.
    var lhs_start: vec4<u32>;
    var rhs_start: vec4<u32>;
    var lhs_inside: vec4<bool>;
    var rhs_inside: vec4<bool>;
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + stage_quad + i;
        let col = col0 + stage_quad + i;
        lhs_start[i] = params[3] + b * params[4] + min(row, params[0] - 1u) * params[5];
        rhs_start[i] = params[7] + b * params[8] + min(col, params[1] - 1u) * params[10];
        lhs_inside[i] = row < params[0];
        rhs_inside[i] = col < params[1];
    }
    var acc: array<vec4<f32>, 4>;
    for (var k0 = k_begin; k0 < k_end; k0 += TILE_K) {
        let kk = k0 + stage_k;
        let k_inside = vec4<bool>(kk < k_end);
        let k_at = min(kk, k_end - 1u);
        let li = lhs_start + vec4<u32>(k_at * params[6]);
        let ri = rhs_start + vec4<u32>(k_at * params[9]);
        lhs_tile[flat] = select(
            vec4<f32>(0.0),
            vec4<f32>(lhs_value(li.x), lhs_value(li.y), lhs_value(li.z), lhs_value(li.w)),
            lhs_inside & k_inside,
        );
        rhs_tile[flat] = select(
            vec4<f32>(0.0),
            vec4<f32>(rhs_value(ri.x), rhs_value(ri.y), rhs_value(ri.z), rhs_value(ri.w)),
            rhs_inside & k_inside,
        );
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

// What the tiled entry points know of their invocation.
struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) flat: u32,
}

@compute @workgroup_size(16, 16)
fn matmul(at: Invocation) {
    let m = params[0];
    let n = params[1];
    let origin = block_origin(at.wid, at.groups, TILE);
    // Uniform across the workgroup, so no invocation is left waiting at a barrier.
    if (origin.x >= params[11]) {
        return;
    }
    let b = origin.x;
    let acc = block_product(b, origin.y, origin.z, 0u, params[2], at.lid, at.flat);
    // A word at a time: for bf16 two neighbouring columns (the host sends bf16 here only for an
    // even n, so a pair never straddles two rows).
    for (var i = 0u; i < 4u; i++) {
        let row = origin.y + at.lid.y * 4u + i;
        for (var j = 0u; j < 4u; j += T_PER_WORD) {
            let col = origin.z + at.lid.x * 4u + j;
            if (row < m && col < n) {
                out[T_word((b * m + row) * n + col)] = T_pack(acc[i][j], acc[i][min(j + 1u, 3u)]);
            }
        }
    }
}

@compute @workgroup_size(16, 16)
fn matmul_split(at: Invocation) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let chunk = params[12];
    let origin = block_origin(at.wid, at.groups, TILE);
    if (origin.x >= params[11] * ((k + chunk - 1u) / chunk)) {
        return;
    }
    let k_begin = (origin.x / params[11]) * chunk;
    let acc = block_product(origin.x % params[11], origin.y, origin.z, k_begin, min(k, k_begin + chunk), at.lid, at.flat);
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

// ---- 128x128 blocks ----
// A 16x16 workgroup computes a 128x128 block, each invocation an 8x8 share as 2x2 groups of 4x4:
// rows lid.y * 4 + {0..3} and 64 + lid.y * 4 + {0..3}, columns likewise by lid.x, so a warp's
// reads of workgroup memory are 16 neighbouring vec4s of rhs and two (broadcast) vec4s of lhs,
// and each invocation does 64 FMAs per four vec4 loads. With WIDE_ROWS = 64 the block is 64x128
// (for outputs of 64 rows, which 128 would pad to twice their size) and the share 4x8.
// k advances WIDE_K (8, or 16 where the device has 32 KiB of workgroup memory) at a time through
// two buffers of each tile: while the workgroup multiplies out one, each invocation loads its
// share of the next k slice into registers and stores it into the other buffer, so a k step has
// one barrier and its global loads overlap the arithmetic.
// Both tiles are k-major: vec4s of 4 of the block's rows (lhs, transposed as it is staged) or of
// 4 of its columns (rhs). Staging reads each operand along the axis the host found contiguous:
// along k (LHS_ALONG_K / RHS_ALONG_K: 8 invocations read 8 neighbouring k of one row or column),
// else along m or n (128 invocations read 128 neighbouring rows or columns of one k); either way
// a warp reads whole sectors where that axis is contiguous, and any other layout still works.
// Vec4 q of a tile's k step t is stored at q ^ t (which stays within q's group of 16), so the 8 k
// of 4 rows that a warp stores when reading along k fall on 32 different banks, not 4 (with 16 k,
// 2 rows of 16 k on 16 banks, twice).

const WIDE: u32 = 128u;

override WIDE_ROWS: u32 = 128u;
override WIDE_K: u32 = 8u;
override LHS_ALONG_K: bool = false;
override RHS_ALONG_K: bool = false;
// vec4s in one buffer of a tile: WIDE_K x WIDE / 4.
override WIDE_BUFFER: u32 = WIDE_K * (WIDE / 4u);

// [2 buffers][WIDE_K][WIDE / 4]: 16 KiB in all (WebGPU's default limit) with WIDE_K = 8.
var<workgroup> lhs_wide: array<vec4<f32>, 2u * WIDE_BUFFER>;
var<workgroup> rhs_wide: array<vec4<f32>, 2u * WIDE_BUFFER>;

// The (row or column within the block, k within the step) of the j-th of the `edges` * WIDE_K /
// 256 elements an invocation stages of one operand a k step.
fn wide_stage_at(along_k: bool, edges: u32, flat: u32, j: u32) -> vec2<u32> {
    if (along_k) {
        return vec2<u32>(flat / WIDE_K + (256u / WIDE_K) * j, flat % WIDE_K);
    }
    return vec2<u32>(flat % edges, flat / edges + (256u / edges) * j);
}

// The lhs and rhs elements an invocation stages a k step: at most 8 each.
fn wide_lhs_count() -> u32 {
    return WIDE_ROWS * WIDE_K / 256u;
}

fn wide_rhs_count() -> u32 {
    return WIDE * WIDE_K / 256u;
}

// Where element (edge, t) of a tile lives within a buffer: its vec4 (swizzled) and component.
fn wide_slot(at: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(at.y * (WIDE / 4u) + ((at.x / 4u) ^ at.y), at.x % 4u);
}

// One operand's share of staging for one invocation: where the rows (columns) of its elements
// start in the operand, clamped inside it, and whether they lie inside the output. (Their k and
// their place in a tile follow from `flat` alone: `wide_stage_at`, recomputed where used rather
// than held in registers.)
struct WideStage {
    start: array<u32, 8>,
    inside: array<bool, 8>,
}

// One operand's staged elements of one k step.
alias WideSlice = array<f32, 8>;

// `block` is the block's rows (columns), `count` the elements staged, `edges` m (n), `view` the
// params index of the operand's offset (its batch stride follows), `edge_stride` its stride along
// m (n).
fn wide_stage(along_k: bool, block: u32, count: u32, flat: u32, b: u32, first: u32, edges: u32, view: u32, edge_stride: u32) -> WideStage {
    var s: WideStage;
    for (var j = 0u; j < count; j++) {
        let edge = first + wide_stage_at(along_k, block, flat, j).x;
        s.start[j] = params[view] + b * params[view + 1u] + min(edge, edges - 1u) * edge_stride;
        s.inside[j] = edge < edges;
    }
    return s;
}

// The staged elements of lhs (rhs) at k step k0, 0 outside the operand or past k_end.
fn wide_lhs_slice(s: WideStage, flat: u32, k0: u32, k_end: u32) -> WideSlice {
    var v: WideSlice;
    for (var j = 0u; j < wide_lhs_count(); j++) {
        let kk = k0 + wide_stage_at(LHS_ALONG_K, WIDE_ROWS, flat, j).y;
        let x = lhs_value(s.start[j] + min(kk, k_end - 1u) * params[6]);
        v[j] = select(0.0, x, s.inside[j] && kk < k_end);
    }
    return v;
}

fn wide_rhs_slice(s: WideStage, flat: u32, k0: u32, k_end: u32) -> WideSlice {
    var v: WideSlice;
    for (var j = 0u; j < wide_rhs_count(); j++) {
        let kk = k0 + wide_stage_at(RHS_ALONG_K, WIDE, flat, j).y;
        let x = rhs_value(s.start[j] + min(kk, k_end - 1u) * params[9]);
        v[j] = select(0.0, x, s.inside[j] && kk < k_end);
    }
    return v;
}

// Stores the staged slices into the tile buffer at `buffer`.
fn wide_store(flat: u32, lv: WideSlice, rv: WideSlice, buffer: u32) {
    for (var j = 0u; j < wide_lhs_count(); j++) {
        let l = wide_slot(wide_stage_at(LHS_ALONG_K, WIDE_ROWS, flat, j));
        lhs_wide[buffer + l.x][l.y] = lv[j];
    }
    for (var j = 0u; j < wide_rhs_count(); j++) {
        let r = wide_slot(wide_stage_at(RHS_ALONG_K, WIDE, flat, j));
        rhs_wide[buffer + r.x][r.y] = rv[j];
    }
}

// Invocation (lid, flat)'s 8x8 share of the WIDE x WIDE block at (row0, col0) of lhs[b] @ rhs[b],
// summed over k in [k_begin, k_end): acc[2 * r + h] holds the 4 columns of column group h (h * 64
// + lid.x * 4 onwards) in row r of its 8 (r / 4 * 64 + lid.y * 4 + r % 4; the first 4 rows in a
// 64-row block). The whole workgroup must call it (it holds barriers).
fn wide_block_product(b: u32, row0: u32, col0: u32, k_begin: u32, k_end: u32, lid: vec3<u32>, flat: u32) -> array<vec4<f32>, 16> {
    var acc: array<vec4<f32>, 16>;
    // Uniform across the workgroup; an empty k (k = 0) reads nothing.
    if (k_end <= k_begin) {
        return acc;
    }
    let l = wide_stage(LHS_ALONG_K, WIDE_ROWS, wide_lhs_count(), flat, b, row0, params[0], 3u, params[5]);
    let r = wide_stage(RHS_ALONG_K, WIDE, wide_rhs_count(), flat, b, col0, params[1], 7u, params[10]);
    wide_store(flat, wide_lhs_slice(l, flat, k_begin, k_end), wide_rhs_slice(r, flat, k_begin, k_end), 0u);
    workgroupBarrier();
    let steps = (k_end - k_begin + WIDE_K - 1u) / WIDE_K;
    for (var s = 0u; s < steps; s++) {
        let current = (s % 2u) * WIDE_BUFFER;
        let more = s + 1u < steps;
        // The next step's slice, loaded before this one's arithmetic so the two overlap.
        var lv: WideSlice;
        var rv: WideSlice;
        if (more) {
            let k0 = k_begin + (s + 1u) * WIDE_K;
            lv = wide_lhs_slice(l, flat, k0, k_end);
            rv = wide_rhs_slice(r, flat, k0, k_end);
        }
        for (var t = 0u; t < WIDE_K; t++) {
            let at = current + t * (WIDE / 4u);
            let a0 = lhs_wide[at + (lid.y ^ t)];
            let b0 = rhs_wide[at + (lid.x ^ t)];
            let b1 = rhs_wide[at + 16u + (lid.x ^ t)];
            acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
            acc[1] = fma(vec4<f32>(a0.x), b1, acc[1]);
            acc[2] = fma(vec4<f32>(a0.y), b0, acc[2]);
            acc[3] = fma(vec4<f32>(a0.y), b1, acc[3]);
            acc[4] = fma(vec4<f32>(a0.z), b0, acc[4]);
            acc[5] = fma(vec4<f32>(a0.z), b1, acc[5]);
            acc[6] = fma(vec4<f32>(a0.w), b0, acc[6]);
            acc[7] = fma(vec4<f32>(a0.w), b1, acc[7]);
            // (A pipeline constant: compiled out of a 64-row block.)
            if (WIDE_ROWS == WIDE) {
                let a1 = lhs_wide[at + 16u + (lid.y ^ t)];
                acc[8] = fma(vec4<f32>(a1.x), b0, acc[8]);
                acc[9] = fma(vec4<f32>(a1.x), b1, acc[9]);
                acc[10] = fma(vec4<f32>(a1.y), b0, acc[10]);
                acc[11] = fma(vec4<f32>(a1.y), b1, acc[11]);
                acc[12] = fma(vec4<f32>(a1.z), b0, acc[12]);
                acc[13] = fma(vec4<f32>(a1.z), b1, acc[13]);
                acc[14] = fma(vec4<f32>(a1.w), b0, acc[14]);
                acc[15] = fma(vec4<f32>(a1.w), b1, acc[15]);
            }
        }
        // The other buffer was last read in the step before, which the barrier below it closed.
        if (more) {
            wide_store(flat, lv, rv, WIDE_BUFFER - current);
        }
        workgroupBarrier();
    }
    return acc;
}

// The output row and first column of acc[i] (see `wide_block_product`) of invocation lid in the
// block at origin.
fn wide_place(origin: vec3<u32>, lid: vec3<u32>, i: u32) -> vec2<u32> {
    return vec2<u32>(origin.y + (i / 8u) * 64u + lid.y * 4u + (i / 2u) % 4u, origin.z + (i % 2u) * 64u + lid.x * 4u);
}

// Writes acc[i] to `out` of batch origin.x, a word at a time (for bf16 two columns of an even n,
// as in `matmul`).
fn wide_out(origin: vec3<u32>, lid: vec3<u32>, i: u32, v: vec4<f32>) {
    let m = params[0];
    let n = params[1];
    let at = wide_place(origin, lid, i);
    for (var j = 0u; j < 4u; j += T_PER_WORD) {
        if (at.x < m && at.y + j < n) {
            out[T_word((origin.x * m + at.x) * n + at.y + j)] = T_pack(v[j], v[min(j + 1u, 3u)]);
        }
    }
}

// Writes acc[i] to `partials` of split and batch origin.x.
fn wide_partial(origin: vec3<u32>, lid: vec3<u32>, i: u32, v: vec4<f32>) {
    let m = params[0];
    let n = params[1];
    let at = wide_place(origin, lid, i);
    for (var j = 0u; j < 4u; j++) {
        if (at.x < m && at.y + j < n) {
            partials[(origin.x * m + at.x) * n + at.y + j] = v[j];
        }
    }
}

// All of acc (its first 8 vec4s in a 64-row block) through `wide_out` / `wide_partial`, each vec4
// by a constant index, so no loop the driver might leave rolled indexes acc (which would move it
// out of registers).
fn wide_write_out(origin: vec3<u32>, lid: vec3<u32>, acc: array<vec4<f32>, 16>) {
    wide_out(origin, lid, 0u, acc[0]);
    wide_out(origin, lid, 1u, acc[1]);
    wide_out(origin, lid, 2u, acc[2]);
    wide_out(origin, lid, 3u, acc[3]);
    wide_out(origin, lid, 4u, acc[4]);
    wide_out(origin, lid, 5u, acc[5]);
    wide_out(origin, lid, 6u, acc[6]);
    wide_out(origin, lid, 7u, acc[7]);
    if (WIDE_ROWS == WIDE) {
        wide_out(origin, lid, 8u, acc[8]);
        wide_out(origin, lid, 9u, acc[9]);
        wide_out(origin, lid, 10u, acc[10]);
        wide_out(origin, lid, 11u, acc[11]);
        wide_out(origin, lid, 12u, acc[12]);
        wide_out(origin, lid, 13u, acc[13]);
        wide_out(origin, lid, 14u, acc[14]);
        wide_out(origin, lid, 15u, acc[15]);
    }
}

fn wide_write_partials(origin: vec3<u32>, lid: vec3<u32>, acc: array<vec4<f32>, 16>) {
    wide_partial(origin, lid, 0u, acc[0]);
    wide_partial(origin, lid, 1u, acc[1]);
    wide_partial(origin, lid, 2u, acc[2]);
    wide_partial(origin, lid, 3u, acc[3]);
    wide_partial(origin, lid, 4u, acc[4]);
    wide_partial(origin, lid, 5u, acc[5]);
    wide_partial(origin, lid, 6u, acc[6]);
    wide_partial(origin, lid, 7u, acc[7]);
    if (WIDE_ROWS == WIDE) {
        wide_partial(origin, lid, 8u, acc[8]);
        wide_partial(origin, lid, 9u, acc[9]);
        wide_partial(origin, lid, 10u, acc[10]);
        wide_partial(origin, lid, 11u, acc[11]);
        wide_partial(origin, lid, 12u, acc[12]);
        wide_partial(origin, lid, 13u, acc[13]);
        wide_partial(origin, lid, 14u, acc[14]);
        wide_partial(origin, lid, 15u, acc[15]);
    }
}

@compute @workgroup_size(16, 16)
fn matmul_wide(at: Invocation) {
    let origin = block_origin_of(at.wid, at.groups, WIDE_ROWS, WIDE);
    if (origin.x >= params[11]) {
        return;
    }
    let acc = wide_block_product(origin.x, origin.y, origin.z, 0u, params[2], at.lid, at.flat);
    wide_write_out(origin, at.lid, acc);
}

@compute @workgroup_size(16, 16)
fn matmul_wide_split(at: Invocation) {
    let k = params[2];
    let chunk = params[12];
    let origin = block_origin_of(at.wid, at.groups, WIDE_ROWS, WIDE);
    if (origin.x >= params[11] * ((k + chunk - 1u) / chunk)) {
        return;
    }
    let k_begin = (origin.x / params[11]) * chunk;
    let acc = wide_block_product(origin.x % params[11], origin.y, origin.z, k_begin, min(k, k_begin + chunk), at.lid, at.flat);
    wide_write_partials(origin, at.lid, acc);
}

// out = the sum over splits of `partials`, a storage word of out per invocation.
// params: [outputs (batch * m * n), splits]
@compute @workgroup_size(256)
fn matmul_split_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let total = params[0];
    let first = flat_index(gid, groups) * T_PER_WORD;
    if (first >= total) {
        return;
    }
    // The second element of a bf16 word; past the end, the first one again (the host's buffer
    // rounds up to whole words, and that half is never read).
    var second = first;
    if (T_PER_WORD == 2u) {
        second = min(first + 1u, total - 1u);
    }
    var sums = vec2<f32>(0.0);
    for (var s = 0u; s < params[1]; s++) {
        sums += vec2<f32>(partials[s * total + first], partials[s * total + second]);
    }
    out[T_word(first)] = T_pack(sums.x, sums.y);
}

@compute @workgroup_size(16, 16)
fn matmul_naive(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let m = params[0];
    let n = params[1];
    let origin = block_origin(wid, groups, 16u);
    let b = origin.x;
    let row = origin.y + lid.y;
    let col = origin.z + lid.x;
    if (b >= params[11] || row >= m || col >= n) {
        return;
    }
    var acc = 0.0;
    for (var kk = 0u; kk < params[2]; kk++) {
        acc = fma(lhs_at(b, row, kk), rhs_at(b, kk, col), acc);
    }
    out[(b * m + row) * n + col] = T_pack(acc, 0.0);
}
