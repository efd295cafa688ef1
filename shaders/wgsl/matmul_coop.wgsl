// matmul_coop: out[b] = lhs[b] @ rhs[b] on the adapter's cooperative matrices (tensor cores on
// NVIDIA, simdgroup matrices on Apple): operands rounded to f16, sums in f32. The same params
// and strides as matmul.wgsl (any layout, broadcast batches, output contiguous), unsplit k.
// Each row of lhs and column of rhs is multiplied on the way in by its power-of-two scale from
// coop_scales.wgsl (into f16's range) and each sum by both inverses on the way out.
//
// The host composes it with the matrix edge `E_EDGE` (16 on NVIDIA, 8 on lavapipe and Apple), the
// `E_A`/`E_B`/`E_C` matrix aliases and `E_GRID`, and sets `SUBGROUP` to the adapter's one subgroup
// size. A workgroup of E_GRID x E_GRID subgroups computes a BLOCK x BLOCK output block (BLOCK =
// 2 E_GRID E_EDGE); each subgroup owns 2x2 matrices of E_EDGE of it. Invocations `SUBGROUP * w ..`
// form subgroup w: drivers fill subgroups in invocation order, and the backend's self-test at
// device open tries each grid and turns this tier off where none computes right.
//
// Every index read is clamped into its operand and every write guarded by the output's shape, so
// the module runs without wgpu's runtime checks, like matmul.wgsl.
// params: [m, n, k, lhs offset, lhs batch/m/k strides, rhs offset, rhs batch/k/n strides, batch]

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;
// (scale, 1 / scale): lhs's batch * m rows, then rhs's batch * n columns (coop_scales.wgsl).
@group(0) @binding(4) var<storage, read> scales: array<vec2<f32>>;

override SUBGROUP: u32 = 32u;

const BLOCK: u32 = 2u * E_GRID * E_EDGE;
// k staged per round: two matrix steps between barriers.
const DEPTH: u32 = 2u * E_EDGE;

var<workgroup> lhs_tile: array<f16, BLOCK * DEPTH>; // row-major [BLOCK][DEPTH]
var<workgroup> rhs_tile: array<f16, BLOCK * DEPTH>; // row-major [DEPTH][BLOCK]
// The block's sums, row-major: zeros to start the accumulators from, then the result.
var<workgroup> out_tile: array<f32, BLOCK * BLOCK>;
// The scales of the block's rows and columns.
var<workgroup> row_scales: array<vec2<f32>, BLOCK>;
var<workgroup> column_scales: array<vec2<f32>, BLOCK>;
// k, read through workgroupUniformLoad: the matrix operations must sit in control flow that is
// uniform across the workgroup, and naga does not take a storage load to be uniform.
var<workgroup> depth_k: u32;

fn lhs_element(b: u32, row: u32, col: u32, scale: f32) -> f16 {
    let inside = row < params[0] && col < params[2];
    let i = params[3] + b * params[4] + min(row, params[0] - 1u) * params[5] + min(col, params[2] - 1u) * params[6];
    return select(f16(0.0), f16(T_load(lhs[T_word(i)], i) * scale), inside);
}

fn rhs_element(b: u32, row: u32, col: u32, scale: f32) -> f16 {
    let inside = row < params[2] && col < params[1];
    let i = params[7] + b * params[8] + min(row, params[2] - 1u) * params[9] + min(col, params[1] - 1u) * params[10];
    return select(f16(0.0), f16(T_load(rhs[T_word(i)], i) * scale), inside);
}

// Element i of the block's sums, unscaled: one rounding (the product of two powers of two is
// exact wherever the result is not out of f32's range anyway).
fn unscaled(i: u32) -> f32 {
    return out_tile[i] * (row_scales[i / BLOCK].y * column_scales[i % BLOCK].y);
}

struct Invocation {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) flat: u32,
}

@compute @workgroup_size(E_GRID * E_GRID * SUBGROUP)
fn matmul_coop(at: Invocation) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let threads = E_GRID * E_GRID * SUBGROUP;
    // Output blocks along n, then m, then the batch, on a grid that spills from x into y.
    let blocks_n = (n + BLOCK - 1u) / BLOCK;
    let blocks_m = (m + BLOCK - 1u) / BLOCK;
    let block = at.wid.x + at.wid.y * at.groups.x;
    // Workgroups past the last block (the grid folds into y) compute the last batch's block again
    // and write nothing, rather than return from a workgroup whose matrix operations and
    // barriers must be uniform.
    let b = min(block / (blocks_n * blocks_m), params[11] - 1u);
    let writes = block / (blocks_n * blocks_m) < params[11];
    if (at.flat == 0u) {
        depth_k = k;
    }
    let k_uniform = workgroupUniformLoad(&depth_k);
    let row0 = block % (blocks_n * blocks_m) / blocks_n * BLOCK;
    let col0 = block % blocks_n * BLOCK;
    let warp = at.flat / SUBGROUP;
    let wm = warp / E_GRID * 2u * E_EDGE;
    let wn = warp % E_GRID * 2u * E_EDGE;

    for (var i = at.flat; i < BLOCK * BLOCK; i += threads) {
        out_tile[i] = 0.0;
    }
    for (var i = at.flat; i < BLOCK; i += threads) {
        row_scales[i] = scales[b * m + min(row0 + i, m - 1u)];
        column_scales[i] = scales[params[11] * m + b * n + min(col0 + i, n - 1u)];
    }
    workgroupBarrier();
    var c00 = coopLoadT<E_C>(&out_tile[0], BLOCK);
    var c01 = c00;
    var c10 = c00;
    var c11 = c00;

    for (var k0 = 0u; k0 < k_uniform; k0 += DEPTH) {
        // Neighbouring invocations read neighbouring k of lhs and neighbouring columns of rhs.
        for (var i = at.flat; i < BLOCK * DEPTH; i += threads) {
            lhs_tile[i] = lhs_element(b, row0 + i / DEPTH, k0 + i % DEPTH, row_scales[i / DEPTH].x);
            rhs_tile[i] = rhs_element(b, k0 + i / BLOCK, col0 + i % BLOCK, column_scales[i % BLOCK].x);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < DEPTH; kk += E_EDGE) {
            let a0 = coopLoadT<E_A>(&lhs_tile[wm * DEPTH + kk], DEPTH);
            let a1 = coopLoadT<E_A>(&lhs_tile[(wm + E_EDGE) * DEPTH + kk], DEPTH);
            let b0 = coopLoadT<E_B>(&rhs_tile[kk * BLOCK + wn], BLOCK);
            let b1 = coopLoadT<E_B>(&rhs_tile[kk * BLOCK + wn + E_EDGE], BLOCK);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }

    coopStoreT(c00, &out_tile[wm * BLOCK + wn], BLOCK);
    coopStoreT(c01, &out_tile[wm * BLOCK + wn + E_EDGE], BLOCK);
    coopStoreT(c10, &out_tile[(wm + E_EDGE) * BLOCK + wn], BLOCK);
    coopStoreT(c11, &out_tile[(wm + E_EDGE) * BLOCK + wn + E_EDGE], BLOCK);
    workgroupBarrier();
    // A word of out at a time: for bf16 two neighbouring columns (the host sends bf16 here only
    // for an even n, so a pair never straddles two rows).
    for (var i = at.flat * T_PER_WORD; i < BLOCK * BLOCK; i += threads * T_PER_WORD) {
        let row = row0 + i / BLOCK;
        let col = col0 + i % BLOCK;
        if (writes && row < m && col < n) {
            let second = unscaled(min(i + 1u, BLOCK * BLOCK - 1u));
            out[T_word((b * m + row) * n + col)] = T_pack(unscaled(i), second);
        }
    }
}
