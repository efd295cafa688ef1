//! A ResNet layer's pieces on cuda:0 beside the CPU, at sizes the small conformance cases do not
//! reach: convolutions through cuDNN (when it loads) and batch norm under bf16 autocast (a bf16
//! input with f32 parameters, the fused kernels reducing each channel in several chunks).

mod support;

use lockstep_core::autocast::autocast;
use lockstep_core::{Conv2dOptions, DType, Device, Generator, Tensor};

/// Every value of `got` within `tol` (absolute, and relative to the larger magnitude) of `want`.
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    let values = |t: &Tensor| {
        t.to_device(&Device::cpu())
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec::<f32>())
            .unwrap()
    };
    let (got, want) = (values(got), values(want));
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: {g} against the CPU's {w} (tolerance {tol} x {scale})"
        );
    }
}

fn random(dims: &[usize], seed: u64) -> Tensor {
    Tensor::rand_normal(
        dims.to_vec(),
        0.0,
        1.0,
        DType::F32,
        &Generator::new(seed),
        &Device::cpu(),
    )
    .unwrap()
}

/// `f` of the leaves on `device` (moved there, requiring grad), and the leaves' gradients of
/// the sum of the output times fixed weights.
fn forward_backward(
    device: &Device,
    leaves: &[&Tensor],
    f: impl Fn(&[Tensor]) -> lockstep_core::Result<Tensor>,
) -> (Tensor, Vec<Tensor>) {
    let leaves: Vec<Tensor> = leaves
        .iter()
        .map(|t| t.to_device(device).unwrap().requires_grad(true))
        .collect();
    let y = f(&leaves).unwrap();
    let probe = random(y.dims(), 99).to_device(device).unwrap();
    y.to_dtype(DType::F32)
        .unwrap()
        .mul(&probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    (y, leaves.iter().map(|t| t.grad().unwrap()).collect())
}

#[test]
fn convolutions_match_the_cpu_in_f32_and_bf16() {
    let Some(cuda) = support::cuda_device() else { return };
    for (stride, padding, dtype, tol) in [
        (1, 1, DType::F32, 1e-4),
        (2, 1, DType::F32, 1e-4),
        (1, 1, DType::BF16, 2e-2),
        (2, 0, DType::BF16, 2e-2),
    ] {
        let x = random(&[8, 16, 32, 32], 1).to_dtype(dtype).unwrap();
        let w = random(&[32, 16, 3, 3], 2)
            .mul_scalar(0.1)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let opts = Conv2dOptions {
            stride: [stride, stride],
            padding: [padding, padding],
            ..Default::default()
        };
        let conv = |t: &[Tensor]| t[0].conv2d(&t[1], None, opts);
        let (y, grads) = forward_backward(&cuda, &[&x, &w], conv);
        let (y_cpu, grads_cpu) = forward_backward(&Device::cpu(), &[&x, &w], conv);
        let case = format!("conv stride {stride} padding {padding} {dtype:?}");
        assert_close(&format!("{case}: output"), &y, &y_cpu, tol);
        assert_close(&format!("{case}: input gradient"), &grads[0], &grads_cpu[0], tol);
        assert_close(&format!("{case}: weight gradient"), &grads[1], &grads_cpu[1], tol);
    }
}

#[test]
fn batch_norm_under_bf16_autocast_matches_the_cpu() {
    let Some(cuda) = support::cuda_device() else { return };
    // 8 x 40 x 40 values a channel: the fused kernels split each channel into chunks.
    let x = random(&[8, 4, 40, 40], 3)
        .mul_scalar(3.0)
        .unwrap()
        .add_scalar(1.0)
        .unwrap();
    let x = x.to_dtype(DType::BF16).unwrap();
    let weight = random(&[4], 4).add_scalar(1.0).unwrap();
    let bias = random(&[4], 5);
    let run = |device: &Device| {
        let (mean, var) = (
            Tensor::zeros([4], DType::F32, device).unwrap(),
            Tensor::ones([4], DType::F32, device).unwrap(),
        );
        let norm = |t: &[Tensor]| {
            autocast(DType::BF16, || {
                t[0].batch_norm(&mean, &var, Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5)
            })
        };
        let (y, grads) = forward_backward(device, &[&x, &weight, &bias], norm);
        (y, grads, mean, var)
    };
    let (y, grads, mean, var) = run(&cuda);
    let (y_cpu, grads_cpu, mean_cpu, var_cpu) = run(&Device::cpu());
    assert_eq!(y.dtype(), DType::BF16, "autocast's batch norm keeps its input's dtype");
    assert_close("output", &y, &y_cpu, 2e-2);
    assert_close("input gradient", &grads[0], &grads_cpu[0], 2e-2);
    assert_close("weight gradient", &grads[1], &grads_cpu[1], 1e-3);
    assert_close("bias gradient", &grads[2], &grads_cpu[2], 1e-3);
    assert_close("running mean", &mean, &mean_cpu, 1e-5);
    assert_close("running variance", &var, &var_cpu, 1e-5);
}
