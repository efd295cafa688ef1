//! A small GPT on wgpu gives the CPU's logits, loss and every gradient: embeddings, LayerNorm,
//! causal attention (fused: one dispatch forward, two backward) and the tied head, end to end on
//! the adapter (lavapipe in CI); the fused attention steps as the composed one, with the same bits
//! every run; the MLP's bias and GELU gradient, fused, has the composed ops' bits.

mod support;

use lockstep_core::conformance::{bias_act_grad_mismatches, mixed_dtype_mismatches};
use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::{DType, Device, Generator, Tensor};

/// Logits, loss and every parameter's gradient of a 1-layer GPT on fixed tokens on `device`.
fn run(device: &Device) -> Vec<Vec<f32>> {
    let config = GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(11)
        .block_size(8)
        .layers(1, 2, 16);
    let net = gpt(config, device, &Generator::new(5)).unwrap();
    let tokens: Vec<u32> = (0..2 * 9).map(|i| (i * 7 % 11) as u32).collect();
    let rows = Tensor::from_vec(tokens, [2, 9], device).unwrap();
    let x = rows.narrow(1, 0, 8).unwrap().contiguous().unwrap();
    let y = rows.narrow(1, 1, 8).unwrap().contiguous().unwrap();
    let logits = net.forward(&x).unwrap();
    let loss = logits
        .reshape([16, 11])
        .unwrap()
        .cross_entropy(&y.reshape([16]).unwrap())
        .unwrap();
    loss.backward().unwrap();
    let mut all = vec![logits.to_vec::<f32>().unwrap(), loss.to_vec::<f32>().unwrap()];
    all.extend(
        net.parameters()
            .iter()
            .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()),
    );
    all
}

#[test]
fn a_gpt_on_wgpu_follows_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    let (gpu, cpu) = (run(&device), run(&Device::cpu()));
    assert_eq!(gpu.len(), cpu.len());
    for (i, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "tensor {i}: wgpu {x}, cpu {y}");
        }
    }
}

/// Dispatches recorded on `device` while `f` runs.
fn dispatches<T>(device: &Device, f: impl FnOnce() -> T) -> (T, u64) {
    let count = || {
        device
            .backend()
            .work_counters()
            .kernels
            .expect("wgpu counts dispatches")
    };
    let before = count();
    let out = f();
    (out, count() - before)
}

#[test]
fn fused_attention_steps_as_the_composed_one_with_the_same_bits_every_run() {
    let Some((device, backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let first = run(&device);
    let (fused, fused_dispatches) = dispatches(&device, || run(&device));
    assert!(first == fused, "two fused steps differ");
    backend.set_attention_fused(false);
    let (composed, composed_dispatches) = dispatches(&device, || run(&device));
    eprintln!("dispatches per step: fused attention {fused_dispatches}, composed {composed_dispatches}");
    for (i, (a, b)) in fused.iter().zip(&composed).enumerate() {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "tensor {i}: fused {x}, composed {y}"
            );
        }
    }
    assert!(fused_dispatches < composed_dispatches);
}

/// Attention's weights with dropout and their gradient on `device`, as f32.
fn attention_weights(device: &Device) -> (Vec<f32>, Vec<f32>) {
    let generator = Generator::new(3);
    let host = Tensor::rand_normal([2, 3, 19, 19], 0.0, 2.0, DType::F32, &generator, &Device::cpu()).unwrap();
    let scores = host.to_device(device).unwrap().requires_grad(true);
    let weights = scores.causal_softmax(0.25, Some((0.3, &Generator::new(8)))).unwrap();
    let upstream = Tensor::rand_normal([2, 3, 19, 19], 0.0, 1.0, DType::F32, &generator, &Device::cpu()).unwrap();
    let upstream = upstream.to_device(device).unwrap();
    weights.mul(&upstream).unwrap().sum_all().unwrap().backward().unwrap();
    (weights.to_vec().unwrap(), scores.grad().unwrap().to_vec().unwrap())
}

#[test]
fn attention_weights_are_one_dispatch_each_way_and_the_cpus_values() {
    let Some((device, _backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let scores = Tensor::from_vec(vec![0.5f32; 2 * 8 * 8], [2, 8, 8], &device).unwrap();
    let dispatched = || {
        device
            .backend()
            .work_counters()
            .kernels
            .expect("wgpu counts dispatches")
    };
    let before = dispatched();
    scores.causal_softmax(0.125, Some((0.2, &Generator::new(1)))).unwrap();
    assert_eq!(
        dispatched() - before,
        1,
        "scale, mask, softmax and dropout in one dispatch"
    );

    let (gpu, cpu) = (attention_weights(&device), attention_weights(&Device::cpu()));
    for (what, ours, theirs) in [("weights", &gpu.0, &cpu.0), ("gradient", &gpu.1, &cpu.1)] {
        let worst = ours
            .iter()
            .zip(theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{what}: wgpu differs from the CPU by {worst}");
    }
    let dropped = gpu.0.iter().filter(|&&w| w == 0.0).count();
    assert!(
        dropped > 6 * 19 * 18 / 2,
        "the future is masked and dropout drops more ({dropped} zeros)"
    );
}

#[test]
fn the_fused_bias_and_gelu_gradient_is_the_composed_ops_bit_for_bit() {
    let Some(device) = support::wgpu_device() else { return };
    let mut dtypes = vec![DType::F32, DType::BF16];
    if lockstep_wgpu::adapter(0).is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16)) {
        dtypes.push(DType::F16);
    }
    for dtype in dtypes {
        let mismatches = bias_act_grad_mismatches(&device, dtype).unwrap();
        assert_eq!(mismatches, Some(vec![]), "{dtype:?}");
    }
}

#[test]
fn the_mixed_dtype_ops_are_the_casts_and_ops_they_stand_for_bit_for_bit() {
    let Some(device) = support::wgpu_device() else { return };
    let mut halves = vec![DType::BF16];
    if lockstep_wgpu::adapter(0).is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16)) {
        halves.push(DType::F16);
    }
    for half in halves {
        assert_eq!(
            mixed_dtype_mismatches(&device, half).unwrap(),
            Vec::<String>::new(),
            "{half:?}"
        );
    }
}
