// In-place optimizer updates on contiguous f32 parameters and state, PyTorch semantics; the
// host folds the step's constants (bias corrections, decay factors) in f64 as the CPU does.
//   axpy:      dst += alpha * src                          params: [n, alpha]
//   sgd_step, sgd_momentum_step: params: [n, lr, weight_decay, keep, take, momentum, nesterov]
//   adam_step: params: [n, decay, l2, beta1, 1-beta1, beta2, 1-beta2, step_size, bias2_sqrt, eps]

@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> state_a: array<f32>;
@group(0) @binding(4) var<storage, read_write> state_b: array<f32>;

@compute @workgroup_size(256)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    param[i] = param[i] + param_f32(1u) * grad[i];
}

@compute @workgroup_size(256)
fn sgd_step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let lr = param_f32(1u);
    let d = grad[i] + param_f32(2u) * param[i];
    param[i] = param[i] - lr * d;
}

// SGD with a momentum buffer (state_a).
@compute @workgroup_size(256)
fn sgd_momentum_step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let d = grad[i] + param_f32(2u) * param[i];
    let b = param_f32(3u) * state_a[i] + param_f32(4u) * d;
    state_a[i] = b;
    let update = select(b, d + param_f32(5u) * b, params[6] != 0u);
    param[i] = param[i] - param_f32(1u) * update;
}

// Adam/AdamW with exp_avg in state_a and exp_avg_sq in state_b.
@compute @workgroup_size(256)
fn adam_step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = flat_index(gid, groups);
    if (i >= params[0]) {
        return;
    }
    let p = param[i] * param_f32(1u);
    let g = grad[i] + param_f32(2u) * p;
    let m = param_f32(3u) * state_a[i] + param_f32(4u) * g;
    let v = param_f32(5u) * state_b[i] + param_f32(6u) * g * g;
    state_a[i] = m;
    state_b[i] = v;
    param[i] = p - param_f32(7u) * m / (sqrt(v) / param_f32(8u) + param_f32(9u));
}
