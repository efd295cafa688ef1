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

/// The loss and every parameter's gradient of one step of a small GPT (no dropout, 80 tokens:
/// a full and a partial block of 64) on a fresh device.
fn gpt_step(ordinal: usize, fused: bool) -> Vec<Vec<f32>> {
    let device = private_cpu(ordinal, fused);
    let config = GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(17)
        .block_size(80)
        .layers(2, 2, 32)
        .dropout(0.0);
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

#[test]
fn a_gpt_step_through_fused_attention_matches_the_composed_one_and_repeats_bit_for_bit() {
    let fused = gpt_step(60, true);
    let composed = gpt_step(61, false);
    let mut worst = 0f32;
    for (f, c) in fused.iter().flatten().zip(composed.iter().flatten()) {
        worst = worst.max((f - c).abs() / c.abs().max(1.0));
    }
    assert!(worst <= 1e-5, "fused and composed differ by {worst:e}");
    assert_ne!(fused, composed, "the composed run took the fused path too");
    assert_eq!(fused, gpt_step(62, true), "a second fused run differs");
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    assert_eq!(fused, one_thread.install(|| gpt_step(63, true)), "one thread differs");
}
