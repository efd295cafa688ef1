// matmul: out[b] = lhs[b] @ rhs[b], lhs [batch, m, k] and rhs [batch, k, n] with any strides
// (transposes and broadcast batches cost no copy), out contiguous [batch, m, n].
//
// `matmul` is tiled: a 16x16 workgroup computes a 64x64 block of the output, each invocation a
// 4x4 register block, staging 64x16 slices of lhs and 16x64 slices of rhs through workgroup
// memory so each loaded value is used 64 times. Accumulates in f32 for every `T`.
// `matmul_naive` (one invocation per output, no reuse) is kept as the benchmark's baseline.
// params: [m, n, k, lhs offset, lhs batch/m/k strides, rhs offset, rhs batch/k/n strides]

@group(0) @binding(1) var<storage, read> lhs: array<T>;
@group(0) @binding(2) var<storage, read> rhs: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

var<workgroup> lhs_tile: array<f32, 1024>; // [TILE][TILE_K]
var<workgroup> rhs_tile: array<f32, 1024>; // [TILE_K][TILE]

fn lhs_at(b: u32, row: u32, col: u32) -> f32 {
    return f32(lhs[params[3] + b * params[4] + row * params[5] + col * params[6]]);
}

fn rhs_at(b: u32, row: u32, col: u32) -> f32 {
    return f32(rhs[params[7] + b * params[8] + row * params[9] + col * params[10]]);
}

@compute @workgroup_size(16, 16)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) flat: u32,
) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let b = wid.z;
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    var acc: array<array<f32, 4>, 4>;
    for (var k0 = 0u; k0 < k; k0 += TILE_K) {
        // 1024 values per tile, 4 per invocation; out-of-range reads load zeros.
        for (var l = 0u; l < 4u; l++) {
            let idx = flat + l * 256u;
            let ar = row0 + idx / TILE_K;
            let ac = k0 + idx % TILE_K;
            lhs_tile[idx] = select(0.0, lhs_at(b, min(ar, m - 1u), min(ac, k - 1u)), ar < m && ac < k);
            let br = k0 + idx / TILE;
            let bc = col0 + idx % TILE;
            rhs_tile[idx] = select(0.0, rhs_at(b, min(br, k - 1u), min(bc, n - 1u)), br < k && bc < n);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            var a: array<f32, 4>;
            var r: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = lhs_tile[(lid.y * 4u + i) * TILE_K + kk];
                r[i] = rhs_tile[kk * TILE + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(a[i], r[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x * 4u + j;
            if (row < m && col < n) {
                out[(b * m + row) * n + col] = T(acc[i][j]);
            }
        }
    }
}

@compute @workgroup_size(16, 16)
fn matmul_naive(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = params[0];
    let n = params[1];
    let row = gid.y;
    let col = gid.x;
    if (row >= m || col >= n) {
        return;
    }
    var acc = 0.0;
    for (var kk = 0u; kk < params[2]; kk++) {
        acc = fma(lhs_at(gid.z, row, kk), rhs_at(gid.z, kk, col), acc);
    }
    out[(gid.z * m + row) * n + col] = T(acc);
}
