//! The CPU's fused causal attention (`CpuBackend::set_attention_fused`): it serves f32 and
//! declines when switched off; its peak memory grows about linearly with t where the composed
//! path's t × t scores grow it quadratically; a GPT trains through it as through the composed
//! path (within 1e-5), bit for bit again on a second run and on one thread.

use std::sync::Arc;

use lockstep_core::backend::CausalAttention;
use lockstep_core::backend::cpu::CpuBackend;
use lockstep_core::conformance::check_attention_memory_is_linear;
use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::{DType, Device, Generator, Tensor};

/// A CPU device of its own (memory counters, attention switch) with the fused path on or off.
fn private_cpu(ordinal: usize, fused: bool) -> Device {
    let backend = Arc::new(CpuBackend::new(ordinal));
    backend.set_attention_fused(fused);
    Device::from_backend(backend)
}

#[test]
fn the_fused_op_serves_f32_and_declines_when_switched_off() {
    let spec = CausalAttention {
        batch: 1,
        heads: 2,
        t: 5,
        head_dim: 4,
        scale: 0.5,
        dropout: None,
    };
    for (ordinal, fused) in [(40, true), (41, false)] {
        let device = private_cpu(ordinal, fused);
        let qkv = Tensor::ones([1, 5, 3, 2, 4], DType::F32, &device).unwrap();
        let served = device.backend().causal_attention(qkv.buffer(), &spec);
        assert_eq!(served.is_some(), fused, "fused = {fused}");
        if let Some(out) = served {
            let (_, lse) = out.unwrap();
            assert_eq!(lse.len(), spec.rows());
        }
    }
}

#[test]
fn fused_attention_memory_grows_linearly_with_t() {
    let mut ordinal = 50;
    let summary = check_attention_memory_is_linear(&mut |fused, _| {
        ordinal += 1;
        Ok(private_cpu(ordinal, fused))
    })
    .unwrap();
    eprintln!("{summary}");
}

/// The loss and every parameter's gradient of one step of a small GPT (80 tokens: a full and a
/// partial block of 64; every dropout at `dropout`) on a fresh device.
fn gpt_step(ordinal: usize, fused: bool, dropout: f64) -> Vec<Vec<f32>> {
    let device = private_cpu(ordinal, fused);
    let config = GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(17)
        .block_size(80)
        .layers(2, 2, 32)
        .dropout(dropout);
    let net = gpt(config, &device, &Generator::new(4)).unwrap();
    let g = Generator::new(7);
    let ids: Vec<u32> = (0..2 * 81).map(|_| g.next_below(17) as u32).collect();
    let rows: Vec<&[u32]> = ids.chunks(81).collect();
    let input: Vec<u32> = rows.iter().flat_map(|r| r[..80].to_vec()).collect();
    let target: Vec<u32> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
    let ids = Tensor::from_vec(input, [2, 80], &device).unwrap();
    let targets = Tensor::from_vec(target, [2 * 80], &device).unwrap();
    let logits = net.forward(&ids).unwrap();
    let loss = logits.reshape([2 * 80, 17]).unwrap().cross_entropy(&targets).unwrap();
    loss.backward().unwrap();
    let mut out = vec![loss.to_vec::<f32>().unwrap()];
    out.extend(
        net.parameters()
            .iter()
            .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()),
    );
    out
}

/// The largest difference between two steps' numbers, relative where they exceed 1.
fn worst_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let mut worst = 0f32;
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        worst = worst.max((x - y).abs() / y.abs().max(1.0));
    }
    worst
}

/// A GPT step at `dropout` on devices `first..first + 4`: fused, it matches the composed step
/// within 1e-5 (and is not it), and repeats bit for bit on a second run and on one thread.
/// Returns the fused step.
fn fused_matches_composed_and_repeats(first: usize, dropout: f64) -> Vec<Vec<f32>> {
    let fused = gpt_step(first, true, dropout);
    let composed = gpt_step(first + 1, false, dropout);
    let worst = worst_difference(&fused, &composed);
    assert!(
        worst <= 1e-5,
        "dropout {dropout}: fused and composed differ by {worst:e}"
    );
    assert_ne!(fused, composed, "the composed run took the fused path too");
    assert_eq!(fused, gpt_step(first + 2, true, dropout), "a second fused run differs");
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let on_one = one_thread.install(|| gpt_step(first + 3, true, dropout));
    assert_eq!(fused, on_one, "one thread differs");
    fused
}

#[test]
fn a_gpt_step_through_fused_attention_matches_the_composed_one_and_repeats_bit_for_bit() {
    fused_matches_composed_and_repeats(60, 0.0);
}

/// With dropout on the attention weights the fused kernels drop the elements the composed path
/// drops (the same part of the stream, by the weights' index): the step matches it, and differs
/// from the step without dropout by far more than rounding.
#[test]
fn fused_attention_with_dropout_drops_what_the_composed_path_drops() {
    let fused = fused_matches_composed_and_repeats(64, 0.3);
    assert!(
        worst_difference(&fused, &gpt_step(68, true, 0.0)) > 1e-3,
        "dropout changed nothing"
    );
}
