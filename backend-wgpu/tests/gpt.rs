//! A small GPT on wgpu gives the CPU's logits, loss and every gradient: embeddings, LayerNorm,
//! causal attention (masked fill, softmax and its fused backward) and the tied head, end to
//! end on the adapter (lavapipe in CI).

mod support;

use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::{Device, Generator, Tensor};

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
