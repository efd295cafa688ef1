// bias_act: a layer's bias and activation in one pass over a contiguous [outer, channels, inner]
// tensor: out[o, c, i] = act(src[o, c, i] + bias[c]). ACT is the activation's index in core's
// UnaryOp::ALL, or NO_ACT for the bias alone.
// params: [n, channels, inner, p0, p1]

override ACT: u32 = 0xffffffffu;
const NO_ACT: u32 = 0xffffffffu;

@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn bias_act(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let channel = (i / params[2]) % params[1];
    let pre = f32(src[i]) + f32(bias[channel]);
    if (ACT == NO_ACT) {
        out[i] = T(pre);
    } else {
        out[i] = T(apply_unary(ACT, pre, param_f32(3u), param_f32(4u)));
    }
}
