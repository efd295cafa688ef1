// bias_act: a layer's bias and activation in one pass over a contiguous [outer, channels, inner]
// tensor: out[o, c, i] = act(src[o, c, i] + bias[c]), and its input's gradient. ACT is the
// activation's index in core's UnaryOp::ALL (NO_ACT for the bias alone), or its derivative's.
// params: [n, channels, inner, p0, p1] (p0, p1: ACT's parameters)

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

// bias_act_grad: the gradient of bias_act's input for an activation whose derivative is the
// unary op ACT of its input: out = grad * ACT(src + bias[channel]), rounded to T after the add
// and after ACT as the composed add, unary and multiply store their results.
@group(0) @binding(4) var<storage, read> grad: array<T>;

fn bias_act_grad_at(i: u32) -> f32 {
    let channel = (i / params[2]) % params[1];
    let pre = T_round(T_load(src[T_word(i)], i) + T_load(bias[T_word(channel)], channel));
    let slope = T_round(apply_unary(ACT, pre, param_f32(3u), param_f32(4u)));
    return T_load(grad[T_word(i)], i) * slope;
}

// A storage word of the output per invocation.
@compute @workgroup_size(256)
fn bias_act_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = flat_index(gid, groups);
    let first = w * T_PER_WORD;
    if (first >= params[0]) {
        return;
    }
    var second = 0.0;
    if (T_PER_WORD == 2u && first + 1u < params[0]) {
        second = bias_act_grad_at(first + 1u);
    }
    out[w] = T_pack(bias_act_grad_at(first), second);
}
