// rand: Philox4x32-10, the counter-based generator of core/src/rng.rs, so every backend draws
// the same stream: element i is word i % 4 of block (counter + i / 4) under key `seed`, turned
// into a float with 24 random bits; normals use Box-Muller on words (0,1) or (2,3).
// params: [n, seed_lo, seed_hi, counter_lo, counter_hi, normal, a, b]
//   uniform: a + b * u (a = low, b = high - low);  normal: a + b * z (a = mean, b = std)
// dropout: out = src * (u >= p ? scale : 0) with u the uniform stream's element i.
//   params: [n, seed_lo, seed_hi, counter_lo, counter_hi, p, scale]

@group(0) @binding(1) var<storage, read_write> out: array<T>;
@group(0) @binding(2) var<storage, read> src: array<T>;

// The four words of element i's block under the seed and counter of params[1..5].
fn block_words(i: u32) -> vec4<u32> {
    return stream_block(1u, i);
}

@compute @workgroup_size(256)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let keep = unit_float(block_words(i)[i % 4u]) >= param_f32(5u);
    out[i] = T(f32(src[i]) * select(0.0, param_f32(6u), keep));
}

@compute @workgroup_size(256)
fn rand(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let w = block_words(i);
    let a = param_f32(6u);
    let b = param_f32(7u);
    if (params[5] == 0u) {
        out[i] = T(fma(b, unit_float(w[i % 4u]), a));
        return;
    }
    let pair = (i % 4u) / 2u * 2u;
    let u1 = 1.0 - unit_float(w[pair]);
    let u2 = unit_float(w[pair + 1u]);
    // Vulkan allows log an absolute error of 2^-21 near 1, enough to make -2 log(u1) negative
    // and the normal NaN about once in ten million draws: clamp at 0.
    let radius = sqrt(max(-2.0 * log(u1), 0.0));
    let angle = 6.28318530717958648 * u2;
    out[i] = T(fma(b, select(radius * sin(angle), radius * cos(angle), i % 2u == 0u), a));
}
