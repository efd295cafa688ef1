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
// `matmul_naive` (one invocation per output, no reuse) is kept as the benchmark's baseline.
// All number their output blocks along n, then m, then the batch (then the split), on a grid that
// spills from x into y past 65535 workgroups (an im2col GEMM's n reaches millions).
// params: [m, n, k, lhs offset, lhs batch/m/k strides, rhs offset, rhs batch/k/n strides, batch,
//          k chunk (k or more when unsplit)]

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

// The (split * batch + batch index, first row, first column) of the `edge` x `edge` output block
// of workgroup `wid`; the first is splits * batch or more for the workgroups past the last block.
fn block_origin(wid: vec3<u32>, groups: vec3<u32>, edge: u32) -> vec3<u32> {
    let blocks_n = (params[1] + edge - 1u) / edge;
    let blocks_m = (params[0] + edge - 1u) / edge;
    let block = wid.x + wid.y * groups.x;
    let in_batch = block % (blocks_n * blocks_m);
    return vec3<u32>(block / (blocks_n * blocks_m), in_batch / blocks_n * edge, in_batch % blocks_n * edge);
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
