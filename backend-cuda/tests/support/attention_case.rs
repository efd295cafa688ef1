//! The fused causal attention (attention.cu) on cuda:0 at GPT-2's sizes, which the small
//! conformance cases do not reach (1024 tokens, 64 channels a head, and 128), beside the CPU's
//! composed attention in f32 from the same values, and its backward pass bit-exact from run to
//! run. Forced fused, so a failed start-up check cannot hide a wrong kernel behind the composed
//! path. Each test file that includes this runs it under one build of the kernels (the backend
//! reads its choice once a process).

use lockstep_core::{DType, Device, Generator, Tensor};

use crate::support;

fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::cpu())
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.to_vec::<f32>())
        .unwrap()
}

/// Every value of `got` within `tol` times the largest |want| (at least 1) of `want`.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: {g} against the CPU's {w} (tolerance {tol} x {scale})"
        );
    }
}

/// y and the gradient of sum(y · dy) with respect to qkv, on qkv's device.
fn attention(qkv: &Tensor, dy: &Tensor) -> (Vec<f32>, Vec<f32>) {
    let leaf = qkv.requires_grad(true);
    let y = leaf.causal_self_attention(None).unwrap();
    y.backward_with(dy.clone()).unwrap();
    (values(&y), values(&leaf.grad().unwrap()))
}

/// The fused kernels forced, with `LOCKSTEP_CUDA_ATTENTION_STAGES` set to `stages`, against the
/// CPU, twice.
pub fn fused_attention_matches_the_cpu_and_repeats_bit_exactly(stages: &str) {
    // SAFETY: the one test of each binary that includes this sets the variables before anything
    // reads them (the backend reads them once, at its first attention), and no other thread
    // touches the environment.
    unsafe {
        std::env::set_var("LOCKSTEP_CUDA_ATTENTION", "fused");
        std::env::set_var("LOCKSTEP_CUDA_ATTENTION_STAGES", stages);
    }
    let Some(device) = support::cuda_device() else { return };
    for (dtype, [batch, t, heads, d], tol) in [
        (DType::BF16, [2, 1024, 3, 64], 0.03),
        (DType::BF16, [1, 1000, 2, 128], 0.03),
        (DType::F16, [2, 333, 2, 32], 0.01),
    ] {
        let random = |dims: Vec<usize>, seed| {
            let cpu = Device::cpu();
            let x = Tensor::rand_normal(dims, 0.0, 1.0, DType::F32, &Generator::new(seed), &cpu).unwrap();
            x.to_dtype(dtype).unwrap()
        };
        let (qkv, dy) = (
            random(vec![batch, t, 3, heads, d], 1),
            random(vec![batch, t, heads, d], 2),
        );
        let f32_on_cpu = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
        let (want_y, want_grad) = attention(&f32_on_cpu(&qkv), &f32_on_cpu(&dy));
        let on_gpu = |x: &Tensor| x.to_device(&device).unwrap();
        let (y, grad) = attention(&on_gpu(&qkv), &on_gpu(&dy));
        let what = format!("{dtype} [{batch}, {t}, 3, {heads}, {d}], {stages} stage(s)");
        assert_close(&format!("y of {what}"), &y, &want_y, tol);
        assert_close(&format!("dqkv of {what}"), &grad, &want_grad, tol);
        let (again_y, again_grad) = attention(&on_gpu(&qkv), &on_gpu(&dy));
        assert!(again_y == y && again_grad == grad, "{what}: a second run differs");
    }
}
