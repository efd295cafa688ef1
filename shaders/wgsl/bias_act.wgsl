// bias_act: a layer's bias and activation in one pass over a contiguous [outer, channels, inner]
// tensor: out[o, c, i] = act(src[o, c, i] + bias[c]). ACT is the activation's index in core's
// UnaryOp::ALL, or NO_ACT for the bias alone.
// params: [n, channels, inner, p0, p1]

override ACT: u32 = 0xffffffffu;
const NO_ACT: u32 = 0xffffffffu;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

fn bias_act_at(i: u32) -> f32 {
    let channel = (i / params[2]) % params[1];
    let pre = T_load(src[T_word(i)], i) + T_load(bias[T_word(channel)], channel);
    if (ACT == NO_ACT) {
        return pre;
    }
    return apply_unary(ACT, pre, param_f32(3u), param_f32(4u));
}

// A storage word of the output per invocation (bf16 two elements a word).
@compute @workgroup_size(256)
fn bias_act(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = bias_act_at(first + 1u);
    }
    out[w] = T_pack(bias_act_at(first), second);
}
