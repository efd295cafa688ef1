// cast: a contiguous copy converting `S` to `D` (f32, f16 and u32 in any pair; floats to u32
// truncate toward zero and saturate, as WGSL's conversions do). i64 is stored as two u32 words
// (low, high); `cast_from_i64` and `cast_to_i64` convert between it and `D` / `S`.
// params: [n, rank, dims[rank], src view [offset, strides[rank]], src_is_unsigned]

@group(0) @binding(1) var<storage, read> src: array<S>;
@group(0) @binding(2) var<storage, read_write> dst: array<D>;
@group(0) @binding(3) var<storage, read> src_i64: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> dst_i64: array<vec2<u32>>;

@compute @workgroup_size(256)
fn cast_strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    dst[i] = D(src[strided_index(i, params[1], 2u, 2u + params[1])]);
}

@compute @workgroup_size(256)
fn cast_from_i64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let w = src_i64[strided_index(i, params[1], 2u, 2u + params[1])];
    let high = bitcast<i32>(w.y);
    // Values that fit in 32 bits (labels, indices) convert exactly; larger ones go through f32.
    if (high == 0) {
        dst[i] = D(w.x);
    } else if (high == -1 && bitcast<i32>(w.x) < 0) {
        dst[i] = D(f32(bitcast<i32>(w.x)));
    } else {
        dst[i] = D(f32(high) * 4294967296.0 + f32(w.x));
    }
}

@compute @workgroup_size(256)
fn cast_to_i64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let rank = params[1];
    let x = src[strided_index(i, rank, 2u, 2u + rank)];
    if (params[3u + 2u * rank] != 0u) {
        dst_i64[i] = vec2<u32>(u32(x), 0u);
    } else {
        let v = trunc(f32(x));
        dst_i64[i] = vec2<u32>(bitcast<u32>(i32(v)), select(0u, 0xffffffffu, v < 0.0));
    }
}
