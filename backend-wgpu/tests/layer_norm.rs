//! LayerNorm on wgpu (lavapipe in CI): the affine part fused, one dispatch forward and two
//! backward (the input's gradient with each chunk of rows' column sums, then the chunks summed),
//! and the weight's and bias's gradients, summed over many rows, the same bits every run.

mod support;

use lockstep_core::backend::{LayerNormAffine, LayerNormSpec};
use lockstep_core::conformance::layer_norm_gradient_bits;
use lockstep_core::{DType, Device, Tensor};

/// A `[rows, cols]` f32 tensor of fixed values, stride `k` through a short cycle.
fn values(device: &Device, dims: &[usize], k: usize) -> Tensor {
    let n = dims.iter().product::<usize>();
    let v: Vec<f32> = (0..n).map(|i| ((i * k) % 97) as f32 / 24.0 - 2.0).collect();
    Tensor::from_vec(v, dims.to_vec(), device).unwrap()
}

#[test]
fn the_weight_and_bias_gradients_have_the_same_bits_every_run() {
    let Some(device) = support::wgpu_device() else { return };
    // 75 chunks of 8 rows; 300 columns, not a multiple of a row's 16 invocations.
    let first = layer_norm_gradient_bits(&device, 600, 300).unwrap();
    let second = layer_norm_gradient_bits(&device, 600, 300).unwrap();
    assert!(first == second, "two runs gave other bits");
    let cpu = layer_norm_gradient_bits(&Device::cpu(), 600, 300).unwrap();
    for (gpu, cpu) in first.iter().zip(&cpu) {
        for (x, y) in gpu
            .iter()
            .zip(cpu)
            .map(|(a, b)| (f32::from_bits(*a), f32::from_bits(*b)))
        {
            assert!((x - y).abs() <= 1e-3 * (1.0 + y.abs()), "wgpu {x}, cpu {y}");
        }
    }
}

#[test]
fn one_dispatch_forward_and_two_backward() {
    let Some((device, _backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let (x, g) = (values(&device, &[40, 24], 7), values(&device, &[40, 24], 3));
    let (w, b) = (values(&device, &[24], 5), values(&device, &[24], 2));
    let affine = LayerNormAffine {
        weight: Some(w.buffer()),
        bias: Some(b.buffer()),
    };
    let spec = LayerNormSpec {
        rows: 40,
        cols: 24,
        eps: 1e-5,
    };
    let backend = device.backend();
    let dispatched = || backend.work_counters().kernels.expect("wgpu counts dispatches");
    let before = dispatched();
    backend.layer_norm_last(x.buffer(), affine, &spec).unwrap();
    assert_eq!(dispatched() - before, 1, "forward");
    let before = dispatched();
    let grads = backend
        .layer_norm_last_backward(g.buffer(), x.buffer(), affine, &spec)
        .unwrap();
    assert_eq!(dispatched() - before, 2, "backward");
    assert!(grads.weight.is_some() && grads.bias.is_some());
    let before = dispatched();
    let plain = LayerNormAffine::default();
    let grads = backend
        .layer_norm_last_backward(g.buffer(), x.buffer(), plain, &spec)
        .unwrap();
    assert_eq!(dispatched() - before, 1, "backward without an affine part");
    assert!(grads.weight.is_none() && grads.bias.is_none());
}

/// The backend's outputs for `x`, `g`, `w`, `b` (forward, dx, dw, db), as f32 values.
fn backend_outputs(x: &Tensor, g: &Tensor, w: &Tensor, b: &Tensor, spec: &LayerNormSpec) -> Vec<Vec<f32>> {
    let device = x.device();
    let affine = LayerNormAffine {
        weight: Some(w.buffer()),
        bias: Some(b.buffer()),
    };
    let backend = device.backend();
    let y = backend.layer_norm_last(x.buffer(), affine, spec).unwrap();
    let grads = backend
        .layer_norm_last_backward(g.buffer(), x.buffer(), affine, spec)
        .unwrap();
    let as_f32 = |buffer, dims: Vec<usize>| {
        let t = Tensor::from_buffer(buffer, dims, device);
        t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    };
    let (rows, cols) = (spec.rows, spec.cols);
    vec![
        as_f32(y, vec![rows, cols]),
        as_f32(grads.input, vec![rows, cols]),
        as_f32(grads.weight.unwrap(), vec![cols]),
        as_f32(grads.bias.unwrap(), vec![cols]),
    ]
}

#[test]
fn bf16_runs_as_f32_on_the_same_values_rounded_once() {
    let Some(device) = support::wgpu_device() else { return };
    let spec = LayerNormSpec {
        rows: 20,
        cols: 33,
        eps: 1e-5,
    };
    let bf16 = |dims: &[usize], k| values(&device, dims, k).to_dtype(DType::BF16).unwrap();
    let narrow = [bf16(&[20, 33], 7), bf16(&[20, 33], 3), bf16(&[33], 5), bf16(&[33], 2)];
    let wide = narrow.clone().map(|t| t.to_dtype(DType::F32).unwrap());
    let [x, g, w, b] = &narrow;
    let from_bf16 = backend_outputs(x, g, w, b, &spec);
    let [x, g, w, b] = &wide;
    let from_f32 = backend_outputs(x, g, w, b, &spec);
    for (i, (narrow, wide)) in from_bf16.iter().zip(&from_f32).enumerate() {
        let rounded = wide.iter().map(|v| half::bf16::from_f32(*v).to_f32());
        for (a, b) in narrow.iter().zip(rounded) {
            assert_eq!(a.to_bits(), b.to_bits(), "output {i}: bf16 {a}, f32 rounded {b}");
        }
    }
}
