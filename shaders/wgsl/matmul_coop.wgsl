// matmul_coop: out[b] = lhs[b] @ rhs[b] on the adapter's cooperative matrices (tensor cores on
// NVIDIA, simdgroup matrices on Apple): operands rounded to f16, sums in f32. The same params
// and strides as matmul.wgsl (any layout, broadcast batches, output contiguous), unsplit k.
// Each row of lhs and column of rhs is multiplied on the way in by its power-of-two scale from
// coop_scales.wgsl (into f16's range) and each sum by both inverses on the way out.
//
// The host composes it (`compose_cooperative`) with the matrix edge `E_EDGE` (16 on NVIDIA, 8 on
// lavapipe and Apple), the `E_A`/`E_B`/`E_C` matrix aliases, `E_GRID` and `E_FRAGS`, and the lines
// that name each subgroup's E_FRAGS x E_FRAGS accumulators in place of the three marked with
// two slashes and an at sign (WGSL has no arrays of cooperative matrices); it sets `SUBGROUP` to
// the adapter's one subgroup size. A workgroup of E_GRID x E_GRID subgroups computes a BLOCK x BLOCK output
// block (BLOCK = E_FRAGS E_GRID E_EDGE); each subgroup owns E_FRAGS x E_FRAGS matrices of it, so
// more fragments load fewer matrices per product. Invocations `SUBGROUP * w ..` form subgroup w:
// drivers fill subgroups in invocation order, and the backend's self-test at device open tries
// each tile and turns this tier off where none computes right.
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

const BLOCK: u32 = E_FRAGS * E_GRID * E_EDGE;
// k staged per round: two matrix steps between barriers.
const DEPTH: u32 = 2u * E_EDGE;
const FRAGMENT: u32 = E_EDGE * E_EDGE;

var<workgroup> lhs_tile: array<f16, BLOCK * DEPTH>; // row-major [BLOCK][DEPTH]
var<workgroup> rhs_tile: array<f16, BLOCK * DEPTH>; // row-major [DEPTH][BLOCK]
// One finished fragment of each subgroup's sums, row-major, on its way out.
var<workgroup> fragments: array<f32, E_GRID * E_GRID * FRAGMENT>;
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

// Where a subgroup's finished fragment goes: the block, the batch, the fragment's first row and
// column in the block, and the invocation's lane in its subgroup.
struct Fragment {
    b: u32,
    row0: u32,
    col0: u32,
    writes: bool,
    warp: u32,
    lane: u32,
}

// Writes the fragment in `fragments` of subgroup `f.warp` at (`row`, `col`) of the block, unscaled
// (one rounding: the product of two powers of two is exact wherever the result is not out of
// f32's range anyway), a word of out at a time: for bf16 two neighbouring columns (the host sends
// bf16 here only for an even n, so a pair never straddles two rows).
fn write_fragment(f: Fragment, row: u32, col: u32) {
    let m = params[0];
    let n = params[1];
    let base = f.warp * FRAGMENT;
    for (var e = f.lane * T_PER_WORD; e < FRAGMENT; e += SUBGROUP * T_PER_WORD) {
        let r = row + e / E_EDGE;
        let c = col + e % E_EDGE;
        if (f.writes && f.row0 + r < m && f.col0 + c < n) {
            let unscale = row_scales[r].y;
            let first = fragments[base + e] * (unscale * column_scales[c].y);
            let next = min(c + 1u, BLOCK - 1u);
            let second = fragments[base + min(e + 1u, FRAGMENT - 1u)] * (unscale * column_scales[next].y);
            out[T_word((f.b * m + f.row0 + r) * n + f.col0 + c)] = T_pack(first, second);
        }
    }
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
    let wm = warp / E_GRID * E_FRAGS * E_EDGE;
    let wn = warp % E_GRID * E_FRAGS * E_EDGE;

    for (var i = at.flat; i < BLOCK; i += threads) {
        row_scales[i] = scales[b * m + min(row0 + i, m - 1u)];
        column_scales[i] = scales[params[11] * m + b * n + min(col0 + i, n - 1u)];
    }
    workgroupBarrier();
    //@accumulators

    for (var k0 = 0u; k0 < k_uniform; k0 += DEPTH) {
        // Neighbouring invocations read neighbouring k of lhs and neighbouring columns of rhs.
        for (var i = at.flat; i < BLOCK * DEPTH; i += threads) {
            lhs_tile[i] = lhs_element(b, row0 + i / DEPTH, k0 + i % DEPTH, row_scales[i / DEPTH].x);
            rhs_tile[i] = rhs_element(b, k0 + i / BLOCK, col0 + i % BLOCK, column_scales[i % BLOCK].x);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < DEPTH; kk += E_EDGE) {
            //@products
        }
        workgroupBarrier();
    }

    // Each fragment through workgroup memory in turn: every subgroup stores its own, then its
    // lanes write it out (the same sequence in every subgroup, so the barriers are uniform).
    let f = Fragment(b, row0, col0, writes, warp, at.flat % SUBGROUP);
    //@stores
}
